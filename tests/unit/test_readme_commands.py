"""The README's command blocks run top to bottom as written: within one block, no two `zerolaunch train`
commands that start a fresh run share a run dir (the second would be refused: `run dir ... already holds a
run`). The run dir is `--run-dir`, else the recipe's train.run_dir, else runs/<recipe name>, as docs/running.md
says. Leaves out: running them (the CPU ones were run by hand; the GPU ones need GPUs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _bash_blocks(text: str) -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [[line.split("  #")[0].strip() for line in b.splitlines() if line.strip()] for b in blocks]


def _run_dir(words: list[str]) -> str:
    if "--run-dir" in words:
        return words[words.index("--run-dir") + 1]
    recipe = REPO / words[2]
    if recipe.is_file():
        run_dir = ((yaml.safe_load(recipe.read_text()) or {}).get("train") or {}).get("run_dir")
        if run_dir:
            return run_dir
    return f"runs/{Path(words[2]).stem}"


def test_no_two_fresh_runs_of_a_block_share_a_run_dir():
    blocks = _bash_blocks((REPO / "README.md").read_text())
    assert any(any(c.startswith("zerolaunch train ") for c in b) for b in blocks)  # the parse found them
    for block in blocks:
        seen: dict[str, str] = {}
        for command in block:
            words = shlex.split(command)
            if words[:2] != ["zerolaunch", "train"] or {"--resume", "--restart", "--nnodes"} & set(words):
                continue  # a resume continues a run; the nodes of one multi-node run share its run dir
            run_dir = _run_dir(words)
            assert run_dir not in seen, f"`{command}` reuses {run_dir} of `{seen[run_dir]}`"
            seen[run_dir] = command
