"""A model builder for the launcher's failure tests: the built-in GPT, and a fault on one rank at the start of
one optimizer step, on the first attempt only (so a `--max-restarts` run recovers).

The recipe names this file as `model.builder` (conftest's `tiny_recipe(fault=...)`), so the fault comes from
the test, not from a hook in the product's loop. It fires in a forward pre-hook on the root module: the model's
parameters, names and checkpoints stay the built-in GPT's, and it fires where the old loop hook did, before
the step's first forward. The step is counted from the forwards this process made, so it assumes a fresh
start on the first attempt (the failure tests never pass --resume).
"""

from __future__ import annotations

import os
import signal
import time

import torch.distributed as dist

from zerolaunch.models.gpt import build as build_gpt

MODES = ("raise", "kill", "hang")


class InjectedFailure(RuntimeError):
    """What mode "raise" raises."""


def build(
    *, fault_step: int, fault_rank: int = 0, fault_mode: str = "raise", micro_steps: int = 1, **gpt_args
):
    """The GPT of `gpt_args`; rank `fault_rank` fails at the start of optimizer step `fault_step` (1-based):
    raise (an exception), kill (SIGKILL itself) or hang (sleep, for the collective-timeout test).
    micro_steps: forwards per optimizer step (the recipe's gradient accumulation)."""
    if fault_mode not in MODES:
        raise ValueError(f"fault_mode must be one of {', '.join(MODES)}, got {fault_mode!r}")
    model = build_gpt(**gpt_args)
    rank = dist.get_rank() if dist.is_initialized() else 0
    # torchelastic's count of group restarts: the fault is for the first attempt only
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    forwards = 0

    def inject_fault(module, args):
        nonlocal forwards
        index, forwards = forwards, forwards + 1
        step = index // micro_steps + 1
        first_micro_batch = index % micro_steps == 0
        if not (first_attempt and rank == fault_rank and step == fault_step and first_micro_batch):
            return
        if fault_mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault_mode == "hang":
            time.sleep(3600)
        raise InjectedFailure(f"injected fault: rank {rank} fails at step {step}")

    model.register_forward_pre_hook(inject_fault)
    return model
