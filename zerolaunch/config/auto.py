"""Resolution of the train section: the batch rule, the values spelled twice, and "auto".

The recipe's `train.*` keys and the DeepSpeed block's keys are two spellings of one value (train.lr and
optimizer.params.lr, train.micro_batch_size and train_micro_batch_size_per_gpu, ...): either may be given,
both must agree, and a DeepSpeed "auto" takes the train value. The batch rule is DeepSpeed's:
global = micro * accum * world_size, any two derive the third. Hidden-size "auto" (bucket sizes) follows
Hugging Face. This module owns those rules; the engine options are assembled in config/engine_options.py.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .errors import RecipeError, dotted
from .monitors import resolve_monitors
from .schema import (
    COMPILE_BACKENDS,
    COMPILE_SCOPES,
    LR_SCHEDULES,
    PRECISIONS,
    TrainSection,
)
from .tree import MISSING, Path
from .values import AUTO, DS, Resolver

if TYPE_CHECKING:
    from zerolaunch.zero.options import EngineOptions

DEFAULTS = TrainSection()
T: Path = ("train",)


def solve_batch(
    micro: int | None, accum: int | None, global_: int | None, world_size: int
) -> tuple[int, int, int, set[str]]:
    """DeepSpeed's batch rule. Returns (micro, accum, global, names derived here); a mismatch is an error."""
    derived: set[str] = set()
    if micro is not None and accum is not None and global_ is not None:
        if micro * accum * world_size != global_:
            raise RecipeError(
                f"Batch sizes disagree: global_batch_size {global_} != micro_batch_size {micro} * "
                f"gradient_accumulation_steps {accum} * world_size {world_size} = {micro * accum * world_size}. "
                "Give any two of the three (the third is derived), or make them consistent."
            )
        return micro, accum, global_, derived
    if global_ is None:
        micro = DEFAULTS.micro_batch_size if micro is None else micro
        accum = 1 if accum is None else accum
        derived.add("global_batch_size")
        return micro, accum, micro * accum * world_size, derived
    if micro is None and accum is None:
        accum = 1
        derived.add("gradient_accumulation_steps")
    if micro is None:
        assert accum is not None
        per_rank, rest = divmod(global_, accum * world_size)
        if rest or per_rank < 1:
            raise RecipeError(
                f"global_batch_size {global_} is not divisible by gradient_accumulation_steps {accum} * "
                f"world_size {world_size} = {accum * world_size}, so no whole micro_batch_size exists. "
                f"Use a global batch that is a multiple of {accum * world_size}."
            )
        derived.add("micro_batch_size")
        return per_rank, accum, global_, derived
    steps, rest = divmod(global_, micro * world_size)
    if rest or steps < 1:
        raise RecipeError(
            f"global_batch_size {global_} is not divisible by micro_batch_size {micro} * world_size "
            f"{world_size} = {micro * world_size}, so no whole gradient_accumulation_steps exists. "
            f"Use a global batch that is a multiple of {micro * world_size}."
        )
    derived.add("gradient_accumulation_steps")
    return micro, steps, global_, derived


def spelled_twice(
    r: Resolver,
    name: str,
    ds_path: Path | None,
    kind: str,
    default: Any,
    engine_key: str | None = None,
    **limits: Any,
) -> tuple[Any, bool]:
    """train.<name> and its DeepSpeed spelling as one value; returns (value, given_by_user)."""
    train_path = T + (name,)
    if r.is_auto(train_path):
        raise r.fail(
            train_path,
            'is "auto"',
            f"Give a value: \"auto\" belongs in the DeepSpeed block, where it means 'take train.{name}'",
        )
    t_val = r.convert(train_path, r.raw(train_path), kind, **limits) if r.given(train_path) else None
    d_given = ds_path is not None and r.given(ds_path)
    d_val = r.convert(ds_path, r.raw(ds_path), kind, **limits) if d_given else None
    if t_val is not None and d_val is not None and t_val != d_val:
        raise RecipeError(
            f"`train.{name}` = {t_val!r} ({r.where(train_path)}) and `{r.tree.key(ds_path)}` = {d_val!r} "
            f"({r.where(ds_path)}) are two spellings of the same value and disagree. Keep one of them, or make "
            "them equal."
        )
    if t_val is not None:
        value, origin, note = t_val, r.tree.origin(train_path), None
        r.paths[f"train.{name}"] = train_path
    elif d_val is not None:
        value, origin, note = d_val, r.tree.origin(ds_path), f"from {dotted(ds_path)}"
        r.paths[f"train.{name}"] = ds_path
    else:
        value, origin, note = default, "default", None
    r.record(f"train.{name}", origin, note)
    if engine_key is not None:
        if f"train.{name}" in r.paths:
            r.paths[engine_key] = r.paths[f"train.{name}"]
        if ds_path is not None and r.is_auto(ds_path):
            r.record(engine_key, "auto", f"auto: {dotted(ds_path)} = train.{name}")
        elif d_val is not None:
            r.record(engine_key, r.tree.origin(ds_path))
        else:
            r.record(engine_key, "derived" if origin != "default" else "default", f"from train.{name}")
    return value, t_val is not None or d_val is not None


def resolve_precision(r: Resolver) -> str:
    flags: dict[str, Any] = {}
    for dtype in ("bf16", "fp16"):
        path = DS + (dtype, "enabled")
        raw = r.raw(path)
        flags[dtype] = raw if raw in (MISSING, AUTO) else r.convert(path, raw, "bool")
    if flags["bf16"] is True and flags["fp16"] is True:
        raise RecipeError(
            f"fp16 and bf16 are both enabled ({r.where(DS + ('bf16', 'enabled'))}; "
            f"{r.where(DS + ('fp16', 'enabled'))}). Enable one of them (or set train.precision)."
        )
    chosen = next((d for d in ("bf16", "fp16") if flags[d] is True), None)
    path = T + ("precision",)
    if r.given(path):
        precision = r.convert(path, r.raw(path), "choice", choices=PRECISIONS)
        for dtype, flag in flags.items():
            if (flag is True and precision != dtype) or (flag is False and precision == dtype):
                raise RecipeError(
                    f"`train.precision` = {precision!r} ({r.where(path)}) disagrees with "
                    f"`deepspeed.{dtype}.enabled` = {str(flag).lower()} ({r.where(DS + (dtype, 'enabled'))}). "
                    f'Keep one of them, or set {dtype}.enabled to "auto".'
                )
        r.record("train.precision", r.tree.origin(path))
        r.paths["engine.precision.dtype"] = path
    elif chosen is not None:
        precision = chosen
        r.paths["engine.precision.dtype"] = DS + (chosen, "enabled")
        r.record(
            "train.precision", r.tree.origin(DS + (chosen, "enabled")), f"from deepspeed.{chosen}.enabled"
        )
    else:
        precision = DEFAULTS.precision
        r.record("train.precision", "default")
    autos = [d for d, flag in flags.items() if flag == AUTO]
    if autos:
        r.record("engine.precision.dtype", "auto", f"auto: {'/'.join(autos)}.enabled from train.precision")
    elif chosen is not None:
        r.record("engine.precision.dtype", r.tree.origin(DS + (chosen, "enabled")))
    else:
        r.record("engine.precision.dtype", "derived", "from train.precision")
    return precision


def resolve_batch(r: Resolver) -> tuple[int, int, int]:
    spellings = {
        "micro_batch_size": DS + ("train_micro_batch_size_per_gpu",),
        "gradient_accumulation_steps": DS + ("gradient_accumulation_steps",),
        "global_batch_size": DS + ("train_batch_size",),
    }
    given: dict[str, int | None] = {}
    for name, ds_path in spellings.items():
        value, was_given = spelled_twice(r, name, ds_path, "int", None, min=1)
        given[name] = value if was_given else None
    micro, accum, global_, derived = solve_batch(
        given["micro_batch_size"],
        given["gradient_accumulation_steps"],
        given["global_batch_size"],
        r.world_size,
    )
    for name in derived:
        r.record(
            f"train.{name}", "derived", f"batch rule: global = micro * accum * world_size ({r.world_size})"
        )
    if "train.gradient_accumulation_steps" in r.paths:
        r.paths["engine.gradient_accumulation_steps"] = r.paths["train.gradient_accumulation_steps"]
    accum_ds = spellings["gradient_accumulation_steps"]
    if r.is_auto(accum_ds):
        r.record("engine.gradient_accumulation_steps", "auto", "auto: = train.gradient_accumulation_steps")
    else:
        r.record("engine.gradient_accumulation_steps", "derived", "from train.gradient_accumulation_steps")
    return micro, accum, global_


def check_compile_scope(r: Resolver, train: TrainSection, engine: EngineOptions) -> None:
    """train.compile_scope: model traces the whole forward into one graph, so module hooks that must run
    eagerly inside it cannot: stage 3's gather / free hooks, overlap_step's publish hooks. Stage 3 registers
    none where every unit aliases what it holds (world size 1: [Note: hook-free forward] in
    zero/stage3/schedule.py); the loop checks the built engine agrees (train/loop.py)."""
    if not train.compile or train.compile_scope != "model":
        return
    path = T + ("compile_scope",)
    if engine.zero.stage == 3 and not stage3_forward_is_hook_free(engine, r.world_size):
        raise r.fail(
            path,
            "is model (the whole forward as one graph), but ZeRO stage 3 gathers each unit from hooks inside "
            "the forward (world size 1 without offload_param and with the master in the compute dtype, or "
            "the optimizer offloaded, is the exception: nothing to gather)",
            "Use train.compile_scope: blocks (the default) with stage 3",
        )
    if engine.zero.offload_optimizer.overlap_step:
        raise r.fail(
            path,
            "is model (the whole forward as one graph), but offload_optimizer.overlap_step publishes each "
            "module's params from hooks inside the forward",
            "Use train.compile_scope: blocks, or turn overlap_step off",
        )


def stage3_forward_is_hook_free(engine: EngineOptions, world_size: int) -> bool:
    """Whether the plan lets every stage-3 unit alias its source at this world size, so that the engine runs
    the forward without hooks (zero/plan.py aliases_gathered; by names, no torch)."""
    from zerolaunch.zero import plan

    zero, precision = engine.zero, engine.precision
    return plan.aliases_gathered(
        world_size,
        zero.offload_param.device,
        plan.gathers_from_master(zero.offload_optimizer.device, zero.offload_param.device),
        precision.dtype,
        precision.master_dtype,
    )


def resolve_compile_optimizer(
    r: Resolver, train: TrainSection, engine: EngineOptions
) -> tuple[TrainSection, EngineOptions]:
    """train.compile_optimizer -> engine.optimizer.fused_step ([Note: fused step], zero/optim/fused_step.py),
    read once the engine options are built: its default depends on them. On by default with train.compile
    and the inductor backend (the run compiles anyway: a few seconds more buy about 1% of a compiled step) where the optimizer can run fused (zero/option_rules.py why_not_fused);
    off otherwise, so an eager run never starts compiling unasked. Set true where it cannot run: the engine's
    rule names why, at the key's line."""
    from zerolaunch.config.engine_options import check_engine_options
    from zerolaunch.zero.option_rules import why_not_fused

    blocker = why_not_fused(engine)
    compiling = train.compile and train.compile_backend == "inductor"
    if compiling and blocker is None:
        note = "on with train.compile: each chunk's AdamW and param write as one kernel"
    elif compiling:
        note = f"off: {blocker[0]}"
    else:
        note = "on by default only with train.compile (inductor)"
    path = T + ("compile_optimizer",)
    default = compiling and blocker is None
    on = r.value("train.compile_optimizer", path, "bool", default, default_note=note)
    r.record("engine.optimizer.fused_step", r.origins["train.compile_optimizer"], "= train.compile_optimizer")
    if r.given(path):
        r.paths["engine.optimizer.fused_step"] = path
    engine = dataclasses.replace(engine, optimizer=dataclasses.replace(engine.optimizer, fused_step=on))
    check_engine_options(r, engine)
    return dataclasses.replace(train, compile_optimizer=on), engine


def resolve_train(
    r: Resolver, source_stem: str | None, has_ds_scheduler: bool, optimizer: str | None
) -> TrainSection:
    precision = resolve_precision(r)
    micro, accum, global_ = resolve_batch(r)
    opt = DS + ("optimizer", "params")
    lr, _ = spelled_twice(r, "lr", opt + ("lr",), "float", DEFAULTS.lr, "engine.optimizer.lr", gt=0)
    adam_like = optimizer in (None, "adam", "adamw")
    weight_decay, _ = spelled_twice(
        r,
        "weight_decay",
        opt + ("weight_decay",),
        "float",
        DEFAULTS.weight_decay,
        "engine.optimizer.weight_decay",
        min=0,
    )
    # DeepSpeed's rule where the run is DeepSpeed's (a bare ds_config, or a script calling initialize()).
    ds_groups = r.tree.bare_deepspeed or r.tree.has(("entrypoint",))
    weight_decay_1d = r.value(
        "train.weight_decay_1d",
        T + ("weight_decay_1d",),
        "bool",
        ds_groups,
        default_note="DeepSpeed's: every param decayed" if ds_groups else "no decay on 1-D params",
    )
    betas, _ = spelled_twice(
        r, "betas", opt + ("betas",) if adam_like else None, "betas", DEFAULTS.betas, "engine.optimizer.betas"
    )
    eps, _ = spelled_twice(
        r, "eps", opt + ("eps",) if adam_like else None, "float", DEFAULTS.eps, "engine.optimizer.eps", gt=0
    )
    clip, _ = spelled_twice(
        r,
        "gradient_clipping",
        DS + ("gradient_clipping",),
        "float",
        DEFAULTS.gradient_clipping,
        "engine.gradient_clipping",  # its limit is the engine's rule (zero/option_rules.py)
    )
    warmup_ds = DS + ("scheduler", "params", "warmup_num_steps") if has_ds_scheduler else None
    # DeepSpeed's warmup schedulers default to 1000 warmup steps when the key is absent ("auto" = train's).
    ds_default = warmup_ds is not None and r.raw(warmup_ds) is MISSING
    warmup, warmup_given = spelled_twice(
        r, "warmup_steps", warmup_ds, "int", 1000 if ds_default else 0, min=0
    )
    steps = r.value("train.steps", T + ("steps",), "int", DEFAULTS.steps, min=1)
    if has_ds_scheduler and r.given(T + ("lr_schedule",)):
        path = T + ("lr_schedule",)
        raise RecipeError(
            f"`train.lr_schedule` ({r.where(path)}) and `deepspeed.scheduler` "
            f"({r.where(DS + ('scheduler',))}) both choose the schedule. Keep one of them."
        )
    # A DeepSpeed block without a scheduler keeps the lr constant, as DeepSpeed does.
    # A block made only by --set keeps zerolaunch's defaults: `--set zero_optimization.x=...` must not
    # silently drop the stage to DeepSpeed's 0.
    has_ds = isinstance(r.raw(DS), dict) and r.tree.from_file(DS)
    if has_ds_scheduler:
        # the row's value is not what runs: say what does, not that there is no scheduler
        ds_type = r.raw(DS + ("scheduler", "type"))
        named = f" ({ds_type})" if isinstance(ds_type, str) else ""
        schedule_note = f"not used: deepspeed.scheduler{named} sets the schedule"
    else:
        schedule_note = "DeepSpeed's default: no scheduler" if has_ds else None
    lr_schedule = r.value(
        "train.lr_schedule",
        T + ("lr_schedule",),
        "choice",
        "constant" if has_ds else DEFAULTS.lr_schedule,
        choices=LR_SCHEDULES,
        default_note=schedule_note,
    )
    if warmup > steps:
        # Allowed, as DeepSpeed allows it (WarmupLR has no total; the others only warn): the run simply
        # ends while the lr is still rising. Shown on the row so it is not a surprise.
        why = (
            "DeepSpeed's default when warmup_num_steps is absent; " if ds_default and not warmup_given else ""
        )
        r.notes["train.warmup_steps"] = (
            f"{why}longer than train.steps {steps}: the run ends during warmup, before the peak lr"
        )
    compile_on = r.value("train.compile", T + ("compile",), "bool", False)
    compile_backend = r.value(
        "train.compile_backend",
        T + ("compile_backend",),
        "choice",
        DEFAULTS.compile_backend,
        choices=COMPILE_BACKENDS,
    )
    compile_scope = r.value(
        "train.compile_scope",
        T + ("compile_scope",),
        "choice",
        DEFAULTS.compile_scope,
        choices=COMPILE_SCOPES,
    )
    for key in ("compile_backend", "compile_scope"):
        if r.given(T + (key,)) and not compile_on:
            raise r.fail(
                T + (key,),
                "is set but train.compile is false, so it would do nothing",
                f"Set train.compile: true, or remove train.{key}",
            )
    stem = source_stem or "default"
    run_dir = r.value(
        "train.run_dir", T + ("run_dir",), "str", f"runs/{stem}", default_note="runs/<recipe name>"
    )
    return TrainSection(
        steps=steps,
        micro_batch_size=micro,
        gradient_accumulation_steps=accum,
        global_batch_size=global_,
        lr=lr,
        weight_decay=weight_decay,
        weight_decay_1d=weight_decay_1d,
        betas=betas,
        eps=eps,
        gradient_clipping=clip,
        warmup_steps=warmup,
        lr_schedule=lr_schedule,
        seed=r.value("train.seed", T + ("seed",), "int", DEFAULTS.seed, min=0),
        precision=precision,
        log_every=r.value("train.log_every", T + ("log_every",), "int", DEFAULTS.log_every, min=1),
        run_dir=run_dir,
        activation_checkpointing=r.value(
            "train.activation_checkpointing", T + ("activation_checkpointing",), "bool", False
        ),
        activation_offload=r.value("train.activation_offload", T + ("activation_offload",), "bool", False),
        compile=compile_on,
        compile_backend=compile_backend,
        compile_scope=compile_scope,
        max_nonfinite_steps=r.value(
            "train.max_nonfinite_steps",
            T + ("max_nonfinite_steps",),
            "int",
            DEFAULTS.max_nonfinite_steps,
            min=0,
        ),
        eval_every=r.value("train.eval_every", T + ("eval_every",), "int", 0, default_note="never", min=0),
        eval_batches=r.value(
            "train.eval_batches", T + ("eval_batches",), "int", DEFAULTS.eval_batches, min=1
        ),
        monitors=resolve_monitors(r, run_dir),
    )
