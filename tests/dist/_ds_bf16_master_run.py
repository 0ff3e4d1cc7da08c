"""One pure-bf16 training script run by DeepSpeed and by zerolaunch (tests/dist/test_ds_bf16_master.py), and
bf16 compute over an fp32 master (FP32_MASTER_STAGES).

    python tests/dist/_ds_bf16_master_run.py {deepspeed|zerolaunch} OUT.pt

2 CPU gloo ranks (_ds_ranks.py), _ds_parity_run.py's model and data in bf16, the same ds_config with
`bf16: {enabled, bf16_master_weights_and_grads, bf16_optimizer_states}` all true, for each case of CASES
(ZeRO stage x gradient_clipping); rank 0 saves {case: {param name: bf16 tensor}}. The optimizer is torch's
AdamW with `fused: true` (DeepSpeed passes it on with torch_adam): fp32 arithmetic rounded once, what
DeepSpeed's FusedAdam computes on a GPU; without it DeepSpeed on the CPU runs torch's foreach AdamW in bf16
arithmetic, rounding every intermediate. Each stage of FP32_MASTER_STAGES also trains the model built in
fp32 under `bf16: {enabled: true}` alone (fp32_master_config) and saves {("fp32-master", stage): {"init",
"trained": {param name: fp32 master}}}, DeepSpeed's read with safe_get_full_fp32_param.
"""

from __future__ import annotations

import sys

import _ds_parity_run as base
import _ds_ranks
import _spawn
import torch

CASES = [(stage, clip) for stage in (1, 2, 3) for clip in (0.0, 0.05)]
FP32_MASTER_STAGES = (1, 2, 3)
"""bf16 compute over an fp32 master (`bf16: {enabled: true}` alone), the model built in fp32."""


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


def fp32_master_config(stage: int) -> dict:
    """bf16 compute over an fp32 master; grads reduced in bf16, what DeepSpeed does whatever
    communication_data_type says (its grad buffers are bf16); torch's fused AdamW on both sides."""
    c = base.config(stage)
    c["gradient_clipping"] = 0.0
    c["optimizer"]["params"]["fused"] = True
    c["communication_data_type"] = "bf16"
    c["bf16"] = {"enabled": True}
    return c


def _fp32_master(which: str, engine, deepspeed) -> dict[str, torch.Tensor]:
    if which == "deepspeed":
        # a collective at stage 3 (every rank gathers)
        return {
            n: deepspeed.utils.safe_get_full_fp32_param(p).clone()
            for n, p in engine.module.named_parameters()
        }
    return {n: t.clone() for n, t in engine.engine.iter_full_state(torch.float32)}


def _train_fp32_master_case(which: str, stage: int, deepspeed) -> dict[str, dict]:
    """{"init": fp32 master, "trained": fp32 master after base.STEPS steps} of a model built in fp32."""
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = base.Net()
    cfg = fp32_master_config(stage)
    if which == "deepspeed":
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    else:
        import zerolaunch

        engine = zerolaunch.initialize(model, cfg, device="cpu")
    out = {"init": _fp32_master(which, engine, deepspeed)}
    for step in range(base.STEPS):
        x, y = base.batch(rank, step)
        loss = engine(x.bfloat16(), y.bfloat16())
        engine.backward(loss)
        engine.step()
    out["trained"] = _fp32_master(which, engine, deepspeed)
    return out


def _worker(rank: int, world_size: int, store_path: str, which: str, out: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store_path)
    deepspeed = _ds_ranks.init_deepspeed() if which == "deepspeed" else None
    results = {case: _train_case(which, *case, deepspeed) for case in CASES}
    for stage in FP32_MASTER_STAGES:
        results[("fp32-master", stage)] = _train_fp32_master_case(which, stage, deepspeed)
    _ds_ranks.finish(rank, results, out)


if __name__ == "__main__":
    _spawn.start_ranks(_worker, base.WORLD_SIZE, sys.argv[1], sys.argv[2])
