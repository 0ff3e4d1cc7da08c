"""The recipe's shape: frozen section dataclasses, their documented fields, and the resolved-JSON round trip.

This module owns what a *resolved* recipe is (every value concrete, no "auto") and how it is written to and
read back from `recipe.resolved.json`. It does not read user files, apply --set or resolve anything (load.py,
auto.py), and it holds no DeepSpeed vocabulary (deepspeed.py). The engine options themselves live in
`zerolaunch.zero.options`; they are imported lazily because importing `zerolaunch.zero` imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import RecipeError

if TYPE_CHECKING:
    from zerolaunch.zero.options import EngineOptions

RESOLVED_FORMAT = "zerolaunch.recipe.resolved/1"

DEFAULT_MODEL_BUILDER = "zerolaunch.models.gpt:build"
DEFAULT_DATA_BUILDER = "zerolaunch.data.synthetic:build"
PRECISIONS = ("fp32", "bf16", "fp16")
LR_SCHEDULES = ("cosine", "constant")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
"""torch.compile backends train.compile_backend accepts: inductor (the fast one), aot_eager and eager (no
code generation: for debugging a compile problem, and for CPU tests)."""
COMPILE_SCOPES = ("blocks", "model")
"""What train.compile compiles: each repeated block's forward (every stage), or the model's whole forward
as one graph, loss included (stages 0-2 without overlap_step: faster, more activation memory)."""


@dataclass(frozen=True)
class ModelSection:
    builder: str = DEFAULT_MODEL_BUILDER
    """"pkg.module:fn" or "path/to/file.py:fn" (relative to the recipe), called fn(**args) -> nn.Module."""
    args: dict[str, Any] = field(default_factory=lambda: {"size": "tiny"})
    """Keyword arguments of the model builder."""
    init_from: str | None = None
    """Initial weights: safetensors, torch state dict, or a zerolaunch / DeepSpeed checkpoint folder."""


PREFETCH_MODES = ("auto", "thread", "process")
"""`data.prefetch`: where batches are made ahead of the step (auto = process on CUDA, thread on the CPU;
train/batches.py prefetch_mode)."""


@dataclass(frozen=True)
class DataSection:
    builder: str = DEFAULT_DATA_BUILDER
    """Called fn(rank=, world_size=, micro_batch_size=, seed=, **args) -> iterable of batches."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the data builder."""
    prefetch: str = "auto"
    """Where batches are made ahead of the step: "thread", "process" (one forked worker, no GIL shared with
    the training thread) or "auto" (process on CUDA, thread on the CPU); train/batches.py prefetch_mode."""
    eval: dict[str, Any] = field(default_factory=dict)
    """Validation data: args that replace data.args for the eval stream, e.g. {path: DIR} (a second prepared
    folder) or {split: eval} (data.args.holdout's held-out windows); empty = no validation."""
    allow_change: bool = False
    """Resume on other data than the checkpoint was trained on (another folder, seed, seq_len, args): refused
    unless true; then the change is noted in metrics.jsonl at the resumed step (data/identity.py)."""


@dataclass(frozen=True)
class TrainSection:
    steps: int = 100
    """Optimizer steps to run."""
    micro_batch_size: int = 4
    """Samples per rank per forward/backward (DeepSpeed: train_micro_batch_size_per_gpu)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step (DeepSpeed: gradient_accumulation_steps)."""
    global_batch_size: int = 4
    """Samples per optimizer step = micro * accum * world_size (DeepSpeed: train_batch_size)."""
    lr: float = 3e-4
    """Peak learning rate (DeepSpeed: optimizer.params.lr)."""
    weight_decay: float = 0.0
    """Decoupled weight decay of AdamW (DeepSpeed: optimizer.params.weight_decay)."""
    weight_decay_1d: bool = False
    """Decay 1-D params (biases, norm gains) too. false: the built-in loop's rule (nanoGPT's split); true:
    DeepSpeed's, every param of model.parameters() decayed (the default for a bare DeepSpeed config and for
    an entrypoint script; a script's own model_parameters groups replace both)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas (DeepSpeed: optimizer.params.betas)."""
    eps: float = 1e-8
    """Adam epsilon (DeepSpeed: optimizer.params.eps)."""
    gradient_clipping: float = 1.0
    """Clip the global grad norm to this; 0 = off (DeepSpeed: gradient_clipping, default 1.0)."""
    warmup_steps: int = 0
    """Linear warmup steps (DeepSpeed: scheduler.params.warmup_num_steps)."""
    lr_schedule: str = "cosine"
    """cosine (warmup then cosine decay over `steps`) or constant (warmup then flat); a DeepSpeed scheduler
    block replaces it."""
    seed: int = 1234
    """Seed of model init, data order and dropout (each rank offsets its data seed by its rank)."""
    precision: str = "fp32"
    """fp32, bf16 or fp16 (DeepSpeed: bf16.enabled / fp16.enabled)."""
    log_every: int = 10
    """Print a progress line every N optimizer steps (DeepSpeed: steps_per_print)."""
    run_dir: str = "runs/default"
    """Where the run writes recipe.resolved.json, metrics.jsonl and logs (relative to the working dir)."""
    activation_checkpointing: bool = False
    """Recompute each repeated block's activations in backward (saves memory, costs ~1/3 more compute)."""
    activation_offload: bool = False
    """Keep the activations saved for backward in pinned host memory, copied out on a side stream as forward
    runs and back ahead of backward (CUDA; a CPU run keeps them where they are and says so)."""
    compile: bool = False
    """torch.compile each repeated block (the stage 3 units: a transformer's layers) in place, at every
    stage; the first step includes the compile time (reported when it ends)."""
    compile_backend: str = "inductor"
    """torch.compile backend for train.compile: inductor, aot_eager or eager."""
    compile_scope: str = "blocks"
    """What train.compile compiles: blocks (each repeated block's forward) or model (the whole forward)."""
    compile_optimizer: bool = False
    """Adam / AdamW's step and the param write as one compiled kernel per chunk (engine.optimizer.fused_step);
    when absent, on with train.compile (inductor) unless the optimizer is SGD or offloaded."""
    max_nonfinite_steps: int = 3
    """Stop the run (exit code 3) after this many optimizer steps in a row with a non-finite loss or grad
    norm; each such step is skipped, not applied. 0 = never stop (the steps are still skipped)."""
    eval_every: int = 0
    """Evaluate on data.eval every N optimizer steps (and after the last); 0 = never."""
    eval_batches: int = 20
    """Micro-batches per rank in one evaluation (the same ones every time)."""
    monitors: dict[str, dict] = field(default_factory=dict)
    """Monitors rank 0 writes besides metrics.jsonl, from the DeepSpeed blocks tensorboard / csv_monitor /
    wandb (config/monitors.py): {"csv_monitor": {"dir": ...}, "tensorboard": {"dir": ...}, "wandb": {...}}."""


@dataclass(frozen=True)
class CheckpointSection:
    dir: str | None = None
    """Checkpoint root; default run_dir/checkpoints."""
    every: int = 0
    """Save every N optimizer steps; 0 = only at the end of the run."""
    keep: int = 3
    """Keep the newest N checkpoints; 0 = keep all."""
    keep_best: str | None = None
    """"eval_loss": also keep the checkpoint of the lowest eval loss (saved when a new best is measured)."""


PEFT_BIASES = ("none", "all", "lora_only")
"""LoraConfig's `bias` choices: which biases train beside the adapter."""


@dataclass(frozen=True)
class PeftSection:
    """A LoRA adapter over the model (PEFT's LoraConfig, the same field names), applied with
    peft.get_peft_model before the engine wraps the model: only the adapter (and modules_to_save) trains."""

    r: int = 8
    """LoRA rank."""
    lora_alpha: float = 8
    """Scaling numerator: the update is (alpha / r) * B @ A."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] | str | None = None
    """Module names to adapt (a name matches a module whose name ends in it), "all-linear" (every linear
    layer but the output head), or None: PEFT's default for the model type."""
    bias: str = "none"
    """Biases that train: none, all, or lora_only (those of the adapted layers)."""
    modules_to_save: tuple[str, ...] = ()
    """Modules trained in full beside the adapter and saved with it (e.g. lm_head)."""


SECTION_CLASSES: dict[str, type] = {
    "model": ModelSection,
    "data": DataSection,
    "train": TrainSection,
    "checkpoint": CheckpointSection,
    "peft": PeftSection,
}
TOP_LEVEL_KEYS = ("model", "data", "train", "checkpoint", "entrypoint", "deepspeed", "peft")


def section_keys(section: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(SECTION_CLASSES[section]))


@dataclass(frozen=True)
class Recipe:
    model: ModelSection
    data: DataSection
    train: TrainSection
    checkpoint: CheckpointSection
    engine: EngineOptions
    entrypoint: str | None = None
    """A user script run in each worker instead of the built-in loop (absolute path once resolved)."""
    origins: dict[str, str] = field(default_factory=dict)
    """Dotted key -> where its value came from: default, file, --set, auto or derived."""
    notes: dict[str, str] = field(default_factory=dict)
    """Dotted key -> how it was resolved, or why an accepted DeepSpeed key does nothing here."""
    source: str | None = None
    """The recipe file (None for a recipe given as a dict)."""
    base_dir: str = "."
    """Folder that relative builder paths are resolved against (the recipe's folder)."""
    peft: PeftSection | None = None
    """The `peft:` block: a LoRA adapter trained over the frozen model (None: every weight trains)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON-able form written as run_dir/recipe.resolved.json (lists for tuples)."""
        return {
            "format": RESOLVED_FORMAT,
            "source": self.source,
            "base_dir": self.base_dir,
            "model": _plain(dataclasses.asdict(self.model)),
            "data": _plain(dataclasses.asdict(self.data)),
            "train": _plain(dataclasses.asdict(self.train)),
            "checkpoint": _plain(dataclasses.asdict(self.checkpoint)),
            "entrypoint": self.entrypoint,
            "engine": _plain(dataclasses.asdict(self.engine)),
            "peft": None if self.peft is None else _plain(dataclasses.asdict(self.peft)),
            "origins": dict(self.origins),
            "notes": dict(self.notes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "recipe.resolved.json") -> Recipe:
        """Rebuild a resolved recipe exactly (no re-resolution), as the worker does."""
        if not isinstance(data, dict) or data.get("format") != RESOLVED_FORMAT:
            raise RecipeError(
                f"{where} is not a resolved zerolaunch recipe (no `format: {RESOLVED_FORMAT}`). Pass the "
                "recipe.resolved.json that `zerolaunch train` wrote into the run dir."
            )
        try:
            train = dict(data["train"])
            train["betas"] = tuple(train["betas"])
            return cls(
                model=ModelSection(**data["model"]),
                data=DataSection(**data["data"]),
                train=TrainSection(**train),
                checkpoint=CheckpointSection(**data["checkpoint"]),
                engine=engine_from_json(data["engine"]),
                entrypoint=data.get("entrypoint"),
                origins=dict(data.get("origins", {})),
                notes=dict(data.get("notes", {})),
                source=data.get("source"),
                base_dir=data.get("base_dir", "."),
                peft=peft_from_json(data.get("peft")),
            )
        except (KeyError, TypeError) as exc:
            raise RecipeError(
                f"{where} does not match this zerolaunch version's recipe fields ({exc}). Re-create it with "
                "`zerolaunch train` (or `zerolaunch recipe show --write`) from the original recipe."
            ) from None


def peft_from_json(data: dict[str, Any] | None) -> PeftSection | None:
    if data is None:
        return None
    fields = dict(data)
    if isinstance(fields.get("target_modules"), list):
        fields["target_modules"] = tuple(fields["target_modules"])
    fields["modules_to_save"] = tuple(fields.get("modules_to_save", ()))
    return PeftSection(**fields)


def engine_from_json(data: dict[str, Any]) -> EngineOptions:
    from zerolaunch.zero.options import (
        EngineOptions,
        OffloadOptions,
        OptimizerOptions,
        PrecisionOptions,
        SchedulerOptions,
        ZeroOptions,
    )

    zero = dict(data["zero"])
    # fields the engine never read, written by earlier versions: such a file still loads
    for gone in ("allgather_bucket_size", "contiguous_gradients"):
        zero.pop(gone, None)
    zero["offload_optimizer"] = OffloadOptions(**zero["offload_optimizer"])
    zero["offload_param"] = OffloadOptions(**zero["offload_param"])
    zero["stage3_units"] = tuple(zero["stage3_units"])
    optimizer = dict(data["optimizer"])
    optimizer["betas"] = tuple(optimizer["betas"])
    scheduler = dict(data["scheduler"])
    for key in ("warmup_min_lr", "warmup_max_lr"):  # a per-group list is a tuple, as load.py resolves it
        if isinstance(scheduler.get(key), list):
            scheduler[key] = tuple(scheduler[key])
    rest = {k: v for k, v in data.items() if k not in ("zero", "precision", "optimizer", "scheduler")}
    return EngineOptions(
        zero=ZeroOptions(**zero),
        precision=PrecisionOptions(**data["precision"]),
        optimizer=OptimizerOptions(**optimizer),
        scheduler=SchedulerOptions(**scheduler),
        **rest,
    )


def _plain(value: Any) -> Any:
    """Tuples -> lists, recursively, so a JSON round trip compares equal."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def flat_items(recipe: Recipe) -> list[tuple[str, Any]]:
    """(dotted key, value) for every leaf the table shows; the keys of `Recipe.origins`."""
    data = recipe.to_json()
    items: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any, expand: bool) -> None:
        if isinstance(value, dict) and value and expand:
            for key, sub in value.items():
                walk(f"{prefix}.{key}", sub, expand=True)
        else:
            items.append((prefix, value))

    for section in ("model", "data", "train", "checkpoint"):
        walk(section, data[section], expand=True)
    items.append(("entrypoint", data["entrypoint"]))
    walk("engine", data["engine"], expand=True)
    if data["peft"] is not None:
        for key, value in data["peft"].items():
            items.append((f"peft.{key}", value))
    return items
