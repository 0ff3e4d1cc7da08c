"""Small builders several test folders share (tests/ is on sys.path through its conftest.py:
`from _helpers import tiny_llama`). Fixtures live in the conftest.py files; plain values and functions here."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import sys
from pathlib import Path

ONE_RANK_TORCHRUN_ENV = {
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29999",
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
}
"""The variables torchrun would set for a one-rank job: what bench scripts and DeepSpeed read besides the group."""


@contextlib.contextmanager
def one_rank_group(store_dir: Path):
    """The default process group as one gloo rank over a FileStore in `store_dir` (no port, so tests running
    side by side never collide), with a timeout so a wrong collective fails instead of hanging; torn down after."""
    import torch.distributed as dist

    store = dist.FileStore(str(Path(store_dir) / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        yield
    finally:
        dist.destroy_process_group()


def tiny_gpt_recipe(*, seq_len: int = 32, vocab_size: int = 64, **sections) -> dict:
    """A recipe dict of the built-in tiny GPT trained on synthetic ids below `vocab_size`, `seq_len` long. Each
    keyword is a recipe section (train, checkpoint, deepspeed, or model/data to replace those), in the order
    given after model and data; the caller adds keys inside a section afterwards (model.init_from,
    data.prefetch). The one template of the e2e tests, in-process (`load_recipe(dict)`) or on disk
    (`write_recipe`)."""
    recipe = {
        "model": {
            "builder": "zerolaunch.models.gpt:build",
            "args": {"size": "tiny", "vocab_size": vocab_size, "seq_len": seq_len},
        },
        "data": {
            "builder": "zerolaunch.data.synthetic:build",
            "args": {"vocab_size": vocab_size, "seq_len": seq_len},
        },
    }
    recipe.update(sections)
    return recipe


def write_recipe(path: Path, recipe: dict) -> Path:
    """`recipe` as a YAML file at `path` (block style, keys in the dict's order); returns `path`."""
    import yaml

    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    """A tmpfs of `size` (mount's size=, e.g. "1m": a disk that fills up for real) on the existing `folder`;
    yields whether it mounted (root only: elsewhere `folder` stays a plain folder) and unmounts it after."""
    import subprocess

    try:
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
        mounted = subprocess.run(mount, capture_output=True).returncode == 0
    except OSError:  # no mount(8) here
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous that needs one: torchrun, accelerate)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(script: Path, *args: str, nproc: int = 2) -> list[str]:
    """`python -m torch.distributed.run SCRIPT ARGS` on `nproc` local ranks, rendezvous at 127.0.0.1 on a free
    port (so runs side by side never share one)."""
    import sys

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(script),
        *map(str, args),
    ]


def run_zerolaunch(*args, cwd: Path, timeout: float = 300):
    """`zerolaunch ARGS` run from `cwd` as a user of this checkout runs it: the repository first on PYTHONPATH
    (not installed), one thread a process, the HF hub offline, no ZEROLAUNCH_RECIPE inherited from the caller.
    The CompletedProcess, text captured; TimeoutExpired past `timeout` seconds."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    env.pop("ZEROLAUNCH_RECIPE", None)
    cmd = [sys.executable, "-c", "from zerolaunch.cli.app import main; main()", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def tiny_llama(**overrides) -> dict:
    """A Hugging Face Llama config dict small enough for CPU tests (`hf.build(config=...)`): 32 wide, 4 heads
    with 2 kv heads (grouped-query attention), 4 layers, vocab 64, tied embeddings; `overrides` replace keys."""
    config = {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
        "tie_word_embeddings": True,
    }
    unknown = set(overrides) - set(config)
    assert not unknown, f"tiny_llama: unknown key(s) {sorted(unknown)}"
    return {**config, **overrides}


def save_tiny_llama_base(folder: Path, *, num_hidden_layers: int = 3) -> dict:
    """A tiny Hugging Face Llama (vocab 256, 32 wide, untied head: a LoRA base with a file a recipe can name)
    saved to `folder` from seed 0; returns its weights (cloned)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}


def tiny_gpt2(**overrides) -> dict:
    """A Hugging Face GPT-2 config dict for CPU tests: 1 layer, 32 wide, 4 heads, vocab 64, 32 positions."""
    config = {
        "model_type": "gpt2",
        "vocab_size": 64,
        "n_embd": 32,
        "n_layer": 1,
        "n_head": 4,
        "n_positions": 32,
    }
    unknown = set(overrides) - set(config)
    assert not unknown, f"tiny_gpt2: unknown key(s) {sorted(unknown)}"
    return {**config, **overrides}


def trained_hf_engine(config: dict, *, steps: int = 1, seq_len: int = 16):
    """(engine, token ids): `zerolaunch.initialize` of `hf.build(config=config)` (ZeRO-2, micro batch 2) after
    `steps` steps on one seed-0 batch of 2 x seq_len ids below 64 (the ids are also the labels)."""
    import torch

    import zerolaunch
    from zerolaunch.models import hf

    engine = zerolaunch.initialize(
        hf.build(config=config), {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2}
    )
    x = torch.randint(0, 64, (2, seq_len), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    return engine, x


def forget_compiled_models() -> None:
    """Drop what torch.compile of an earlier test still holds (dynamo's tracked fakes keep that test's params
    and example inputs, and let go of them at some later point): call before a baseline of
    live_cpu_storage_bytes(), which would otherwise see them vanish in the middle of the test."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()


def _live_cpu_tensors() -> list:
    """Every CPU tensor the garbage collector can reach, after a collection."""
    import gc

    import torch

    gc.collect()
    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                found.append(obj)
        except Exception:  # noqa: BLE001 - some objects refuse introspection; they are not ours
            continue
    return found


def live_cpu_storage_bytes() -> int:
    """Bytes of every distinct CPU tensor storage the garbage collector can reach (an independent count of what
    an engine really holds, beside its own memory_bytes())."""
    seen: dict[int, int] = {}
    for tensor in _live_cpu_tensors():
        # inside the guard: a FakeTensor dynamo left behind is a CPU tensor whose storage refuses data_ptr()
        try:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        except Exception:  # noqa: BLE001 - not a real storage, so not memory the engine holds
            continue
    return sum(seen.values())


def hold_cpu_tensors() -> list:
    """Every CPU tensor alive now, held: call before a baseline of live_cpu_storage_bytes() and keep the list
    until the last count. An earlier test's leftovers (a frame a warning or traceback kept, a finalizer that has
    not run) can otherwise be freed in the middle of the count and make the measured growth look smaller."""
    return _live_cpu_tensors()


def load_bench_script(name: str):
    """bench/NAME.py as a module (bench/ is scripts, not a package): what its CPU-side tests call into. bench/
    goes on sys.path as it does when a script runs, so the scripts' imports of each other (_row_process) resolve."""
    bench = Path(__file__).resolve().parent.parent / "bench"
    if str(bench) not in sys.path:
        sys.path.append(str(bench))
    path = bench / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
