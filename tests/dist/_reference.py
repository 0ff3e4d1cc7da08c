"""The pieces of the one-process parity references, written from their definitions, not from zerolaunch.

The ZeRO parity tests compare the engine with plain torch. If the reference took its param groups or its
learning rates from the engine's own modules (zero/param_groups.py, zero/sched.py), a wrong rule there would
be on both sides and every parity test would still pass. So this module imports nothing from zerolaunch:

- params: torch's `named_parameters()` (tied weights once, the first registered name wins);
- groups: nanoGPT's rule (decay on params of 2+ dims; biases and norm gains undecayed) or DeepSpeed's
  `model.parameters()` (one group, all decayed, `decay_1d`);
- learning rates: DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR as deepspeed/runtime/lr_schedules.py
  defines them, driven the way DeepSpeed's engine drives them (the lr is set once when the scheduler is
  built, then `step()` after every optimizer step), and nanoGPT's `get_lr(it)` for "cosine".
- the loop (`train`): accumulate, torch's clip_grad_norm_, set the step's lr, torch's optimizer step.

The options objects are only read (duck-typed): their fields are the recipe's keys, the inputs of both sides.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def named_trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def param_groups(model: nn.Module, weight_decay: float, decay_1d: bool) -> list[dict]:
    """torch.optim param groups: [all trainable, decayed] (decay_1d) or [2+ dims decayed, < 2 dims not]."""
    trainable = [p for _, p in named_trainable(model)]
    if decay_1d:
        return [{"params": trainable, "weight_decay": weight_decay}]
    return [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]


def optimizer(groups: list[dict], o) -> torch.optim.Optimizer:
    """torch's optimizer named by OptimizerOptions `o` (adamw: decoupled decay; adam: L2; sgd + momentum)."""
    if o.name == "adamw":
        return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps)
    if o.name == "adam":
        return torch.optim.Adam(groups, lr=o.lr, betas=o.betas, eps=o.eps)
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum)
    raise ValueError(f"reference: unknown optimizer {o.name!r}")


class _DeepSpeedWarmup:
    """DeepSpeed's WarmupLR (decay=None), WarmupDecayLR (decay="linear") and WarmupCosineLR (decay="cosine"),
    one param group: `lr` is what the next optimizer step uses; `step()` is called after each step."""

    def __init__(self, s, base_lr: float, decay: str | None):
        self.decay = decay
        self.base_lr = base_lr
        self.min_lr = s.warmup_min_lr
        self.max_lr = base_lr if s.warmup_max_lr is None else s.warmup_max_lr
        self.warmup = max(2, s.warmup_num_steps)  # DeepSpeed: log(1) = 0 would divide by zero
        self.log_warmup = s.warmup_type == "log"
        self.total = s.total_num_steps
        self.cos_min_ratio, self.warmup_min_ratio = s.cos_min_ratio, s.warmup_min_ratio
        self.last_batch_iteration = -1
        self.lr = self._lr()  # DeepSpeed sets the lr at construction

    def step(self) -> None:
        self.last_batch_iteration += 1
        self.lr = self._lr()

    def _warmup_fraction(self, it: int) -> float:
        return math.log(it + 1) / math.log(self.warmup) if self.log_warmup else it / self.warmup

    def _lr(self) -> float:
        it = self.last_batch_iteration
        if self.decay == "cosine":
            if it < 0:
                return 0.0
            if it < self.warmup:
                ratio = self.warmup_min_ratio + self._warmup_fraction(it) * (1.0 - self.warmup_min_ratio)
            else:
                progress = min(1.0, (it - self.warmup + 1) / max(1, self.total - self.warmup))
                ratio = (
                    self.cos_min_ratio + (1.0 - self.cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2
                )
                ratio = max(0.0, ratio)
            return self.base_lr * ratio
        if it < 0:
            return self.min_lr
        if it < self.warmup:
            gamma = self._warmup_fraction(it)
        elif self.decay is None:
            gamma = 1.0
        else:
            gamma = max(0.0, (self.total - it) / max(1.0, self.total - self.warmup))
        return self.min_lr + (self.max_lr - self.min_lr) * gamma


def nanogpt_lr(s, base_lr: float, it: int) -> float:
    """nanoGPT's get_lr(it): linear warmup to the peak, cosine to cos_min_ratio * peak, then flat."""
    peak = base_lr if s.warmup_max_lr is None else s.warmup_max_lr
    min_lr = s.cos_min_ratio * peak
    if it < s.warmup_num_steps:
        return peak * (it + 1) / (s.warmup_num_steps + 1)
    if it > s.total_num_steps:
        return min_lr
    decay_ratio = (it - s.warmup_num_steps) / max(1, s.total_num_steps - s.warmup_num_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (peak - min_lr)


def train(model: nn.Module, options, steps: int, micro_loss) -> list[float]:
    """Train `model` in place as EngineOptions `options` say, with torch alone: per optimizer step, the mean of
    `micro_loss(step, micro)` over the accumulation window backward, torch's clip_grad_norm_ (off at 0),
    that step's lr, one torch optimizer step. Returns the grad norm before clipping of every step."""
    o = options.optimizer
    groups = param_groups(model, o.weight_decay, o.decay_1d)
    opt = optimizer(groups, o)
    lrs = learning_rates(options.scheduler, o.lr, steps)
    params = [p for g in groups for p in g["params"]]
    gas = options.gradient_accumulation_steps
    max_norm = options.gradient_clipping if options.gradient_clipping > 0 else float("inf")
    norms = []
    for step in range(steps):
        opt.zero_grad()
        for micro in range(gas):
            (micro_loss(step, micro) / gas).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm)))
        for pg in opt.param_groups:
            pg["lr"] = lrs[step]
        opt.step()
    return norms


def learning_rates(s, base_lr: float, steps: int) -> list[float]:
    """The lr of optimizer steps 1..`steps` under SchedulerOptions `s`."""
    if s.name == "none":
        return [base_lr] * steps
    if s.name == "cosine":
        return [nanogpt_lr(s, base_lr, it) for it in range(steps)]
    decay = {"WarmupLR": None, "WarmupDecayLR": "linear", "WarmupCosineLR": "cosine"}[s.name]
    sched, out = _DeepSpeedWarmup(s, base_lr, decay), []
    for _ in range(steps):
        out.append(sched.lr)
        sched.step()
    return out


def assert_adam_close(got: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor, label: str) -> None:
    """`got` is as close to the fp64 answer as one fp32 process running torch is (ref32), give or take rounding.

    Why not 1e-6 against ref32 alone: Adam's update m / sqrt(v) turns the rounding of a gradient that cancels
    to near zero into a visible step, and which elements meet that depends on the order of the sums, which
    the engine (per rank, per micro-batch) and the reference (the global batch) do not share, and which the
    host's BLAS changes too (MKL's AVX-512 sgemm blocks the batch dimension otherwise than its AVX2 one: the
    same case measured 9.4e-6 off fp64 on an AVX-512 host, 3.1x fp32 torch's own 3.0e-6, and under 3x on
    AVX2). 6x fp32 torch's error plus 1e-6 relative still fails a dropped micro-batch or step by orders of
    magnitude (those move weights by about the lr, 1e-2 here)."""
    err = (got.double() - ref64).abs().max().item()
    ref_err = (ref32.double() - ref64).abs().max().item()
    bound = 6 * ref_err + 1e-6 * ref64.abs().max().item()
    assert err <= bound, f"{label}: off the fp64 reference by {err:.3g}, fp32 torch by {ref_err:.3g}"
