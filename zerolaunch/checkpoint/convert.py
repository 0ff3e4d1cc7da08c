"""`convert-checkpoint`: a zerolaunch or DeepSpeed ZeRO checkpoint -> consolidated weights, or -> a
zerolaunch checkpoint for another world size.

Streams tensor by tensor: a source (`ZerolaunchSource`, `deepspeed.DeepSpeedSource`) lists the output
tensors (name, shape, dtype) up front and reads one full tensor on demand; the writers declare every
tensor's header first and then write each as it arrives, so peak memory is about the largest tensor
(measured: 10.7 MiB for a 64 MiB model of 4 MiB tensors; DeepSpeed sources add the mmapped file pages). Outputs: `model.safetensors`, Hugging Face shards +
`model.safetensors.index.json` past `max_shard_bytes`, or the torch equivalents (`pytorch_model.bin`,
shards + index; torch.save needs a shard's tensors in memory at once, so there memory is one shard).
A folder output is written by checkpoint/hf_folder.py (the writer api.save_hf_pretrained uses too) as
save_pretrained lays it out: with an HF config in rank 0's extra (zerolaunch saves one), the names and layout
go through transformers' reversed conversion mapping (per-expert MoE tensors, GPT-NeoX's embed_out), the
files split where huggingface_hub's planner splits them, and config.json + generation_config.json and the
tokenizer (when the extra names a tokenizer folder) are added; tied weights are stored once and
non-persistent buffers left out, so `from_pretrained` loads it with no missing or unexpected keys.
The output is built under a temp name and renamed into place ([Note: atomic save]); an existing output is
replaced only with `force`, and only when it is a previous conversion's output that neither is, holds nor lies
inside the source ([Note: what --force may replace]).
"""

from __future__ import annotations

from pathlib import Path

import torch

from zerolaunch.checkpoint import hf_folder, hf_out
from zerolaunch.checkpoint.deepspeed import DeepSpeedSource, find_deepspeed_checkpoint
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.extra import HF_CONFIG_KEY, HF_PEFT_KEY, HF_TOKENIZER_KEY
from zerolaunch.checkpoint.manifest import MANIFEST_NAME
from zerolaunch.checkpoint.outputs import ByteProgress, OutTensor
from zerolaunch.checkpoint.peft_convert import write_peft_folder
from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.checkpoint.reshard import reshard_checkpoint
from zerolaunch.checkpoint.save import resolve_checkpoint
from zerolaunch.checkpoint.tensorfile import SafetensorsWriter, dtype_from_name
from zerolaunch.dtypes import DTYPES, torch_dtype
from zerolaunch.util.atomic import TMP_PREFIX, publish, remove_path
from zerolaunch.util.disk_errors import disk_errors
from zerolaunch.util.overlap import relation, some_entries
from zerolaunch.util.sizes import EstimateError, parse_bytes

FORMATS = ("safetensors", "torch")


class ZerolaunchSource:
    """The consolidated weights of a zerolaunch checkpoint: fp32 master of trainable params, frozen params
    (replicated, or stitched from the ranks' frozen fragments at stage 3) and buffers."""

    def __init__(self, folder: Path, *, verify: bool = True):
        self.reader = CheckpointReader(folder, verify=verify)
        m = self.reader.manifest
        self.description = f"zerolaunch checkpoint {folder} (step {m.step}, world size {m.world_size})"
        self._replicated = {r.name: r for r in m.replicated}

    def tensors(self) -> list[OutTensor]:
        out = []
        for p in self.reader.manifest.params:
            dtype = torch.float32 if p.trainable else dtype_from_name(self._replicated_dtype(p.name))
            out.append(OutTensor(p.name, p.shape, dtype, p.name))
            out.extend(OutTensor(a, p.shape, dtype, p.name) for a in p.aliases)
        params = {p.name for p in self.reader.manifest.params}
        out.extend(
            OutTensor(r.name, r.shape, dtype_from_name(r.dtype), r.name)
            for r in self.reader.manifest.replicated
            if r.name not in params and r.persistent  # a model's state_dict leaves non-persistent buffers out
        )
        return out

    def _replicated_dtype(self, name: str) -> str:
        if name in self._replicated:
            return self._replicated[name].dtype
        if self.reader.holds_sharded_frozen(name) or self.reader.params[name].numel == 0:
            return self.reader.params[name].dtype
        raise CheckpointError(f"{self.reader.folder}: frozen param {name!r} is missing from the rank files")

    def hf_config(self) -> dict | None:
        """The HF model config rank 0 saved in its extra (zerolaunch.api does), written as config.json."""
        config = self.reader.manifest.ranks[0].extra.get(HF_CONFIG_KEY)
        return config if isinstance(config, dict) else None

    def peft_record(self) -> dict | None:
        """A PEFT run's adapter config (rank 0's extra; models/peft.py adapter_record)."""
        record = self.reader.manifest.ranks[0].extra.get(HF_PEFT_KEY)
        return record if isinstance(record, dict) else None

    def hf_tokenizer_dir(self) -> Path | None:
        """The tokenizer folder the training recipe named (rank 0's extra), copied into a folder output."""
        folder = self.reader.manifest.ranks[0].extra.get(HF_TOKENIZER_KEY)
        return Path(folder) if isinstance(folder, str) else None

    def read(self, name: str) -> torch.Tensor:
        p = self.reader.params.get(name)
        if p is not None and p.trainable:
            return self.reader.full_param(name)
        if p is not None:
            return self.reader.frozen_param(name)
        return self.reader.replicated(name)

    def close(self) -> None:
        self.reader.close()


def open_source(src: Path, *, verify: bool = True):
    """A zerolaunch checkpoint (folder or root with `latest`) or a DeepSpeed ZeRO checkpoint."""
    src = Path(src)
    if not src.exists():
        raise CheckpointError(f"{src} does not exist")

    ds_folder = find_deepspeed_checkpoint(src)
    if ds_folder is not None:
        return DeepSpeedSource(ds_folder)
    if (src / MANIFEST_NAME).is_file() or src.is_dir():
        return ZerolaunchSource(resolve_checkpoint(src), verify=verify)
    raise CheckpointError(f"{src} is neither a zerolaunch checkpoint nor a DeepSpeed ZeRO checkpoint folder")


def parse_size(text: str, what: str = "--max-shard-size") -> int:
    """ "5GB" -> 5_000_000_000, "200MiB" -> 209_715_200: the one parser of every size option (util/sizes.py)."""
    try:
        return parse_bytes(text, what, example="5GB")
    except EstimateError as exc:
        raise CheckpointError(str(exc)) from None


def plan_shards(sizes: list[int], max_shard_bytes: int | None) -> list[list[int]]:
    """Indices of tensors per shard, in order; a new shard starts where the next tensor would overflow."""
    shards: list[list[int]] = [[]]
    filled = 0
    for i, nbytes in enumerate(sizes):
        if max_shard_bytes is not None and shards[-1] and filled + nbytes > max_shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(i)
        filled += nbytes
    return shards


def _out_dtype(t: OutTensor, dtype: torch.dtype) -> torch.dtype:
    return dtype if t.dtype.is_floating_point else t.dtype


def convert_checkpoint(
    src,
    out,
    *,
    fmt: str = "safetensors",
    dtype: str = "fp32",
    max_shard_bytes: int | None = None,
    to_world_size: int | None = None,
    force: bool = False,
    progress: bool = False,
    verify: bool = True,
    merge_adapter: bool = False,
) -> Path:
    """Convert `src` into `out` (a folder; or a single file when `out` ends in .safetensors/.bin/.pt).
    A PEFT run's checkpoint becomes its adapter folder, or with `merge_adapter` the merged model
    (checkpoint/peft_convert.py)."""
    src, out = Path(src), Path(out)
    if fmt not in FORMATS:
        raise CheckpointError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if dtype not in DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if max_shard_bytes is not None and max_shard_bytes < 1:
        raise CheckpointError(f"max shard size must be positive, got {max_shard_bytes} bytes")
    check_out(src, out, force)
    # a full, read-only or forbidden OUT: one paragraph; the writers below remove their temp folder
    where = {"path": out, "what": "the converted checkpoint", "fix": "give another OUT folder"}
    if to_world_size is not None:
        with disk_errors(**where):
            return reshard_checkpoint(src, out, to_world_size, progress=progress, verify=verify)
    source = open_source(src, verify=verify)
    try:
        with disk_errors(needed_bytes=sum(_sizes(source.tensors(), torch_dtype(dtype))), **where):
            out.parent.mkdir(parents=True, exist_ok=True)
            peft = getattr(source, "peft_record", lambda: None)()
            if merge_adapter and (peft is None or out.suffix in (".safetensors", ".bin", ".pt")):
                raise CheckpointError(
                    f"--merge-adapter: {src} is not the checkpoint of a run with a `peft:` block"
                    if peft is None
                    else f"--merge-adapter writes a model folder: give a folder as OUT, not {out.name}"
                )
            if out.suffix in (".safetensors", ".bin", ".pt"):
                _write_file(source, out, fmt, torch_dtype(dtype), max_shard_bytes, progress)
            elif peft is not None:
                write_peft_folder(
                    source,
                    out,
                    merge=merge_adapter,
                    fmt=fmt,
                    dtype=torch_dtype(dtype),
                    max_shard_bytes=max_shard_bytes,
                )
            else:
                _write_folder(source, out, fmt, torch_dtype(dtype), max_shard_bytes, progress)
    finally:
        source.close()
    return out


# [Note: what --force may replace]
# OUT may be replaced only when it is what a conversion writes: a file for a file name (.safetensors, .bin,
# .pt), else a folder without sub-folders whose files are weights, JSON, tokenizer files or a checkpoint
# manifest, with at least one weights file or manifest. Anything else (a run's checkpoints folder, a user's
# notes) is refused with its names listed, so --force never deletes what convert-checkpoint did not write.
_OUTPUT_SUFFIXES = (".safetensors", ".bin", ".pt", ".json", ".txt", ".model", ".jinja", ".tiktoken")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def check_out(src: Path, out: Path, force: bool) -> None:
    """OUT neither is, holds nor lies inside SRC (either way round, replacing OUT would delete the checkpoint
    being read), and it is free or, with `force`, a previous conversion's output."""
    how = relation(out, src)
    if how is not None:
        raise CheckpointError(
            f"OUT {out} {how} the source {src}: OUT must not be, hold or lie inside the source, or writing it "
            f"would delete the checkpoint being read. Give an OUT outside it, e.g. "
            f"{src.resolve().parent.parent / (src.resolve().name + '-converted')}"
        )
    if not out.exists() and not out.is_symlink():
        return
    fix = "give another OUT, or move it away yourself"
    file_name = out.suffix in _WEIGHT_SUFFIXES
    if file_name and not out.is_file():
        raise CheckpointError(
            f"OUT {out} is a folder; a {out.suffix} OUT is written as one file, and --force replaces only "
            f"such a file: {fix}"
        )
    if not file_name:
        if not out.is_dir():
            raise CheckpointError(
                f"OUT {out} is a file; convert-checkpoint writes a folder there (name a .safetensors, .bin "
                f"or .pt file as OUT for a single file), and --force replaces only a folder it wrote: {fix}"
            )
        entries = list(out.iterdir())
        foreign = [p for p in entries if p.is_dir() or not p.name.endswith(_OUTPUT_SUFFIXES)]
        if (
            entries
            and not foreign
            and not any(p.name.endswith(_WEIGHT_SUFFIXES) or p.name == MANIFEST_NAME for p in entries)
        ):
            foreign = entries
        if foreign:
            raise CheckpointError(
                f"OUT {out} holds {some_entries(foreign)}, which a conversion does not write (it is not a "
                f"previous convert-checkpoint output); --force replaces only such an output, so nothing "
                f"there is deleted: {fix}"
            )
    if not force:
        raise CheckpointError(f"{out} already exists; pass --force to replace it")


def _sizes(tensors: list[OutTensor], dtype: torch.dtype) -> list[int]:
    return [_numel(t.shape) * torch.empty((), dtype=_out_dtype(t, dtype)).element_size() for t in tensors]


def _write_file(source, out: Path, fmt: str, dtype: torch.dtype, max_shard_bytes, progress: bool) -> None:
    """A single weights file (no config): built under a temp name, renamed into place."""
    tensors = _tensors(source)
    sizes = _sizes(tensors, dtype)
    shards = plan_shards(sizes, max_shard_bytes)
    if len(shards) > 1:
        raise CheckpointError(
            f"the model ({sum(sizes)} bytes) needs {len(shards)} shards at the given "
            "max shard size: give a folder as OUT, not a file name"
        )
    tmp = out.with_name(f"{TMP_PREFIX}{out.name}")
    remove_path(tmp)  # left by a killed conversion
    try:
        with ByteProgress(progress, sum(sizes), source.description) as bar:
            if fmt == "safetensors":
                _write_safetensors_shard(source, tmp, tensors, dtype, bar.advance)
            else:
                _write_torch_shard(source, tmp, tensors, dtype, bar.advance)
    except BaseException:
        remove_path(tmp)
        raise
    publish(tmp, out)


def _tensors(source) -> list[OutTensor]:
    tensors = source.tensors()
    if not tensors:
        raise CheckpointError(f"{source.description} holds no tensors")
    return tensors


def _write_folder(source, out: Path, fmt: str, dtype: torch.dtype, max_shard_bytes, progress: bool) -> None:
    """A folder through the one HF writer (checkpoint/hf_folder.py), as save_pretrained lays it out: names
    and layout reversed through transformers' conversion mapping (hf_out.save_plan), files split by
    huggingface_hub's shard planner, config.json, generation_config.json and the tokenizer when the
    checkpoint carries an HF config / tokenizer folder. One conversion group is in memory at a time."""
    tensors = _tensors(source)
    config = getattr(source, "hf_config", lambda: None)()
    if config is not None:
        # an HF folder stores a tied weight once, as save_pretrained does (from_pretrained re-ties it)
        drop = hf_out.tied_aliases_to_drop(config, [t.name for t in tensors if t.source != t.name])
        tensors = [t for t in tensors if t.name not in drop]
    by_name = {t.name: t for t in tensors}
    plan = hf_out.save_plan(hf_out.meta_model(config), list(by_name))
    outputs = plan.output_shapes(
        lambda n: torch.empty(by_name[n].shape, dtype=_out_dtype(by_name[n], dtype), device="meta")
    )
    shards = [
        [(n, tuple(outputs[n].shape), outputs[n].dtype) for n in names]
        for names in hf_out.plan_shards(outputs, max_shard_bytes, hf_model=config is not None)
    ]
    writer = hf_folder.HFFolderWriter(out, fmt=fmt)
    try:
        with ByteProgress(progress, sum(_sizes(tensors, dtype)), source.description) as bar:
            converted = _converted(source, plan, by_name, dtype, bar.advance, shared=fmt == "torch")
            if fmt == "safetensors":
                writer.open_shards(shards)
                for name, tensor in converted:
                    writer.put(name, tensor)
            else:
                # torch.save needs a part's tensors at once; groups arrive in shard order
                pending: dict[str, torch.Tensor] = {}
                for entries in shards:
                    for name, _, _ in entries:
                        while name not in pending:
                            pending.update([next(converted)])
                    writer.write_part(entries, [pending.pop(n) for n, _, _ in entries])
        tokenizer = getattr(source, "hf_tokenizer_dir", lambda: None)()
        writer.finish(config, tokenizer_dir=tokenizer)
    except BaseException:
        writer.abort()
        raise


def _converted(source, plan, by_name: dict[str, OutTensor], dtype, advance, *, shared: bool):
    """(saved name, tensor) of every output, one conversion group read and converted at a time; `shared`
    hands a tied alias the very tensor of its source (torch.save then stores it once)."""
    by_source: dict[str, torch.Tensor] = {}

    def read(name: str) -> torch.Tensor:
        t = by_name[name]
        tensor = by_source.get(t.source) if shared else None
        if tensor is None:
            tensor = _read_as(source, t, dtype)
            if shared:
                by_source[t.source] = tensor
        advance(tensor.numel() * tensor.element_size())
        return tensor

    for group in plan.groups.values():
        yield from plan.convert(group, read).items()


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _read_as(source, t: OutTensor, dtype: torch.dtype) -> torch.Tensor:
    tensor = source.read(t.source)
    if tuple(tensor.shape) != tuple(t.shape):
        raise CheckpointError(
            f"{source.description}: tensor {t.source!r} has shape {list(tensor.shape)}, "
            f"its metadata says {list(t.shape)}"
        )
    return tensor.to(_out_dtype(t, dtype))


def _write_safetensors_shard(source, path: Path, items: list[OutTensor], dtype, advance) -> None:
    writer = SafetensorsWriter(
        path, [(t.name, t.shape, _out_dtype(t, dtype)) for t in items], metadata={"format": "pt"}
    )
    try:
        for t in items:
            tensor = _read_as(source, t, dtype)
            writer.write(t.name, tensor)
            advance(tensor.numel() * tensor.element_size())
    except BaseException:
        writer.abort()
        raise
    writer.close()


def _write_torch_shard(source, path: Path, items: list[OutTensor], dtype, advance) -> None:
    state: dict[str, torch.Tensor] = {}
    by_source: dict[str, torch.Tensor] = {}
    for t in items:
        if t.source not in by_source:  # a tied alias is saved as the same tensor, as torch.save shares it
            by_source[t.source] = _read_as(source, t, dtype)
        state[t.name] = by_source[t.source]
        advance(state[t.name].numel() * state[t.name].element_size())
    torch.save(state, path)
