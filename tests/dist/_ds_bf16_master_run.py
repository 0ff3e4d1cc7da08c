"""One pure-bf16 training script run by DeepSpeed and by zerolaunch (tests/dist/test_ds_bf16_master.py).

    python tests/dist/_ds_bf16_master_run.py {deepspeed|zerolaunch} OUT.pt

2 CPU gloo ranks (_ds_ranks.py), _ds_parity_run.py's model and data in bf16, the same ds_config with
`bf16: {enabled, bf16_master_weights_and_grads, bf16_optimizer_states}` all true, for each case of CASES
(ZeRO stage x gradient_clipping); rank 0 saves {case: {param name: bf16 tensor}}. The optimizer is torch's
AdamW with `fused: true` (DeepSpeed passes it on with torch_adam): fp32 arithmetic rounded once, what
DeepSpeed's FusedAdam computes on a GPU; without it DeepSpeed on the CPU runs torch's foreach AdamW in bf16
arithmetic, rounding every intermediate.
"""

from __future__ import annotations

import sys

import _ds_parity_run as base
import _ds_ranks
import _spawn
import torch

CASES = [(stage, clip) for stage in (1, 2, 3) for clip in (0.0, 0.05)]


def config(stage: int, clip: float) -> dict:
    c = base.config(stage)
    c["gradient_clipping"] = clip
    c["optimizer"]["params"]["fused"] = True
    c["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    return c


def _train_case(which: str, stage: int, clip: float, deepspeed) -> dict[str, torch.Tensor]:
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = base.Net()
    if which == "deepspeed":
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config(stage, clip)
        )
    else:
        import zerolaunch

        engine = zerolaunch.initialize(model, config(stage, clip), device="cpu")
    for step in range(base.STEPS):
        x, y = base.batch(rank, step)
        loss = engine(x.bfloat16(), y.bfloat16())
        engine.backward(loss)
        engine.step()
    if which == "deepspeed":
        params = list(engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in params], enabled=stage == 3):
            return {n: p.detach().clone() for n, p in params}
    return {n: t.detach().clone() for n, t in engine.engine.iter_full_state()}


def _worker(rank: int, world_size: int, store_path: str, which: str, out: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store_path)
    deepspeed = _ds_ranks.init_deepspeed() if which == "deepspeed" else None
    results = {case: _train_case(which, *case, deepspeed) for case in CASES}
    _ds_ranks.finish(rank, results, out)


if __name__ == "__main__":
    _spawn.start_ranks(_worker, base.WORLD_SIZE, sys.argv[1], sys.argv[2])
