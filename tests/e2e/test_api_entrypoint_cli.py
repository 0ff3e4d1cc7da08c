"""`zerolaunch train` with `entrypoint:` scripts (2 CPU gloo ranks, the real CLI).

Covers: a plain torchrun script that calls torch.distributed.init_process_group itself runs unchanged (the
worker starts no group for it) and gets its own argv from `entrypoint: "script.py --tag ..."`; a script that
leaves the group to zerolaunch.initialize() trains; a command line naming a missing script is refused before
any worker starts (exit 2, the path named). Leaves out: CUDA/nccl, restarts.
"""

import json

import pytest

pytestmark = pytest.mark.e2e

PLAIN = """\
import argparse, json, os
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--tag")
p.add_argument("--n", type=int)
args = p.parse_args()
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
out = {"tag": args.tag, "n": args.n, "world": dist.get_world_size(), "sum": t.item()}
json.dump(out, open(f"out_{dist.get_rank()}.json", "w"))
dist.destroy_process_group()
"""

WITH_API = """\
import json, sys
import torch
import torch.distributed as dist
import zerolaunch

assert not dist.is_initialized()
torch.manual_seed(0)
model = torch.nn.Linear(7, 3)
engine = zerolaunch.initialize(model)
x = torch.randn(4, 7, generator=torch.Generator().manual_seed(dist.get_rank()))
losses = []
for _ in range(5):
    loss = (engine(x) ** 2).mean()
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
json.dump({"argv": sys.argv[1:], "losses": losses, "world": dist.get_world_size()},
          open(f"api_{dist.get_rank()}.json", "w"))
"""


def _recipe(tmp_path, entrypoint):
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({"entrypoint": entrypoint, "train": {"run_dir": str(tmp_path / "run")}}))
    return path


def test_plain_torchrun_script_with_its_own_argv(tmp_path, cli):
    (tmp_path / "plain.py").write_text(PLAIN)
    proc = cli.run(_recipe(tmp_path, "plain.py --tag 'a b' --n 3"), "--cpu", "2", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"out_{rank}.json").read_text())
        assert seen == {"tag": "a b", "n": 3, "world": 2, "sum": 3.0}


def test_script_leaving_the_group_to_initialize(tmp_path, cli):
    (tmp_path / "with_api.py").write_text(WITH_API)
    proc = cli.run(_recipe(tmp_path, ["with_api.py", "--x", "1"]), "--cpu", "2", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"api_{r}.json").read_text()) for r in (0, 1)]
    assert all(s["argv"] == ["--x", "1"] and s["world"] == 2 for s in seen)
    assert seen[0]["losses"][-1] < seen[0]["losses"][0]


def test_missing_script_in_a_command_line_is_refused(tmp_path, cli):
    proc = cli.run(_recipe(tmp_path, "nope.py --foo 1"), "--cpu", "2", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    text = proc.stdout + proc.stderr
    assert "nope.py" in text and "does not exist" in text and "Traceback" not in text
