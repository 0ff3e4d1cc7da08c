"""A stand-in for `zerolaunch.zero.Engine` that implements only the checkpoint contract, for tests (tests/ is
on sys.path through its conftest.py: `from _fake_engine import FakeEngine`).

It plans its fragments with the real `zero.layout.plan_layout`, so the fragments it saves and asks for are
the engine's, at any world size and bucket size; but it holds its state as full tensors, initialised from a
seed, and needs no process group. That makes the checkpoint format, the reader and resharding testable in
one process: save from N fake ranks, load into M fresh ones, compare. A fresh engine's state is NaN, so a
test also sees when a load forgets an element.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from zerolaunch.checkpoint.save import finalize, prepare_folder, step_dir_name, write_rank_files
from zerolaunch.zero.layout import ParamSpec, plan_layout


@dataclass(frozen=True)
class FakeTensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    trainable: bool
    aliases: tuple[str, ...] = ()


class FakeEngine:
    KINDS = ("master", "exp_avg", "exp_avg_sq")

    def __init__(
        self,
        specs: list[FakeTensorSpec],
        *,
        rank: int,
        world_size: int,
        bucket_numel: int,
        seed: int | None = 0,
        buffers: dict[str, tuple[int, ...]] | None = None,
    ):
        self.specs = list(specs)
        self.rank = rank
        self.layout = plan_layout(
            [ParamSpec(s.name, s.shape) for s in specs if s.trainable], world_size, bucket_numel
        )
        self.bucket_numel = bucket_numel
        gen = torch.Generator().manual_seed(seed if seed is not None else 0)

        def value(shape, dtype=torch.float32):
            if seed is None:
                return torch.full(shape, float("nan"), dtype=dtype)
            return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)

        self.state = {
            k: {s.name: value(s.shape).reshape(-1) for s in specs if s.trainable} for k in self.KINDS
        }
        self.step_count = {
            s.name: torch.tensor([float("nan") if seed is None else 7.0]) for s in specs if s.trainable
        }
        self.replicated = {s.name: value(s.shape, s.dtype) for s in specs if not s.trainable}
        for name, shape in (buffers or {}).items():
            self.replicated[name] = value(shape)
        self.meta = {"global_steps": -1 if seed is None else 7, "scheduler": {"last_epoch": 7}}

    def param_specs(self) -> list[FakeTensorSpec]:
        return self.specs

    def owned_fragments(self):
        return self.layout.owned_fragments(self.rank)

    def fragment_state(self) -> dict[str, torch.Tensor]:
        out = {}
        for f in self.owned_fragments():
            for kind in self.KINDS:
                out[f"{kind}/{f.name}/{f.start}"] = self.state[kind][f.name][f.start : f.stop]
            out[f"step/{f.name}/{f.start}"] = self.step_count[f.name]
        return out

    def load_fragment_state(self, read) -> None:
        for f in self.owned_fragments():
            for kind in self.KINDS:
                self.state[kind][f.name][f.start : f.stop] = read(kind, f.name, f.start, f.stop)
            self.step_count[f.name] = read("step", f.name, f.start, f.stop).clone()

    def replicated_state(self) -> dict[str, torch.Tensor]:
        return dict(self.replicated)

    def load_replicated_state(self, d: dict[str, torch.Tensor]) -> None:
        self.replicated = {k: v.clone() for k, v in d.items()}

    def state_meta(self) -> dict:
        return dict(self.meta)

    def load_state_meta(self, d: dict) -> None:
        self.meta = dict(d)


def fake_ranks(
    specs: list[FakeTensorSpec],
    world_size: int,
    *,
    bucket_numel: int,
    seed: int | None = 0,
    buffers: dict[str, tuple[int, ...]] | None = None,
) -> list[FakeEngine]:
    """One FakeEngine per rank of a `world_size` run, all from the same seed (the same model state)."""
    return [
        FakeEngine(
            specs, rank=r, world_size=world_size, bucket_numel=bucket_numel, seed=seed, buffers=buffers
        )
        for r in range(world_size)
    ]


def save_fake(engines: list[FakeEngine], root, step: int, extras: dict | None = None, keep=None) -> Path:
    """A checkpoint of `engines` (rank r = engines[r]) under `root`, written in this one process: the phases
    of save_checkpoint (prepare, every rank's files, finalize) in turn, without a process group.
    extras: {rank: that rank's `extra`}."""
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    prepare_folder(root, tmp)
    for r, e in enumerate(engines):
        write_rank_files(e, tmp, r, (extras or {}).get(r, {}))
    finalize(engines[0], tmp, final, len(engines), step=step, keep=keep)
    return final
