"""What the side-by-side benches (run.py, engine_tax.py, lora.py, step_profile.py) share: each row runs in its own
process at world size 1 and hands back one `RESULT {json}` line.

- `one_rank_torchrun_env(port)`: torchrun's variables for a one-rank job (for a row process's env);
  `single_rank_env()` sets them in this process where the caller has none (a bench run under torchrun keeps its
  own).
- `init_single_rank_group(device)`: that env, the GPU picked, and the default group (gloo on the CPU, NCCL bound to
  GPU 0) unless one exists (a test made it).
- `print_result(row)` / `row_result(cmd, timeout)`: the two sides of the RESULT line.
- `TINY_LLAMA`: the Llama layer shape of the CPU smoke runs (`--tiny`); `LLAMA_1B`: recipes/hf-llama-1b.yaml's.

bench/ is scripts, not a package: the scripts import this by name (their folder is sys.path[0] when run).
"""

from __future__ import annotations

import json
import os
import subprocess

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)
"""A 2-layer Llama shape with grouped-query attention (4 heads, 2 kv heads): seconds per step on a CPU."""

LLAMA_1B = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1.0e-5,
    "tie_word_embeddings": False,
}
"""recipes/hf-llama-1b.yaml's model.args.config (TinyLlama-1.1B's shape); tests/unit/test_bench_hf.py holds them
equal."""

RESULT = "RESULT "


def one_rank_torchrun_env(port: int | str | None = None) -> dict[str, str]:
    """The variables torchrun sets for a one-rank job. Without a `port`, one derived from the pid, so rows of two
    benches started side by side do not collide."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29500 + os.getpid() % 1000 if port is None else port),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
    }


def single_rank_env() -> None:
    """Set-default the torchrun variables of a one-rank job in this process."""
    for key, value in one_rank_torchrun_env().items():
        os.environ.setdefault(key, value)


def init_single_rank_group(device=None) -> None:
    """single_rank_env(), then the default group unless the caller made one: gloo for a CPU `device`, else NCCL on
    GPU 0 (which becomes the current device)."""
    import torch
    import torch.distributed as dist

    single_rank_env()
    if device is not None and device.type == "cpu":
        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=0, world_size=1)
        return
    torch.cuda.set_device(0)
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))


def pick_rows(spec: str, known: tuple[str, ...], every: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """--rows: a comma list of `known` rows, or "all" (= `every`, default all of `known`); an unknown name ends
    the driver naming the choices."""
    rows = (known if every is None else every) if spec == "all" else tuple(spec.split(","))
    unknown = [r for r in rows if r not in known]
    if unknown:
        raise SystemExit(f"unknown row(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return rows


def print_result(row: dict) -> None:
    """The row process's answer to its driver: one line, flushed before the process exits."""
    print(RESULT + json.dumps(row), flush=True)


def _tail(text: str, lines: int) -> list[str]:
    return text.strip().splitlines()[-lines:]


def row_result(cmd: list[str], timeout: float) -> dict:
    """Run one row's process and return the dict of its last `RESULT {json}` line. RuntimeError with the last
    lines of its output when it fails, prints no RESULT line or outlives `timeout` seconds (then the rows after it
    still run); the message says when a signal killed it (SIGKILL: the kernel's OOM killer) or CUDA ran out of
    memory."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        out = expired.stderr or expired.stdout or b""
        tail = _tail(out.decode(errors="replace") if isinstance(out, bytes) else out, 4)
        raise RuntimeError(" | ".join([f"timed out after {timeout:.0f} s", *tail])) from None
    line = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
    if p.returncode == 0 and line:
        return json.loads(line[-1][len(RESULT) :])
    tail = _tail(p.stderr or p.stdout, 6)
    if any("OutOfMemoryError" in ln or "CUDA out of memory" in ln for ln in tail):
        tail.insert(0, "CUDA out of memory")
    if p.returncode < 0:
        tail.insert(
            0, f"killed by signal {-p.returncode}" + (" (host memory?)" if p.returncode == -9 else "")
        )
    raise RuntimeError(" | ".join(tail))
