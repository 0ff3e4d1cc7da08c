"""How many workers, on what: `--gpus N` (N visible GPUs, nccl) or `--cpu N` (N gloo workers on the CPU).

torch is imported lazily, inside `count_gpus`, so `zerolaunch train --help` stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerolaunch.launch.ports import LaunchError


@dataclass(frozen=True)
class Workers:
    nproc_per_node: int
    device: str
    """cuda or cpu."""


def count_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_workers(gpus: int | None, cpu: int | None) -> Workers:
    if gpus is not None and cpu is not None:
        raise LaunchError("give either --gpus N or --cpu N, not both")
    if cpu is not None:
        if cpu < 1:
            raise LaunchError(f"--cpu needs a worker count >= 1, got {cpu}")
        return Workers(cpu, "cpu")
    visible = count_gpus()
    if gpus is None:
        if visible == 0:
            raise LaunchError(
                "this machine has no visible GPU; run on the CPU with --cpu N (N gloo workers), or check "
                "CUDA_VISIBLE_DEVICES / the driver"
            )
        return Workers(visible, "cuda")
    if gpus < 1:
        raise LaunchError(f"--gpus needs a GPU count >= 1, got {gpus}")
    if gpus > visible:
        hint = "; run on the CPU with --cpu N instead" if visible == 0 else f"; use --gpus {visible} or fewer"
        raise LaunchError(f"--gpus {gpus} asks for more GPUs than the {visible} visible here{hint}")
    return Workers(gpus, "cuda")
