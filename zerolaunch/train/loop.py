"""The built-in training loop of one worker: build, wrap with the ZeRO engine, step, report, checkpoint.

Per optimizer step: for each of `gradient_accumulation_steps` micro-batches, `out = engine(**batch)`,
`engine.backward(loss)`, `engine.step()`; then the step's mean loss over micro-batches and ranks is reduced
with one small all-reduce queued on the device (with the labelled-token count of loss_norm.py, the loop's
only collectives; the engine's go through zero/comm.py) and rank 0 reports it one step later, while the next
step runs ([Note: deferred step reads] in train_step, step_stats.py). Validation is evaluate.py's, called
at `train.eval_every`. Owns the order of things, not their details (batches.py, checkpointing.py,
reporting.py, seeding.py, step_stats.py): `Trainer.__init__` builds the components, `train_step(step)` runs
one optimizer step, `finish()` writes the final checkpoint and the end-of-run table, and `run_training` only
sequences them (as torchtitan's trainer does).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from zerolaunch.build import build_engine
from zerolaunch.checkpoint.save import nothing_to_do
from zerolaunch.config import import_builder
from zerolaunch.data.identity import changes_record, describe_changes
from zerolaunch.models.compiling import compile_for
from zerolaunch.models.hf import unit_class_names
from zerolaunch.models.peft import apply_peft, saved_unit_problem
from zerolaunch.report.mfu import hf_flops_per_token
from zerolaunch.report.monitors import Monitors
from zerolaunch.train import seeding, step_stats
from zerolaunch.train.activation_offload import offload_activations
from zerolaunch.train.batches import (
    BatchSource,
    PrefetchingSource,
    build_data,
    build_model,
    forward,
    loss_of,
    prefetch_mode,
    tokens_in,
)
from zerolaunch.train.checkpointing import CheckpointHook
from zerolaunch.train.context import RunContext
from zerolaunch.train.evaluate import Evaluator
from zerolaunch.train.init_weights import attach_initial_weights, load_initial_weights, safetensors_files
from zerolaunch.train.loss_norm import GlobalLossNorm, check_label_shift
from zerolaunch.train.nonfinite import NonFiniteGuard
from zerolaunch.train.reporting import StepReporter
from zerolaunch.util.errors import TrainError, UserError
from zerolaunch.zero.protocol import StepInfo


def _memory_now(engine, device: torch.device) -> dict:
    mem = dict(engine.memory_bytes())
    if device.type == "cuda":
        mem["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        mem["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        mem["device_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return mem


def _flops_per_token(model, seq_len: int | None) -> float | None:
    if seq_len is None:
        return None
    fn = getattr(model, "flops_per_token", None)
    if fn is not None:
        return float(fn(seq_len))
    # a Hugging Face model: count from its config (None, so MFU "n/a", for shapes the count does not know)
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    if to_dict is None:
        return None
    flops = hf_flops_per_token(to_dict(), seq_len)
    return None if flops is None else float(flops)


def _with_meta_arg(recipe):
    """The recipe with `meta=True` in model.args when the builder names a meta argument (`fn.meta_arg`, the
    HF builder: it builds on the meta device itself and attaches the init that loads its weights)."""
    fn = import_builder(recipe.model.builder, recipe.base_dir)
    arg = getattr(fn, "meta_arg", None)
    if arg is None or arg in recipe.model.args:
        return recipe
    return replace(recipe, model=replace(recipe.model, args={**recipe.model.args, arg: True}))


def _check_saved_units(model, recipe) -> None:
    units = recipe.engine.zero.stage3_units or unit_class_names(model.get_base_model())
    problem = saved_unit_problem(model, set(units))
    if problem is not None:
        raise UserError(f"{recipe.source or 'the recipe'}: {problem}")


def _builds_hf_on_meta(recipe) -> bool:
    """The builder builds on meta itself and names its meta argument (the HF builder)."""
    fn = import_builder(recipe.model.builder, recipe.base_dir)
    return getattr(fn, "meta_arg", None) is not None


def _streamed_init_from(recipe):
    """{tensor name: file} of model.init_from when the stage-3 engine can read it unit by unit: safetensors
    weights and a builder that builds on meta itself (the HF builder's meta_arg); else None."""
    if recipe.engine.zero.stage != 3 or not recipe.model.init_from:
        return None
    fn = import_builder(recipe.model.builder, recipe.base_dir)
    if getattr(fn, "meta_arg", None) is None:
        return None
    return safetensors_files(recipe.model.init_from)


def build_train_model(recipe, *, verify_checkpoints: bool = True) -> torch.nn.Module:
    """The model `zerolaunch train` hands its engine, before train.compile: built on the meta device where the
    stage-3 engine initialises it unit by unit, init_from's weights attached or loaded, the `peft:` adapter,
    activation checkpointing. estimate-memory --measure builds through it too, so it measures this model."""
    # weights to load need real tensors: meta construction only when the engine will initialise them,
    # from the builder's init or, for an HF model, from init_from's safetensors a unit at a time. A PEFT
    # adapter goes on meta only over an HF model (models/hf.py meta_init_fn: HF's init or the files for
    # the base, PEFT's for the adapter); another builder's reset_parameters() would redraw LoRA's B
    peft_on_meta = recipe.peft is None or _builds_hf_on_meta(recipe)
    streamed = _streamed_init_from(recipe) if peft_on_meta else None
    on_meta = (
        recipe.engine.zero.stage == 3
        and peft_on_meta
        and (not recipe.model.init_from or streamed is not None)
    )
    model = build_model(_with_meta_arg(recipe) if on_meta else recipe, meta_if_supported=on_meta)
    if streamed is not None:
        attach_initial_weights(model, streamed, recipe.model.init_from)
    elif recipe.model.init_from:
        load_initial_weights(model, recipe.model.init_from, verify=verify_checkpoints)
    if recipe.peft is not None:
        model = apply_peft(model, recipe.peft, where=recipe.source or "the recipe")
        if on_meta and recipe.peft.modules_to_save:
            _check_saved_units(model, recipe)
    if recipe.train.activation_checkpointing:
        enable = getattr(model, "enable_activation_checkpointing", None)
        if enable is None:
            raise TrainError(
                f"train.activation_checkpointing is on but the model from {recipe.model.builder!r} has "
                "no enable_activation_checkpointing(); add one, or apply torch.utils.checkpoint in the model"
            )
        enable()
    return model


class Trainer:
    """One worker's training run: the components `run_training` sequences (built in __init__)."""

    def __init__(self, recipe, ctx: RunContext):
        self.recipe, self.ctx = recipe, ctx
        self.gas = recipe.engine.gradient_accumulation_steps
        seeding.seed_all(recipe.train.seed, ctx.device)
        self.model = model = self._build_model()
        self.params_numel = sum(
            p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()
        )
        self.engine = build_engine(model, recipe.engine, group=ctx.group, device=ctx.device)
        self._check_whole_forward_compile()
        self.offload_activations = recipe.train.activation_offload and ctx.device.type == "cuda"
        if recipe.train.activation_offload and not self.offload_activations and ctx.is_rank0:
            print(
                f"train.activation_offload: the run is on the {ctx.device.type}, where activations already "
                "live in host memory; nothing is offloaded",
                flush=True,
            )
        # batches drawn, pinned and copied ahead of the step; the checkpoint counts the consumed ones
        self.source = PrefetchingSource(
            BatchSource(
                build_data(recipe, ctx.rank, ctx.world_size),
                recipe.data.builder,
                micro_batches_per_step=recipe.engine.gradient_accumulation_steps,
                steps=recipe.train.steps,
            ),
            ctx.device,
            mode=prefetch_mode(recipe.data.prefetch, ctx.device),
        )
        check_label_shift(self.source.source.data, model, recipe.data.builder)
        self.loss_norm = GlobalLossNorm(
            model, world_size=ctx.world_size, gradient_accumulation_steps=self.gas, group=ctx.group
        )
        self.evaluator = None
        if recipe.train.eval_every and recipe.data.eval:
            self.evaluator = Evaluator(recipe, ctx, self.engine, self.loss_norm)
        self.checkpoints = CheckpointHook(recipe, self.engine, ctx, self.source)
        self.start_step = self.checkpoints.resume()
        # the first batch is drawn now: its shape sizes the report (tokens per step, flops per token)
        self.pending = self.source.next()
        self.reporter = self._build_reporter(self.pending) if ctx.is_rank0 else None
        if self.reporter is not None and self.checkpoints.data_changes:
            changes = self.checkpoints.data_changes
            self.reporter.log_data_change(self.start_step, changes_record(changes), describe_changes(changes))
        self.monitors = None
        if ctx.is_rank0 and recipe.train.monitors:
            self.monitors = Monitors(
                recipe.train.monitors
            )  # DeepSpeed's tensorboard / csv_monitor / wandb blocks
        self.guard = NonFiniteGuard(recipe.train.max_nonfinite_steps)
        self.unread: step_stats.PendingStep | None = None
        """The step whose values are still on their way to the host ([Note: deferred step reads])."""
        self.losses: list[float] = []
        """Every step's mean loss over ranks, in step order (run_training's result)."""
        # the card's size, for "% of device" in the per-step line
        self.device_bytes = (
            torch.cuda.get_device_properties(ctx.device).total_memory if ctx.device.type == "cuda" else None
        )

    def _build_model(self):
        recipe = self.recipe
        model = build_train_model(recipe, verify_checkpoints=self.ctx.verify_checkpoints)
        self.compiled: str | None = None
        """What train.compile compiled ("24 blocks", "the whole forward"), for the first step's line."""
        if recipe.train.compile:
            self.compiled = compile_for(
                model,
                scope=recipe.train.compile_scope,
                backend=recipe.train.compile_backend,
                unit_classes=recipe.engine.zero.stage3_units,
            )
        return model

    def _check_whole_forward_compile(self) -> None:
        """train.compile_scope: model at stage 3 passed the config because the plan said every unit aliases
        its source (config/auto.py check_compile_scope). A unit the engine could not alias after all keeps
        its gather hooks inside the forward, which dynamo would trace into the graph: refuse before the first
        step rather than train through them."""
        train = self.recipe.train
        if train.compile and train.compile_scope == "model" and not self.engine.forward_hooks_free:
            raise TrainError(
                "train.compile_scope is model (the whole forward as one graph), but the ZeRO stage-3 engine "
                "built here gathers at least one unit from hooks inside the forward (a unit whose params could "
                "not be views of what it holds at world size 1). Use train.compile_scope: blocks (the default)"
            )

    def _print_compiled(self, first_step_seconds: float) -> None:
        """The first step's line when it included compiling: train.compile's blocks or forward, and the fused
        optimizer step (train.compile_optimizer: compiled on CUDA, run as is on the CPU)."""
        fused = self.recipe.engine.optimizer.fused_step
        fused_compiled = fused and self.ctx.device.type == "cuda"
        if not (self.compiled or fused_compiled):
            return  # nothing was compiled
        parts = []
        if self.compiled:
            parts.append(f"{self.compiled} compiled ({self.recipe.train.compile_backend})")
        if fused:
            parts.append(
                f"optimizer step fused ({'inductor' if fused_compiled else 'uncompiled on the CPU'})"
            )
        key = "train.compile" if self.compiled else "train.compile_optimizer"
        print(
            f"{key}: {', '.join(parts)}; first step {1000 * first_step_seconds:.0f} ms, compile included",
            flush=True,
        )

    def _saved_activations(self):
        """The context one forward runs in: train.activation_offload's ([Note: activation offload])."""
        if not self.offload_activations:
            return contextlib.nullcontext()
        return offload_activations(self.model)

    def _build_reporter(self, first) -> StepReporter:
        recipe, ctx = self.recipe, self.ctx
        seq_tokens = tokens_in(first)
        seq_len = first["input_ids"].shape[-1] if seq_tokens is not None else None
        return StepReporter(
            Path(recipe.train.run_dir),
            total_steps=recipe.train.steps,
            world_size=ctx.world_size,
            tokens_per_step=(seq_tokens or recipe.train.micro_batch_size) * self.gas * ctx.world_size,
            flops_per_token=_flops_per_token(self.model, seq_len),
            device_name=torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu",
            log_every=recipe.train.log_every,
            dtype=recipe.engine.precision.dtype,
            start_step=self.start_step,
        )

    def _next_batch(self):
        batch = self.pending if self.pending is not None else self.source.next()
        self.pending = None
        return batch

    def train_step(self, step: int) -> None:
        """Report the previous optimizer step, then queue this one (gradient_accumulation_steps micro-batches).

        [Note: deferred step reads] The loop reads no device value of a step while queuing it: the loss sum
        and the memory peaks go to the host on the stream (step_stats.py, one all-reduce, a non_blocking copy
        into pinned memory) and the step is read and reported when the next one begins, waiting on that copy
        alone. Read at once instead: a skipped (non-finite) step, whose guard decision may stop the run; a
        step that may write a checkpoint (it must know the streak is closed); the last step. The read comes
        before the next step's first forward, not after it, so a worker killed during step N+1 has logged
        step N (the launcher's restart line names the last logged step). It would overlap the device's work
        if the engine's step() did not end in a device read of its own (float(grad_norm) in zero/engine.py:
        the device is idle when step() returns); moving `self._flush()` below the first backward is then
        the whole change. `self.losses` gets every step's mean loss over ranks, in order.
        """
        self._flush()
        ctx, engine, source = self.ctx, self.engine, self.source
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        comm_before = (engine.comm_stats.total_seconds(), engine.comm_stats.total_bytes())
        wait_before = source.wait_seconds
        start = step_stats.step_start(ctx.device)
        loss_sum = None
        info = None
        # drawn first: the loss is normalized over all of them ([Note: global loss normalization])
        batches = self.loss_norm.with_items([self._next_batch() for _ in range(self.gas)])
        for batch in batches:
            with self._saved_activations():
                out = forward(engine, batch)
            loss = loss_of(out)
            engine.backward(loss)
            info = engine.step()
            # detach().float() of an fp32 loss is the loss itself: clone so the sum never aliases it
            loss = loss.detach().float()
            loss_sum = loss.clone() if loss_sum is None else loss_sum.add_(loss)
        fp16 = self.recipe.engine.precision.dtype == "fp16"
        self.unread = step_stats.queue_step(
            step,
            loss_sum,
            start,
            rank=ctx.rank,
            world_size=ctx.world_size,
            device=ctx.device,
            group=ctx.group,
            fields={
                "grad_norm": info.grad_norm,
                "lr": info.lr,
                "loss_scale": info.loss_scale if fp16 else None,
                "skipped": bool(info.skipped),
                "comm_seconds": engine.comm_stats.total_seconds() - comm_before[0],
                "comm_bytes": engine.comm_stats.total_bytes() - comm_before[1],
                "data_wait_ms": (source.wait_seconds - wait_before) * 1000.0,
            },
        )
        # info.skipped is a host bool the engine already decided (every rank alike): a non-finite loss on
        # any rank or grad makes the step skipped (zero/protocol.py StepInfo), so a step the guard would
        # call bad is always read now, and the guard stops the run at the same step as a synchronous loop.
        eval_loss = None
        if self.evaluator is not None and self.evaluator.due(step):
            self._flush()  # the step's line comes before its evaluation's
            eval_loss = self._evaluate(step)
        every = self.checkpoints.every  # maybe_save's rule
        if (
            info.skipped
            or (every and step % every == 0)
            or step == self.recipe.train.steps
            or eval_loss is not None
        ):
            self._flush()
            if not self.guard.open:
                self.checkpoints.maybe_save(step, eval_loss)

    def _evaluate(self, step: int) -> float:
        """COLLECTIVE: evaluate, report on rank 0 (progress line, metrics.jsonl, monitors); the eval loss."""
        loss, perplexity = self.evaluator.run()
        if self.reporter is not None:
            self.reporter.log_eval(step, loss, perplexity)
        if self.monitors is not None:
            samples = step * self.recipe.train.global_batch_size
            self.monitors.write(step, samples, eval_loss=loss, eval_perplexity=perplexity)
        return loss

    def _flush(self) -> None:
        """Read and report the pending step, if any (rank 0 logs it; every rank records it in the guard)."""
        pending, self.unread = self.unread, None
        if pending is None:
            return
        ctx = self.ctx
        loss_sums, mem_peaks, step_seconds = pending.read(ctx.world_size)
        step, fields = pending.step, pending.fields
        if step == self.start_step + 1 and ctx.is_rank0:
            self._print_compiled(step_seconds)
        rank_losses = [v / self.gas for v in loss_sums]
        mean_loss = sum(rank_losses) / ctx.world_size
        self.losses.append(mean_loss)
        if self.reporter is not None:
            self.reporter.log(
                step=step,
                loss=mean_loss,
                step_seconds=step_seconds,
                mem_allocated_bytes=int(mem_peaks[0]) if mem_peaks else None,
                mem_reserved_bytes=int(mem_peaks[1]) if mem_peaks else None,
                mem_device_bytes=self.device_bytes,
                **fields,
            )
        if self.monitors is not None:
            # the one monitor writer shared with api.ZeroLaunchEngine.step, given the step's fields as a StepInfo
            info = StepInfo(
                not fields["skipped"],
                fields["skipped"],
                fields["grad_norm"],
                fields["loss_scale"],
                fields["lr"],
            )
            self.monitors.write_step(step, info, mean_loss, self.recipe)
        bad = self.guard.record(step, rank_losses, fields["grad_norm"])  # raises NonFiniteStop at the limit
        if bad is not None and ctx.is_rank0:
            print(f"non-finite {bad.describe()}: step skipped, no checkpoint until a finite step", flush=True)

    def finish(self) -> None:
        """COLLECTIVE: the final checkpoint (unless the run ended on non-finite steps) and the end-of-run table."""
        recipe, ctx = self.recipe, self.ctx
        self._flush()  # the last step is read at once; this covers a loop stopped early by its caller
        total_steps = recipe.train.steps
        if self.start_step < total_steps and not self.guard.open:
            self.checkpoints.save(total_steps)
        elif self.guard.open and ctx.is_rank0:
            print(
                "the run ended on non-finite steps: no final checkpoint (the newest one is the last good one)"
            )
        memory_by_rank = [None] * ctx.world_size
        dist.all_gather_object(memory_by_rank, _memory_now(self.engine, ctx.device), group=ctx.group)
        if self.reporter is not None:
            self.reporter.finish(
                memory_by_rank,
                recipe.engine.zero.stage,
                params_numel=self.params_numel,
                gradient_accumulation_steps=self.gas,
                grad_element_bytes=2
                if recipe.engine.precision.communication_dtype in ("bf16", "fp16")
                else 4,
            )
            self.reporter = None

    def close(self) -> None:
        """Stop the prefetch thread, close an unfinished report, release the engine (also after an error)."""
        self.source.close()
        if self.reporter is not None:
            self.reporter.close()
        if self.monitors is not None:
            self.monitors.close()
        self.engine.close()  # deletes an nvme swap file now rather than at interpreter exit


def run_training(recipe, ctx: RunContext) -> list[float]:
    """Train `recipe.train.steps` optimizer steps; returns the per-step mean losses (every rank)."""
    trainer = Trainer(recipe, ctx)
    try:
        if trainer.start_step >= recipe.train.steps:
            # a finished run resumed: no step to take, so no final checkpoint and no end-of-run tables
            if ctx.is_rank0:
                print(nothing_to_do(trainer.start_step, recipe.train.steps), flush=True)
            return trainer.losses
        for step in range(trainer.start_step + 1, recipe.train.steps + 1):
            trainer.train_step(step)
        trainer.finish()
    finally:
        trainer.close()
    return trainer.losses
