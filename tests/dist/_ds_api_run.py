"""One script that calls the engine methods of DeepSpeed's API, run by DeepSpeed and by zerolaunch.

    python tests/dist/_ds_api_run.py {deepspeed|zerolaunch} OUT.pt SAVE_ROOT

Spawns 2 CPU gloo ranks (FileStore rendezvous). For each case of CASES rank 0 records what the script saw:
get_lr() before training and after every step() (per case a DeepSpeed schedule over two groups with their own
lr: SCHEDULERS),
is_gradient_accumulation_boundary() before every micro-step (accumulation 2), then windows of 3 and 1
backwards set by set_gradient_accumulation_boundary (_set_boundary), train()/eval() on
module.training, local_rank / global_rank / world_size, the batch-size getters, global_steps, what no_sync()
does (entered, or the exception type; step() inside it), zero_grad() after each optimizer step, the final
weights, save_16bit_model's return value and file (SAVE_ROOT/<engine>/<case>/, and <case>_no_frozen/ with
exclude_frozen_parameters; fc1.bias is frozen), and a checkpoint saved with exclude_frozen_parameters
(<case>_ckpt/): the model tensors it holds, what a strict load_checkpoint does, and the weights after
load_module_strict=False once a further step moved them. Then "lists": WarmupLR with per-group lists for
warmup_min_lr / warmup_max_lr at stage 2 (LISTS): get_lr() after every step, the weights, and what a list of
the wrong length does (LISTS_WRONG_LENGTH). The net and the data
are _ds_parity_run.py's, the ranks and the DeepSpeed set-up _ds_ranks.py's. Needs deepspeed 0.19.8 for the
deepspeed side.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _ds_parity_run import Net, batch, model_parameters  # noqa: E402
from _ds_ranks import finish, init_deepspeed, init_rank  # noqa: E402
from _spawn import start_ranks  # noqa: E402

WORLD_SIZE = 2
MICRO_STEPS = 8  # 4 optimizer steps at accumulation 2
CASES = {"stage1": (1, True), "stage2": (2, True), "stage3": (3, True), "stage3_no_gather": (3, False)}
# one schedule per case, over the two param groups of the "groups" mode (lr 0.01 and 0.02). Stage 1: no
# warmup_max_lr, each group warms up to its own lr; stage 2: a warmup_max_lr, every group's peak (their own lrs
# ignored); stage 3: WarmupCosineLR, a ratio of each group's own lr; stage 3 no gather: WarmupDecayLR.
SCHEDULERS = {
    (1, True): {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_num_steps": 3}},
    (2, True): {
        "type": "WarmupLR",
        "params": {
            "warmup_min_lr": 0.001,
            "warmup_max_lr": 0.05,
            "warmup_num_steps": 3,
            "warmup_type": "linear",
        },
    },
    (3, True): {
        "type": "WarmupCosineLR",
        "params": {
            "total_num_steps": 4,
            "warmup_min_ratio": 0.1,
            "warmup_num_steps": 2,
            "cos_min_ratio": 0.01,
        },
    },
    (3, False): {
        "type": "WarmupDecayLR",
        "params": {
            "total_num_steps": 4,
            "warmup_min_lr": 0.001,
            "warmup_max_lr": 0.03,
            "warmup_num_steps": 2,
        },
    },
}


# DeepSpeed's per-group lists (_format_param: one value per param group, in the groups' order), over the same
# two groups at stage 2; LISTS_WRONG_LENGTH has 3 values for 2 groups: both engines refuse it.
LISTS = {
    "type": "WarmupLR",
    "params": {"warmup_min_lr": [0, 1e-4], "warmup_max_lr": [1e-2, 5e-3], "warmup_num_steps": 3},
}
LISTS_WRONG_LENGTH = {"type": "WarmupLR", "params": {"warmup_min_lr": [0, 1e-4, 0], "warmup_num_steps": 3}}


def config(stage: int, gather: bool, scheduler: dict | None = None) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 3,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1, "torch_adam": True}},
        "scheduler": scheduler or SCHEDULERS[stage, gather],
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 200,
            "allgather_bucket_size": 200,
            "stage3_param_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": gather,
        },
        "steps_per_print": 1000,
    }


def _error_name(fn) -> str:
    try:
        fn()
    except Exception as e:  # the type is what the script sees; recorded, compared by the test
        return type(e).__name__
    return "ok"


def _no_sync(engine) -> str:
    """What entering no_sync does; at stages 0/1 also what step() inside it does."""

    try:
        with engine.no_sync():
            inside = _error_name(engine.step)
    except Exception as e:
        return type(e).__name__
    return f"entered; step inside: {inside}"


def _set_boundary(engine, rank: int) -> list:
    """set_gradient_accumulation_boundary as DeepSpeed's docstring uses it: a window of 3 backwards with one
    step() after the last (False, then True before the last backward), then windows of 1 backward while it
    stays True. What is_gradient_accumulation_boundary() says before each backward, global_steps and get_lr()
    after each step()."""
    seen = []
    for window in (3, 1, 1):
        for micro in range(window):
            engine.set_gradient_accumulation_boundary(micro == window - 1)
            seen.append(engine.is_gradient_accumulation_boundary())
            engine.backward(engine(*batch(rank, 100 + len(seen))))
        engine.step()
        seen.append((engine.global_steps, engine.get_lr()))
    return seen


def _case(which: str, name: str, deepspeed, save_root: Path) -> dict:
    stage, gather = CASES[name]
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = Net()
    model.fc1.bias.requires_grad_(False)  # a frozen param, for exclude_frozen_parameters
    params = model_parameters(model, "groups")
    for group in params:
        group["params"] = [p for p in group["params"] if p.requires_grad]
    if which == "deepspeed":
        engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config(stage, gather))
    else:
        import zerolaunch

        engine = zerolaunch.initialize(model, config(stage, gather), device="cpu", model_parameters=params)
    seen: dict = {"no_sync": _no_sync(engine)}
    engine.eval()
    seen["training"] = [engine.module.training]
    engine.train()
    seen["training"].append(engine.module.training)
    seen["ids"] = (engine.local_rank, engine.global_rank, engine.world_size)
    seen["batch"] = (
        engine.gradient_accumulation_steps(),
        engine.train_micro_batch_size_per_gpu(),
        engine.train_batch_size(),
    )
    seen["lr"], seen["boundary"] = [engine.get_lr()], []
    for micro in range(MICRO_STEPS):
        seen["boundary"].append(engine.is_gradient_accumulation_boundary())
        loss = engine(*batch(rank, micro))
        engine.backward(loss)
        engine.step()
        seen["lr"].append(engine.get_lr())
        if seen["boundary"][-1]:
            engine.zero_grad()
    seen["global_steps"] = engine.global_steps
    seen["set_boundary"] = _set_boundary(engine, rank)
    folder = save_root / which / name
    seen["saved"] = engine.save_16bit_model(str(folder))
    seen["saved_no_frozen"] = engine.save_16bit_model(
        str(save_root / which / f"{name}_no_frozen"), exclude_frozen_parameters=True
    )
    ckpt = save_root / which / f"{name}_ckpt"
    engine.save_checkpoint(str(ckpt), exclude_frozen_parameters=True)
    seen["weights"] = _weights(which, engine, deepspeed, stage)
    if rank == 0:
        seen["checkpoint_names"] = _checkpoint_names(which, ckpt)
    # one more optimizer step moves the weights on; loading the checkpoint back must undo it
    engine.set_gradient_accumulation_boundary(True)
    engine.backward(engine(*batch(rank, 200)))
    engine.step()
    seen["strict_load"] = _error_name(lambda: engine.load_checkpoint(str(ckpt)))
    engine.load_checkpoint(str(ckpt), load_module_strict=False)
    seen["loaded"] = _weights(which, engine, deepspeed, stage)
    return seen


def _initialize(which: str, deepspeed, model, params, cfg: dict):
    if which == "deepspeed":
        return deepspeed.initialize(model=model, model_parameters=params, config=cfg)[0]
    import zerolaunch

    return zerolaunch.initialize(model, cfg, device="cpu", model_parameters=params)


def _lists_case(which: str, deepspeed) -> dict:
    """Per-group lists for warmup_min_lr / warmup_max_lr: get_lr() before training and after every step(),
    the weights after the 4 optimizer steps, and what a list of 3 values for the 2 groups does (the exception
    type; ours also its message)."""
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = Net()
    engine = _initialize(which, deepspeed, model, model_parameters(model, "groups"), config(2, True, LISTS))
    seen: dict = {"lr": [engine.get_lr()]}
    for micro in range(MICRO_STEPS):
        engine.backward(engine(*batch(rank, micro)))
        engine.step()
        seen["lr"].append(engine.get_lr())
    seen["weights"] = _weights(which, engine, deepspeed, 2)
    model = Net()
    try:
        _initialize(
            which, deepspeed, model, model_parameters(model, "groups"), config(2, True, LISTS_WRONG_LENGTH)
        )
        seen["wrong_length"] = ("ok", "")
    except Exception as e:  # recorded, compared by the test
        seen["wrong_length"] = (type(e).__name__, str(e))
    return seen


def _weights(which: str, engine, deepspeed, stage: int) -> dict:
    if which == "deepspeed":
        named = list(engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in named], enabled=stage == 3):
            return {n: p.detach().clone().float() for n, p in named}
    return {n: t.detach().clone().float() for n, t in engine.engine.iter_full_state()}


def _checkpoint_names(which: str, ckpt: Path) -> list[str]:
    """The model tensors a checkpoint saved: DeepSpeed's module state dict keys, zerolaunch's manifest
    params and replicated tensors (read as files, not through either engine's loader)."""
    folder = ckpt / (ckpt / "latest").read_text().strip()
    if which == "deepspeed":
        states = sorted(folder.glob("*model_states.pt"))
        return sorted(torch.load(states[0], map_location="cpu", weights_only=False)["module"])
    manifest = json.loads((folder / "manifest.json").read_text())
    return sorted({p["name"] for p in manifest["params"]} | {r["name"] for r in manifest["replicated"]})


def _worker(rank: int, world_size: int, store_path: str, which: str, out: str, save_root: str) -> None:
    init_rank(rank, world_size, store_path)
    deepspeed = init_deepspeed() if which == "deepspeed" else None
    results = {name: _case(which, name, deepspeed, Path(save_root)) for name in CASES}
    results["lists"] = _lists_case(which, deepspeed)
    finish(rank, results, out)


def main(which: str, out: str, save_root: str) -> None:
    start_ranks(_worker, WORLD_SIZE, which, out, save_root)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
