"""Suite-wide hooks: one closing line that counts outcomes per test folder (unit, dist, e2e), so a CI log shows
at a glance which folder failed, which ran at all, and how many tests `-x` left unrun. Also the fixtures every
folder shares: the one-rank process group and the one-rank torchrun environment."""

from __future__ import annotations

from collections import Counter

import pytest
from _helpers import ONE_RANK_TORCHRUN_ENV, one_rank_group

_collected: Counter = Counter()


@pytest.fixture
def group(tmp_path):
    """The default process group as one gloo rank (FileStore: no port), torn down after the test."""
    with one_rank_group(tmp_path):
        yield None


@pytest.fixture(autouse=True, scope="module")
def _no_process_group_outlives_its_module():
    """A test that calls zerolaunch.initialize (or a bench row) without a group makes the default one and leaves
    it; the next module's `group` fixture would then fail to make its own. Torn down last in the module, after
    any module fixture that holds a group on purpose."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def torchrun_env(monkeypatch):
    """torchrun's variables for a one-rank job (RANK, WORLD_SIZE, MASTER_*), restored after the test: for code
    that reads them (the bench scripts' group setup) without a launcher."""
    for key, value in ONE_RANK_TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)


# a test has up to three reports (setup, call, teardown); its outcome is the worst of them. "error" is a
# setup/teardown failure and counts as failed; xfailed counts as skipped, xpassed as passed.
_RANK = {"passed": 0, "xpassed": 0, "skipped": 1, "xfailed": 1, "failed": 2, "error": 2}
_NAME = {0: "passed", 1: "skipped", 2: "failed"}


def _folder(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    # node ids are relative to the rootdir: "tests/<folder>/test_x.py::name"
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def pytest_collection_finish(session):
    _collected.clear()
    _collected.update(_folder(item.nodeid) for item in session.items)


# a wrapper run first, so its code after `yield` runs last: the line comes after pytest's own summary line.
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    terminalreporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminalreporter is None or session.config.option.collectonly or not _collected:
        return
    worst: dict[str, int] = {}
    for key, rank in _RANK.items():
        for report in terminalreporter.stats.get(key, []):
            nodeid = getattr(report, "nodeid", "")
            if nodeid and "::" in nodeid:
                worst[nodeid] = max(worst.get(nodeid, 0), rank)
    counts: dict[str, Counter] = {}
    for nodeid, rank in worst.items():
        counts.setdefault(_folder(nodeid), Counter())[_NAME[rank]] += 1
    folders = set(counts) | set(_collected)
    order = [f for f in ("unit", "dist", "e2e") if f in folders] + sorted(folders - {"unit", "dist", "e2e"})
    parts = []
    for folder in order:
        c = counts.get(folder, Counter())
        text = f"{folder} {c['passed']} passed {c['failed']} failed {c['skipped']} skipped"
        unrun = _collected.get(folder, 0) - sum(c.values())
        if unrun > 0:
            text += f" {unrun} not run"
        parts.append(text)
    terminalreporter.write_line("per folder: " + "; ".join(parts))


@pytest.fixture
def stage3_hooks(monkeypatch):
    """Keep stage 3's forward hooks at world size 1, where every unit aliases its source and the engine would
    otherwise run the forward without them ([Note: hook-free forward]): the hooks are what this checks."""
    from zerolaunch.zero.stage3.unit_sharding import UnitSharding

    monkeypatch.setattr(UnitSharding, "_forward_without_hooks", lambda self: False)
