"""Which rank hung, said by a script's ranks themselves when a collective times out outside `zerolaunch train`.

Under `zerolaunch train` the launcher names the hung rank (launch/failures.py): it sees every rank's end. Under
plain torchrun or `accelerate launch` each rank that times out only raises gloo's / NCCL's "Timed out
waiting ...", which names no peer. So, when such an exception ends the script, this rank marks itself in the
group's store (still reachable: it is the launcher's, not the collective's) and waits a moment for the
others that timed out too; the ranks that never mark themselves are the ones that did not reach the
collective. One line on stderr names them before the traceback.

Owns: the excepthook and the census. Not: the timeout itself (launch/process_group.py, hf/args.py take it from
ZEROLAUNCH_TIMEOUT) nor the launcher's panel.
"""

from __future__ import annotations

import sys
import time

from zerolaunch.launch import env

CENSUS_WAIT_SECONDS = 5.0
"""How long a rank that timed out waits for the others that timed out too to say so."""
CENSUS_PREFIX = "zerolaunch/timed_out"


def looks_like_timeout(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return "timed out" in text or "timeout" in text


def missing_ranks(store, rank: int, world_size: int, *, attempt: int, wait_s: float) -> list[int]:
    """Mark `rank` as timed out in `store`; the ranks that have not marked themselves after `wait_s`."""
    prefix = f"{CENSUS_PREFIX}/attempt_{attempt}"
    store.set(f"{prefix}/{rank}", "1")
    keys = {r: f"{prefix}/{r}" for r in range(world_size)}
    deadline = time.monotonic() + wait_s
    while True:
        missing = [r for r, key in keys.items() if not store.check([key])]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.1)


def install(wait_s: float = CENSUS_WAIT_SECONDS) -> None:
    """Wrap sys.excepthook once: a timeout that ends the script is followed by the census line."""
    if getattr(sys.excepthook, "zerolaunch_hang_census", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            line = _census_line(exc, wait_s)
        except Exception:  # the census is a courtesy: never hide the real error behind its own
            line = None
        if line:
            print(line, file=sys.stderr, flush=True)
        previous(exc_type, exc, tb)

    hook.zerolaunch_hang_census = True
    sys.excepthook = hook


def _census_line(exc: BaseException, wait_s: float) -> str | None:
    import torch.distributed as dist

    if not looks_like_timeout(exc) or not dist.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = env.env_int("TORCHELASTIC_RESTART_COUNT", 0)
    missing = missing_ranks(_get_default_store(), rank, world_size, attempt=attempt, wait_s=wait_s)
    if not missing:
        return f"zerolaunch: rank {rank}: a collective timed out on every rank (all waited: none hung alone)"
    return (
        f"zerolaunch: rank {rank}: a collective timed out; rank(s) {', '.join(map(str, missing))} never timed "
        "out with it: probably hung (or far slower), see their output"
    )
