"""A Hugging Face model folder from a live engine: `write_hf_pretrained` (what `model.save_pretrained` writes,
streamed from the engine one tensor at a time at every stage) and `with_hf_config` (the HF config rank 0 keeps
in a checkpoint's extra, so convert-checkpoint can write config.json).

The folder's life (temp name, parts, fsync, rename) is hf_folder.py's; the names and the shard plan are
hf_out.py's; a PeftModel's adapter folder is peft_adapter.py's. Used by zerolaunch.api's
`save_hf_pretrained(engine, out)` for scripts and by the Trainer door (hf/trainer.py). It takes what it uses
(the model, the full-state iterator, the param specs, the group), not an engine: the checkpoint contract
(contract.py) covers the engine members checkpoint/ reads, and a live model is not among them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from zerolaunch.checkpoint import hf_folder, hf_out
from zerolaunch.checkpoint.contract import ParamSpecLike
from zerolaunch.checkpoint.extra import HF_CONFIG_KEY
from zerolaunch.checkpoint.peft_adapter import is_peft_model, save_peft_adapter
from zerolaunch.models.hf import hf_config_dict, is_hf_model
from zerolaunch.zero import comm


def with_hf_config(extra: dict | None, model, rank: int) -> dict:
    """`extra` (copied) with rank 0's "hf_config" for an HF model, unless the caller put one there."""
    extra = dict(extra or {})
    if rank == 0 and HF_CONFIG_KEY not in extra:
        hf_config = hf_config_dict(model)
        if hf_config is not None:
            extra[HF_CONFIG_KEY] = hf_config
    return extra


def write_hf_pretrained(
    model,
    iter_full_state: Callable[[torch.dtype | None], Iterable[tuple[str, torch.Tensor]]],
    param_specs: Sequence[ParamSpecLike],
    group,
    out_dir,
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int | None = None,
    tokenizer=None,
) -> Path:
    """COLLECTIVE: write the HF model directory that `model.save_pretrained` writes.

    model: the engine's module; iter_full_state(dtype): the engine's (zero/engine.py); param_specs: the engine's
    param_specs(); group: its process group. Every rank iterates iter_full_state (it gathers); rank 0 writes
    config.json and the weights under save_pretrained's names and layout: transformers' conversion mapping
    reversed (per-expert MoE tensors, GPT-NeoX's embed_out; models/hf_mapping.py), split into files by
    huggingface_hub's shard planner at max_shard_bytes (default: save_pretrained's default). Each tensor is
    written at its place in its file as it arrives, so rank 0 holds one conversion group (one fused tensor), not
    a shard. dtype: of the written weights (default: as the model holds them; fp32 from a 16-bit model gives the
    exact master weights). Tied weights are written once (HF re-ties them on load); non-persistent buffers
    (rotary tables) are left out, as save_pretrained does. tokenizer: a tokenizer or processor, or a local
    folder holding one; its own save_pretrained writes it in (checkpoint/hf_folder.py). A PEFT model (peft's
    PeftModel) gets its adapter folder, as its own save_pretrained writes it (checkpoint/peft_adapter.py).
    """
    if is_peft_model(model):  # what PeftModel.save_pretrained writes: the adapter only
        return save_peft_adapter(
            model, iter_full_state(dtype), param_specs, group, out_dir, tokenizer=tokenizer
        )
    if not is_hf_model(model):
        raise ValueError(
            f"save_hf_pretrained needs a transformers PreTrainedModel, got {type(model).__name__}; "
            "use zerolaunch convert-checkpoint for other models"
        )
    rank = comm.rank(group)
    persistent = set(model.state_dict().keys())  # tied aliases appear once, non-persistent buffers not at all
    writer = None
    if rank == 0:
        shapes = _full_shapes(param_specs, model, persistent, dtype)
        plan = hf_out.save_plan(model, list(shapes))
        outputs = plan.output_shapes(lambda n: shapes[n])
        shards = [
            [(n, tuple(outputs[n].shape), outputs[n].dtype) for n in names]
            for names in hf_out.plan_shards(outputs, max_shard_bytes)
        ]
        # the one HF writer (checkpoint/hf_folder.py, also convert-checkpoint's): rank 0 builds the folder under
        # a temp name and renames it into place, so a crash leaves the previous folder (or none), never a mix.
        writer = hf_folder.HFFolderWriter(Path(out_dir))
        pending: dict[str, dict[str, torch.Tensor]] = {}
    try:
        if writer is not None:
            writer.open_shards(shards)
        for name, tensor in iter_full_state(dtype):
            if writer is None or name not in shapes:
                continue
            conversion = plan.groups[plan.by_source[name]]
            inputs = pending.setdefault(conversion.first, {})
            # a copy: gathered tensors may be views of one bucket that the next gather overwrites
            inputs[name] = tensor.detach().to("cpu", copy=True)
            if len(inputs) == len(conversion.sources):
                del pending[conversion.first]
                for out_name, out in plan.convert(conversion, inputs.__getitem__).items():
                    writer.put(out_name, out)
        if writer is not None:
            writer.finish(hf_config_dict(model), live_model=model, tokenizer_dir=tokenizer)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    comm.barrier(group)
    return Path(out_dir)


def _full_shapes(
    param_specs: Sequence[ParamSpecLike], model, persistent: set[str], dtype: torch.dtype | None
) -> dict[str, torch.Tensor]:
    """{name: meta tensor} of what iter_full_state yields and the folder keeps (params once, persistent
    buffers), with the shape and dtype it will have: the shard plan is made before anything is gathered."""
    out = {}
    for spec in param_specs:
        if spec.name in persistent:
            d = getattr(torch, spec.dtype)
            d = dtype if dtype is not None and d.is_floating_point else d
            out[spec.name] = torch.empty(spec.shape, dtype=d, device="meta")
    for name, b in model.named_buffers():
        if name in persistent and name not in out:
            d = dtype if dtype is not None and b.is_floating_point() else b.dtype
            out[name] = torch.empty(b.shape, dtype=d, device="meta")
    return out
