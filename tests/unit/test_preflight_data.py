"""launch/preflight.check_data_yields: the launcher draws rank 0's first batch before any worker starts.

Covers the outcomes the e2e tests cannot time reliably (a builder slower than the probe's limit) and the
arguments the builder is called with. Leaves out the CLI's rendering (tests/e2e/test_preflight.py).
"""

from types import SimpleNamespace

import pytest

from zerolaunch.config.errors import UserError
from zerolaunch.launch.preflight import check_data_yields


def _recipe(tmp_path, body: str, args=None):
    (tmp_path / "data.py").write_text(body)
    return SimpleNamespace(
        data=SimpleNamespace(builder="data.py:build", args=args or {}),
        train=SimpleNamespace(micro_batch_size=3, seed=11),
        base_dir=str(tmp_path),
    )


def test_builder_gets_the_worker_arguments_and_one_batch_is_drawn(tmp_path):
    body = (
        "CALLS = []\n"
        "def build(**kw):\n"
        "    CALLS.append(kw)\n"
        "    def gen():\n"
        "        CALLS.append('drawn')\n"
        "        yield 1\n"
        "        CALLS.append('second')\n"
        "        yield 2\n"
        "    return gen()\n"
    )
    recipe = _recipe(tmp_path, body, {"path": "x"})
    assert check_data_yields(recipe, 4, "r.yaml") is None
    import sys

    module = next(
        m for n, m in sys.modules.items() if n.startswith("zerolaunch_user_") and hasattr(m, "CALLS")
    )
    assert module.CALLS == [
        {"rank": 0, "world_size": 4, "micro_batch_size": 3, "seed": 11, "path": "x"},
        "drawn",
    ]


def test_unknown_data_arg_is_named(tmp_path):
    recipe = _recipe(
        tmp_path, "def build(rank, world_size, micro_batch_size, seed):\n    return [1]\n", {"pth": 1}
    )
    with pytest.raises(UserError) as info:
        check_data_yields(recipe, 1, "r.yaml")
    msg = str(info.value)
    assert "TypeError" in msg and "pth" in msg and "data.builder" in msg and "raised at" not in msg


def test_a_slow_builder_is_left_to_the_workers_with_a_note(tmp_path):
    recipe = _recipe(tmp_path, "import time\ndef build(**kw):\n    time.sleep(30)\n    return [1]\n")
    note = check_data_yields(recipe, 1, "r.yaml", timeout_s=0.5)
    assert note is not None and "no batch within" in note and "data.py:build" in note
