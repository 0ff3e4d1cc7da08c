"""offload_optimizer nvme: stages 1, 2 and 3 give the weights of the same engine without offload.

Tests: fp32 on 2 CPU gloo ranks, the shared Net (two param groups, tied, frozen, buffer), small buckets so
each rank streams more chunks than it has buffers (2; 1 for stage 3), grad accumulation 2 and clipping, AdamW and SGD with
momentum; memory_bytes (master on disk, host optimizer bytes = the buffers); the swap files removed on
close; a save_checkpoint -> load_checkpoint round trip (fragment_state / load_fragment_state) into a fresh nvme engine that then trains on
identically. Leaves out: 16-bit dtypes, CUDA pinned buffers, real NVMe speed.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
from _spawn import run_ranks
from _zero_models import Net, train_engine

from zerolaunch.checkpoint import load_checkpoint, save_checkpoint
from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OffloadOptions, OptimizerOptions, ZeroOptions

STEPS = 3


def _options(stage: int, optimizer: str, nvme_path: str | None) -> EngineOptions:
    # stage 3 has fewer, unit-sized chunks here: one buffer (no read-ahead) keeps it streaming too.
    buffers = 2 if stage < 3 else 1
    off = OffloadOptions(device="nvme", nvme_path=nvme_path, buffer_count=buffers)
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            reduce_bucket_size=100,
            stage3_param_persistence_threshold=20,
            offload_optimizer=off if nvme_path else OffloadOptions(),
        ),
        optimizer=OptimizerOptions(name=optimizer, lr=1e-2, weight_decay=0.1, momentum=0.9),
        gradient_clipping=0.05,
        gradient_accumulation_steps=2,
    )


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in engine.iter_full_state()}


def _cases(rank: int, world_size: int, root: str) -> dict:
    out = {}
    folder = os.path.join(root, f"rank{rank}")
    os.makedirs(folder, exist_ok=True)
    for stage in (1, 2, 3):
        for optimizer in ("adamw", "sgd"):
            plain = Engine(Net(rank), _options(stage, optimizer, None))
            train_engine(plain, rank, world_size, STEPS)
            swapped = Engine(Net(rank), _options(stage, optimizer, folder))
            train_engine(swapped, rank, world_size, STEPS)
            mem = swapped.memory_bytes()
            out[(stage, optimizer)] = {
                "plain": _weights(plain),
                "nvme": _weights(swapped),
                "mem": mem,
                "plain_mem": plain.memory_bytes(),
                "buffer_bytes": swapped.shards.store.buffer_bytes,
                "chunks": len(swapped.shards.chunks),
                "buffer_count": len(swapped.shards.store.buffers),
                "files_open": len(os.listdir(folder)),
            }
            swapped.close()
            out[(stage, optimizer)]["files_closed"] = len(os.listdir(folder))
    # offload_param nvme (stage 3): the units' shards in a second swap file, alone and with the optimizer's.
    for optimizer_device in ("cpu", "nvme"):
        plain = Engine(Net(rank), _options(3, "adamw", None))
        train_engine(plain, rank, world_size, STEPS)
        opts = _options(3, "adamw", folder if optimizer_device == "nvme" else None)
        params_nvme = OffloadOptions(device="nvme", nvme_path=folder, pin_memory=True)
        optimizer_off = opts.zero.offload_optimizer if optimizer_device == "nvme" else OffloadOptions("cpu")
        opts = replace(
            opts, zero=replace(opts.zero, offload_param=params_nvme, offload_optimizer=optimizer_off)
        )
        swapped = Engine(Net(rank), opts)
        train_engine(swapped, rank, world_size, STEPS)
        out[("params", optimizer_device)] = {
            "plain": _weights(plain),
            "nvme": _weights(swapped),
            "mem": swapped.memory_bytes(),
            "plain_mem": plain.memory_bytes(),
            # without offload the units keep a shard of their frozen params only (they have no master)
            "plain_frozen_shard_bytes": sum(
                f.shard_bytes_in_memory for f in plain.sharding.flats if f is not None and not f.resident
            ),
            "swap_bytes": swapped.sharding.param_swap.file_bytes,
            "shards_in_memory": [f.shard is not None for f in swapped.sharding.flats if f is not None],
            "resident_shard_bytes": swapped.sharding.flats[-1].shard_bytes_in_memory,
            "files_open": len(os.listdir(folder)),
        }
        swapped.close()
        out[("params", optimizer_device)]["files_closed"] = len(os.listdir(folder))
    for stage in (1, 3):  # checkpoint contract round trip
        first = Engine(Net(rank), _options(stage, "adamw", folder))
        train_engine(first, rank, world_size, 2)
        save_checkpoint(first, os.path.join(root, f"ckpt{stage}"), step=2)
        second = Engine(Net(rank + 7), _options(stage, "adamw", folder))
        load_checkpoint(second, os.path.join(root, f"ckpt{stage}"))
        saved = first.fragment_state()
        reloaded = second.fragment_state()
        train_engine(first, rank, world_size, 1)
        train_engine(second, rank, world_size, 1)
        out[("resume", stage)] = {
            "same_state": sorted(saved) == sorted(reloaded)
            and all(torch.equal(saved[k], reloaded[k]) for k in saved),
            "first": _weights(first),
            "second": _weights(second),
        }
        first.close()
        second.close()
    return out


def test_nvme_offload_matches_no_offload_and_resumes(tmp_path):
    results = run_ranks(_cases, 2, str(tmp_path), timeout_s=600)
    for rank, res in enumerate(results):
        for stage in (1, 2, 3):
            for optimizer in ("adamw", "sgd"):
                case = res[(stage, optimizer)]
                for name, ref in case["plain"].items():
                    torch.testing.assert_close(case["nvme"][name], ref, rtol=1e-6, atol=1e-7, msg=name)
                mem = case["mem"]
                assert mem["master"] == 0 and mem["optimizer"] == case["buffer_bytes"]
                # on disk: the whole master + state the plain engine holds in memory
                assert mem["nvme"] == case["plain_mem"]["master"] * (3 if optimizer == "adamw" else 2)
                assert case["chunks"] > case["buffer_count"], (stage, case["chunks"], case["buffer_count"])
                assert case["files_open"] == 1 and case["files_closed"] == 0, (rank, stage, optimizer)
        for optimizer_device in ("cpu", "nvme"):
            case = res[("params", optimizer_device)]
            for name, ref in case["plain"].items():
                torch.testing.assert_close(case["nvme"][name], ref, rtol=1e-6, atol=1e-7, msg=name)
            # only the resident unit (persistent params) keeps its shard in memory; the units' are on disk
            assert case["shards_in_memory"] == [False] * (len(case["shards_in_memory"]) - 1) + [True]
            # the plain engine (no offload) holds no shard of trainable params ([Note: gather from master]):
            # the same resident tensors, without the resident unit's shard, with the frozen params' shard
            assert case["resident_shard_bytes"] > 0 and case["plain_frozen_shard_bytes"] > 0
            assert case["mem"]["params"] == (
                case["plain_mem"]["params"] + case["resident_shard_bytes"] - case["plain_frozen_shard_bytes"]
            )
            on_disk = case["swap_bytes"] + (
                case["plain_mem"]["master"] * 3 if optimizer_device == "nvme" else 0
            )
            assert case["mem"]["nvme"] == on_disk and case["swap_bytes"] > 0
            assert (
                case["files_open"] == (2 if optimizer_device == "nvme" else 1) and case["files_closed"] == 0
            )
        for stage in (1, 3):
            resume = res[("resume", stage)]
            assert resume["same_state"]
            for name, ref in resume["first"].items():
                torch.testing.assert_close(resume["second"][name], ref, rtol=1e-6, atol=1e-7, msg=name)
