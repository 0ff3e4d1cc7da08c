"""zero/optim/nvme_store.py without process groups: the swap store's round trips, bounded memory, errors and
cleanup, and shard_optimizer.py's per-chunk step over a swap file against torch's optimizers over the whole
flat tensor.

Not covered here: the engines (tests/dist/test_zero_nvme.py) and real NVMe throughput.
"""

from __future__ import annotations

import errno
import gc
import os

import pytest
import torch

from zerolaunch.zero.grad_shards import GradShards
from zerolaunch.zero.optim import nvme_store
from zerolaunch.zero.optim.shard_optimizer import Chunk, ShardOptimizer
from zerolaunch.zero.options import OffloadOptions, OptimizerOptions
from zerolaunch.zero.plan import GradSegment


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_sweep_round_trip_and_random_access(tmp_path):
    numels = [5, 17, 3, 11, 8]
    store = nvme_store.SwapStore(str(tmp_path), numels, ("master", "exp_avg"), buffer_count=2)
    for c, views in store.sweep(range(len(numels)), read=False):
        views["master"].copy_(torch.arange(numels[c], dtype=torch.float32) + 100 * c)
        views["exp_avg"].fill_(-c)
    for _, views in store.sweep(range(len(numels))):  # read-modify-write
        views["exp_avg"].add_(views["master"])
    for c, n in enumerate(numels):
        master = torch.arange(n, dtype=torch.float32) + 100 * c
        assert torch.equal(store.read("master", c, 0, n), master)
        assert torch.equal(store.read("exp_avg", c, 1, n - 1), (master - c)[1:])
    store.write("exp_avg", 3, 2, torch.tensor([7.0, 8.0]))
    assert store.read("exp_avg", 3, 2, 3).tolist() == [7.0, 8.0, 300.0 + 4 - 3]
    assert store.max_chunks_held <= 2
    assert os.path.getsize(store.path) == sum(numels) * 2 * 4 == store.file_bytes


def test_resident_memory_stays_bounded_by_the_buffers(tmp_path):
    """64 MiB of state through 2 buffers of 2 MiB: the process RSS must not grow by the state's size."""
    chunk_numel, chunks = 1 << 18, 32  # 1 MiB per kind per chunk
    store = nvme_store.SwapStore(str(tmp_path), [chunk_numel] * chunks, ("master", "exp_avg"), buffer_count=2)
    assert store.file_bytes >= 8 * store.buffer_bytes
    for c, views in store.sweep(range(chunks), read=False):
        views["master"].fill_(c)
        views["exp_avg"].fill_(-c)
    base = _rss_bytes()
    peak = base
    total = 0.0
    for _, views in store.sweep(range(chunks)):
        views["exp_avg"].mul_(2)
        total += float(views["master"][0])
        peak = max(peak, _rss_bytes())
    assert total == sum(range(chunks))  # every chunk came back with its own values
    assert store.read("exp_avg", 31, 0, 1).item() == -62.0
    assert peak - base < store.file_bytes / 4, f"RSS grew {peak - base} bytes for {store.file_bytes} of state"
    assert store.max_chunks_held <= 2


def test_file_removed_on_close_and_on_garbage_collection(tmp_path):
    store = nvme_store.SwapStore(str(tmp_path), [4, 4], ("master",), buffer_count=1)
    path = store.path
    assert os.path.exists(path)
    store.close()
    assert not os.path.exists(path) and store.closed
    with pytest.raises(nvme_store.NvmeError, match="closed"):
        store.read("master", 0, 0, 1)
    other = nvme_store.SwapStore(str(tmp_path), [4], ("master",), buffer_count=1)
    path = other.path
    del other
    gc.collect()
    assert not os.path.exists(path)


def test_missing_and_not_a_folder_paths_are_clear_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(nvme_store.NvmeError, match=rf"{missing} does not exist; create it \(mkdir -p"):
        nvme_store.SwapStore(str(missing), [4], ("master",), buffer_count=1)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(nvme_store.NvmeError, match="is not a folder"):
        nvme_store.SwapStore(str(a_file), [4], ("master",), buffer_count=1)
    with pytest.raises(nvme_store.NvmeError, match="buffer_count must be >= 1"):
        nvme_store.SwapStore(str(tmp_path), [4], ("master",), buffer_count=0)


def test_full_disk_names_the_path_and_the_bytes(tmp_path, monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(nvme_store.NvmeError, match=rf"nvme_path {tmp_path} is full: 96 bytes needed"):
        nvme_store.SwapStore(str(tmp_path), [8, 4], ("master", "exp_avg"), buffer_count=1)
    assert os.listdir(tmp_path) == []  # the half-made file is gone
    monkeypatch.undo()

    store = nvme_store.SwapStore(str(tmp_path), [8], ("master",), buffer_count=1)

    def write_fails(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", write_fails)
    with pytest.raises(nvme_store.NvmeError, match="is full: 32 bytes needed"):
        store.write("master", 0, 0, torch.ones(8))


@pytest.mark.parametrize(
    "options",
    [
        OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
        OptimizerOptions(name="adam", lr=1e-2, weight_decay=0.1),
        OptimizerOptions(name="sgd", lr=1e-1, momentum=0.9),
        OptimizerOptions(name="sgd", lr=1e-1),
    ],
    ids=["adamw", "adam", "sgd-momentum", "sgd"],
)
def test_chunked_step_equals_torch_over_the_whole_tensor(tmp_path, options):
    torch.manual_seed(0)
    numels = [7, 13, 5]  # chunks of group 0, then 1 of group 1
    chunks = [Chunk(0, 0, 7), Chunk(0, 7, 13), Chunk(1, 0, 5)]
    init = [torch.randn(20), torch.randn(5)]
    decays = [options.weight_decay, 0.0]
    ref = [t.clone() for t in init]
    kwargs = {"lr": options.lr}
    if options.name == "sgd":
        ref_opt = torch.optim.SGD(
            [{"params": [ref[0]], "weight_decay": decays[0]}, {"params": [ref[1]], "weight_decay": 0.0}],
            momentum=options.momentum,
            **kwargs,
        )
    else:
        cls = torch.optim.AdamW if options.name == "adamw" else torch.optim.Adam
        ref_opt = cls(
            [{"params": [ref[0]], "weight_decay": decays[0]}, {"params": [ref[1]], "weight_decay": 0.0}],
            betas=options.betas,
            eps=options.eps,
            **kwargs,
        )
    off = OffloadOptions(device="nvme", nvme_path=str(tmp_path), buffer_count=2)
    opt = ShardOptimizer(options, off, [20, 5], decays, chunks, device=torch.device("cpu"))
    opt.initialize(lambda c, view: view.copy_(init[chunks[c].group][chunks[c].offset :][: chunks[c].numel]))
    for _ in range(3):
        grads = [torch.randn(20), torch.randn(5)]
        for r, g in zip(ref, grads, strict=True):
            r.grad = g.clone()
        ref_opt.step()
        shards = GradShards(
            [20, 5],
            [GradSegment(c.group, c.offset, c.numel, i) for i, c in enumerate(chunks)],
            torch.device("cpu"),
            pin=False,
            releasable=False,
        )
        for seg, t in zip(shards.segments, shards.tensors, strict=True):
            t.copy_(grads[seg.group][seg.offset : seg.offset + seg.numel])
        seen: list[int] = []
        opt.step(shards, options.lr, lambda c, master, seen=seen: seen.append(c))
        assert seen == [0, 1, 2]
    for g, r in enumerate(ref):
        got = torch.cat([opt.read("master", g, c.offset, c.numel) for c in chunks if c.group == g])
        torch.testing.assert_close(got, r, rtol=1e-6, atol=1e-7)
    assert sum(numels) == 25 and opt.memory_bytes()["nvme"] == 25 * 4 * (1 + len(opt.kinds))
    opt.close()
    assert os.listdir(tmp_path) == []
