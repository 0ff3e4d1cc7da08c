"""`estimate-memory --measure`: the step-time cost of each offload choice, from bandwidths measured here.

Owns two things: measuring copy bandwidths on this machine in well under a second (host<->device with pinned
memory on CUDA; without CUDA a host memcpy stands in for the host<->device link, which is said; an NVMe-path
write + fsync and read of a small file), and the arithmetic `bytes moved per optimizer step / bandwidth`
per row. It does not model overlap: the cost is the transfer time if nothing hid it (an upper bound).

Bytes moved per step and rank (Psi = params, N = ranks, b = compute-dtype bytes):
- optimizer on cpu: fp32 grad shard device->host (4 Psi/N) and the updated b-byte param shard back (b Psi/N);
- optimizer on nvme: the same, plus fp32 master + moments read and written once (2 x the row's swap bytes);
- params offloaded (stage 3): the b-byte param shard host->device twice (forward and backward gathers), and
  with nvme that shard read from disk twice too.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Bandwidths:
    """Bytes per second, and how each number was obtained."""

    h2d: float
    d2h: float
    disk_read: float | None = None
    disk_write: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "h2d_bytes_per_s": self.h2d,
            "d2h_bytes_per_s": self.d2h,
            "disk_read_bytes_per_s": self.disk_read,
            "disk_write_bytes_per_s": self.disk_write,
            "notes": list(self.notes),
        }


def _best_seconds(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def measure_bandwidths(nvme_path: str | None = None, nbytes: int = 64 * 2**20) -> Bandwidths:
    import torch

    notes = []
    if torch.cuda.is_available():
        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

        def h2d():
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()

        def d2h():
            host.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()

        h2d()
        bw = Bandwidths(nbytes / _best_seconds(h2d), nbytes / _best_seconds(d2h), notes=notes)
        notes.append(
            f"host<->device: pinned copies of {nbytes // 2**20} MiB on {torch.cuda.get_device_name()}"
        )
    else:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        rate = nbytes / _best_seconds(lambda: dst.copy_(src))
        bw = Bandwidths(rate, rate, notes=notes)
        notes.append(
            "no CUDA: host<->device assumed as fast as a host memcpy (measured); on a GPU host PCIe is "
            "usually slower, so the offload costs shown are lower bounds"
        )
    if nvme_path is not None:
        bw.disk_write, bw.disk_read = _disk(Path(nvme_path), nbytes)
        notes.append(
            f"nvme: write+fsync and read of {nbytes // 2**20} MiB in {nvme_path} (page cache may speed the read)"
        )
    return bw


def _disk(folder: Path, nbytes: int) -> tuple[float, float]:
    folder.mkdir(parents=True, exist_ok=True)
    data = os.urandom(nbytes)
    fd, name = tempfile.mkstemp(prefix=".zerolaunch-bw-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            t0 = time.perf_counter()
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            write_s = time.perf_counter() - t0
        with open(name, "rb") as f:
            t0 = time.perf_counter()
            while f.read(8 * 2**20):
                pass
            read_s = time.perf_counter() - t0
    finally:
        os.unlink(name)
    return nbytes / max(write_s, 1e-9), nbytes / max(read_s, 1e-9)


def offload_step_seconds(
    row, numel: int, world_size: int, dtype_bytes: int, bw: Bandwidths, frozen_numel: int = 0
) -> float | None:
    """Transfer seconds per optimizer step that the row's offload adds (0 for no offload); None when a
    needed bandwidth was not measured (nvme rows without an nvme path). numel: trainable elements (grads
    out, stepped params back); frozen_numel: frozen ones, which move only with offloaded params (gathered
    in forward and backward, never stepped)."""
    if row.offload == "none":
        return 0.0
    shard = numel / world_size
    seconds = 4 * shard / bw.d2h + dtype_bytes * shard / bw.h2d
    params = row.offload.startswith("optimizer+params")
    param_shard = shard + frozen_numel / world_size
    if params:
        seconds += 2 * dtype_bytes * param_shard / bw.h2d
    if row.offload.endswith("nvme"):
        if bw.disk_read is None or bw.disk_write is None:
            return None
        param_swap = dtype_bytes * param_shard if params else 0
        state_swap = row.nvme_bytes - param_swap
        seconds += state_swap / bw.disk_read + state_swap / bw.disk_write
        if params:
            seconds += 2 * param_swap / bw.disk_read
    return seconds
