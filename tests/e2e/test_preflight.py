"""Bad input that every worker would meet is refused by the launcher before any worker starts: one
paragraph naming the recipe / flag and the fix, exit 2, no traceback, no worker log written.

Covers launch/preflight.py (--resume, model builder result on meta, HF model.args.path) and the HF path
resolution in config/load.py. Leaves out: errors only a worker can meet (not built yet).
"""

import pytest

pytestmark = pytest.mark.e2e

FILE_RECIPE = """\
model:
  builder: builders.py:{fn}
data:
  builder: zerolaunch.data.synthetic:build
  args: {{vocab_size: 64, seq_len: 32}}
train: {{steps: 2, micro_batch_size: 4}}
"""

BUILDERS = """\
from zerolaunch.models.gpt import build as gpt

def as_dict():
    return {"model": gpt(size="tiny", vocab_size=64, seq_len=32)}

def frozen():
    model = gpt(size="tiny", vocab_size=64, seq_len=32)
    for p in model.parameters():
        p.requires_grad_(False)
    return model
"""


def _refused(proc, *needles):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for needle in needles:
        assert needle in out, out[-3000:]
    assert "launching" not in out  # no worker was started


def test_resume_to_a_missing_path(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli.run(tiny_recipe(steps=2), "--cpu", "2", "--run-dir", run_dir, "--resume", tmp_path / "nope")
    _refused(proc, "--resume", "no such file or folder")
    assert not (run_dir / "logs").exists()


def test_resume_to_a_folder_that_is_not_a_checkpoint(cli, tiny_recipe, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("keep me")
    proc = cli.run(tiny_recipe(steps=2), "--cpu", "2", "--run-dir", tmp_path / "run", "--resume", empty)
    _refused(proc, "holds no zerolaunch checkpoint")
    assert (empty / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(("fn", "needle"), [("as_dict", "returned a dict"), ("frozen", "no trainable")])
def test_model_builder_checked_on_meta(cli, tmp_path, fn, needle):
    (tmp_path / "builders.py").write_text(BUILDERS)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(FILE_RECIPE.format(fn=fn))
    proc = cli.run(recipe, "--cpu", "2", "--run-dir", tmp_path / "run")
    _refused(proc, needle, "r.yaml", "model.builder")


HF_RECIPE = """\
model:
  builder: zerolaunch.models.hf:build
  args: {{path: {path}}}
train: {{steps: 2, micro_batch_size: 4}}
"""


def test_hf_path_is_relative_to_the_recipe_folder(tmp_path):
    from zerolaunch.config import load_recipe

    sub = tmp_path / "recipes"
    (sub / "model").mkdir(parents=True)
    (sub / "model" / "config.json").write_text("{}")
    recipe = sub / "r.yaml"
    recipe.write_text(HF_RECIPE.format(path="model"))
    loaded = load_recipe(str(recipe), world_size=1)
    assert loaded.model.args["path"] == str((sub / "model").resolve())


def test_missing_hf_path_and_uncached_hub_id(cli, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HF_RECIPE.format(path="./no_such_model"))
    _refused(
        cli.run(recipe, "--cpu", "1", "--run-dir", tmp_path / "run"), "model.args.path", "does not exist"
    )
    recipe.write_text(HF_RECIPE.format(path="zerolaunch-test-org/never-cached-model"))
    proc = cli.run(recipe, "--cpu", "1", "--run-dir", tmp_path / "run", HF_HUB_OFFLINE="1")
    _refused(proc, "is not cached", "never-cached-model")


def test_resume_from_a_damaged_checkpoint_file_exits_2_naming_it(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    first = cli.run(tiny_recipe(steps=2, every=2), "--cpu", "2", "--run-dir", run_dir, timeout=300)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    rank_file = run_dir / "checkpoints" / "step_000002" / "rank_0.safetensors"
    data = bytearray(rank_file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    rank_file.write_bytes(bytes(data))
    proc = cli.run(
        tiny_recipe(steps=4, every=2), "--cpu", "2", "--run-dir", run_dir, "--resume", "auto", timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "rank_0.safetensors is damaged" in out, out[-3000:]
    # the full traceback stays in the rank's error record beside its log (rank 0's stderr reaches the console)
    records = list((run_dir / "logs").glob("*/attempt_0/*/error.json"))
    assert any("Traceback" in r.read_text() for r in records)


DATA_RECIPE = """\
model:
  builder: zerolaunch.models.gpt:build
  args: {{size: tiny, vocab_size: 64, seq_len: 32}}
data:
  builder: data.py:{fn}
train: {{steps: 2, micro_batch_size: 4}}
"""

DATA_BUILDERS = """\
import torch

def empty(rank, world_size, micro_batch_size, seed):
    return []

def not_iterable(rank, world_size, micro_batch_size, seed):
    return 42

def raises(rank, world_size, micro_batch_size, seed):
    raise ValueError("corpus shard 7 is missing")

def raises_on_first_batch(rank, world_size, micro_batch_size, seed):
    yield from ()
    raise ValueError("never reached")

def bad_on_rank_1(rank, world_size, micro_batch_size, seed):
    if rank == 1:
        raise TypeError("rank 1 cannot open its shard: expected str, got NoneType")
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (8, micro_batch_size, 33), generator=g)
    return [{"input_ids": b[:, :-1], "labels": b[:, 1:]} for b in x]
"""


@pytest.mark.parametrize(
    ("fn", "needles"),
    [
        ("empty", ["yields no batches", "rank 0 of 2"]),
        ("not_iterable", ["returned a int, not an iterable"]),
        ("raises", ["ValueError: corpus shard 7 is missing", "data.py:10"]),
    ],
)
def test_data_builder_probed_in_the_launcher(cli, tmp_path, fn, needles):
    (tmp_path / "data.py").write_text(DATA_BUILDERS)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(DATA_RECIPE.format(fn=fn))
    proc = cli.run(recipe, "--cpu", "2", "--run-dir", tmp_path / "run")
    _refused(proc, "r.yaml", "data.builder", *needles)
    assert not (tmp_path / "run" / "logs").exists()


def test_builder_value_and_type_errors_in_a_worker_exit_2_with_the_traceback_kept(cli, tmp_path):
    # rank 0's data is fine, so the launcher's probe passes; rank 1's builder raises only in its worker
    (tmp_path / "data.py").write_text(DATA_BUILDERS)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(DATA_RECIPE.format(fn="bad_on_rank_1"))
    run_dir = tmp_path / "run"
    proc = cli.run(recipe, "--cpu", "2", "--run-dir", run_dir, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "data.builder" in out and "TypeError: rank 1 cannot open its shard" in out, out[-3000:]
    assert out.count("rank 1 cannot open its shard") == 1, out[-3000:]
    records = [r.read_text() for r in (run_dir / "logs").glob("*/attempt_0/*/error.json")]
    assert any("Traceback" in r and "TypeError" in r for r in records), records
