"""The one writer of a Hugging Face model folder: used by `convert-checkpoint` and `api.save_hf_pretrained`.

Owns the folder's life, not where the tensors come from: the folder is built under a temp name next to its
final one, each weight file is written as a `.part-N` file and fsynced, and `finish()` names the parts as
save_pretrained does (`model.safetensors`, or `model-0000i-of-0000n.safetensors` + an index with
`total_parameters` and `total_size`), adds config.json / generation_config.json (checkpoint/hf_out.py) and
the tokenizer or processor (saved by its own `save_pretrained`), fsyncs, and renames the folder into place
([Note: atomic save]). A reader sees the previous folder or the complete new one; a crash leaves only a
`.tmp-*` folder, removed by the next write.

The shard plan is the caller's, made by huggingface_hub's `split_torch_state_dict_into_shards` over the
tensors' sizes (hf_out.plan_shards), so the files split where save_pretrained's split. Two ways in:
- `open_shards(shards)` + `put(name, tensor)`: safetensors files whose every name, shape and dtype is
  declared up front; tensors arrive in any order (a gather, or a converted group) and are written at their
  offsets, so host memory is the tensor in hand, not a shard.
- `write_part(entries, tensors)`: one file at a time from a stream in declared order; torch.save's format
  (`pytorch_model.bin`) goes this way, holding one part.
Tied aliases are left out by the callers (hf_out.tied_aliases_to_drop) before they reach the writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch

from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.hf_out import index_dict, write_side_files
from zerolaunch.checkpoint.tensorfile import SafetensorsWriter
from zerolaunch.models.hf import _transformers
from zerolaunch.util.atomic import TMP_PREFIX, fsync_path, publish, remove_path

TOKENIZER_MARKERS = (
    "tokenizer_config.json",
    "tokenizer.json",
    "processor_config.json",
    "preprocessor_config.json",
)
"""Files whose presence says a folder holds a tokenizer or processor (what is copied is up to its own
save_pretrained)."""

STEMS = {"safetensors": ("model", "safetensors"), "torch": ("pytorch_model", "bin")}


def has_tokenizer(folder: Path) -> bool:
    """True when `folder` holds a tokenizer or processor (a model folder may hold none)."""
    return any((Path(folder) / n).is_file() for n in TOKENIZER_MARKERS)


def load_tokenizer(folder: Path):
    """The processor of `folder` (AutoProcessor), else its tokenizer (AutoTokenizer), offline; or a clear
    error. Whatever loads is written back by its own save_pretrained, file names and all."""
    transformers = _transformers()
    errors = []
    for cls in (transformers.AutoProcessor, transformers.AutoTokenizer):
        try:
            return cls.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as e:
            errors.append(f"{cls.__name__}: {e}")
    raise CheckpointError(
        f"tokenizer folder {folder} loads with neither AutoProcessor nor AutoTokenizer ({'; '.join(errors)}); "
        "give a folder written by tokenizer.save_pretrained or processor.save_pretrained"
    )


def _with_tokenizer_ids(config: dict, tokenizer) -> dict:
    """The config with the tokenizer's bos / eos ids: a model built from an inline config carries its
    class's defaults (Llama's 1 and 2), which generate() and the Hub read, not the ids the data holds."""
    out = dict(config)
    for key in ("bos_token_id", "eos_token_id"):
        token_id = getattr(tokenizer, key, None)
        if isinstance(token_id, int):
            out[key] = token_id
    return out


def _prepared_tokenizer(data_path) -> Path | None:
    """The tokenizer folder a `prepare-data` folder was made with (its manifest.json names it)."""
    if not isinstance(data_path, (str, os.PathLike)):
        return None
    try:
        manifest = json.loads((Path(data_path) / "manifest.json").read_text())
        folder = Path(manifest["tokenizer"]["path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return folder.resolve() if folder.is_dir() and has_tokenizer(folder) else None


def recipe_tokenizer_dir(model_args: dict, data_args: dict) -> Path | None:
    """The tokenizer folder a recipe names: `data.args.tokenizer` (the one the data was tokenized with), else
    the one a prepared data folder (`data.args.path`) was made with, else `model.args.path` when that model
    folder holds tokenizer files; None when the recipe names none. Absolute, so a checkpoint converted from
    another directory still finds it."""
    tokenizer = data_args.get("tokenizer")
    if isinstance(tokenizer, (str, os.PathLike)) and Path(tokenizer).is_dir():
        return Path(tokenizer).resolve()
    prepared = _prepared_tokenizer(data_args.get("path"))
    if prepared is not None:
        return prepared
    path = model_args.get("path")
    if isinstance(path, (str, os.PathLike)) and Path(path).is_dir() and has_tokenizer(Path(path)):
        return Path(path).resolve()
    return None


class HFFolderWriter:
    def __init__(self, out: Path, *, fmt: str = "safetensors"):
        if fmt not in STEMS:
            raise CheckpointError(f"unknown format {fmt!r}: choose one of {', '.join(STEMS)}")
        self.out = Path(out)
        self.fmt = fmt
        self.tmp = self.out.with_name(f"{TMP_PREFIX}{self.out.name}")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_path(self.tmp)  # left by a killed writer
        self.tmp.mkdir()
        self._parts: list[list[str]] = []
        self._open: list = []
        """SafetensorsWriters of open_shards, one per shard, until finish closes them."""
        self._shard_of: dict[str, int] = {}
        self.total_bytes = 0
        self.total_numel = 0
        self.weights_dtype: torch.dtype | None = None
        """dtype of the first floating-point tensor written: config.json's `dtype`."""

    # ---- weights ---------------------------------------------------------------------------------------
    def _part_path(self, i: int) -> Path:
        return self.tmp / f".part-{i + 1}.{STEMS[self.fmt][1]}"

    def _count(self, shape, dtype: torch.dtype) -> None:
        numel = 1
        for d in shape:
            numel *= d
        self.total_numel += numel
        self.total_bytes += numel * torch.empty((), dtype=dtype).element_size()
        if dtype.is_floating_point and self.weights_dtype is None:
            self.weights_dtype = dtype

    def write_part(self, entries: list[tuple[str, tuple, torch.dtype]], tensors: Iterable[torch.Tensor]):
        """One weight file from declared (name, shape, dtype) entries and their tensors in that order;
        safetensors streams them, torch.save holds the part (and saves a tied alias as one shared tensor)."""
        path = self._part_path(len(self._parts))
        if self.fmt == "safetensors":
            writer = SafetensorsWriter(path, entries, metadata={"format": "pt"})
            try:
                for (name, _, _), tensor in zip(entries, tensors, strict=True):
                    writer.write(name, tensor)
            except BaseException:
                writer.abort()
                raise
            writer.close()  # flushes and fsyncs
        else:
            state = dict(zip((e[0] for e in entries), tensors, strict=True))
            torch.save(state, path)
            fsync_path(path)
        for _, shape, dtype in entries:
            self._count(shape, dtype)
        self._parts.append([e[0] for e in entries])

    def open_shards(self, shards: list[list[tuple[str, tuple, torch.dtype]]]) -> None:
        """Declare every safetensors file at once (name, shape, dtype per tensor, shards in order); `put`
        then fills them in any order."""
        if self.fmt != "safetensors":
            raise CheckpointError("open_shards writes safetensors files; torch files go through write_part")

        for i, entries in enumerate(shards):
            self._open.append(SafetensorsWriter(self._part_path(i), entries, metadata={"format": "pt"}))
            self._shard_of.update(dict.fromkeys((e[0] for e in entries), i))
            for _, shape, dtype in entries:
                self._count(shape, dtype)
            self._parts.append([e[0] for e in entries])

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Write one declared tensor into its shard (open_shards)."""
        i = self._shard_of.get(name)
        if i is None:
            raise CheckpointError(f"tensor {name!r} is in no shard of {self.out}'s plan")
        self._open[i].write_any(name, tensor)

    # ---- the rest of the folder ------------------------------------------------------------------------
    def finish(
        self,
        config: dict | None = None,
        *,
        architecture: str | None = None,
        live_model=None,
        tokenizer_dir=None,
    ) -> Path:
        """Name the parts, write the index, config files and tokenizer, and rename the folder into place.
        tokenizer_dir: a folder holding a tokenizer or processor, or such an object; either way the object's
        own save_pretrained writes it into the folder."""
        while self._open:
            self._open.pop(0).close()  # checks every declared tensor came, flushes and fsyncs
        if not self._parts:
            raise CheckpointError(f"no tensors were written for {self.out}")
        stem, ext = STEMS[self.fmt]
        n = len(self._parts)
        weight_map = {}
        for i, names in enumerate(self._parts, start=1):
            final = f"{stem}.{ext}" if n == 1 else f"{stem}-{i:05d}-of-{n:05d}.{ext}"
            os.replace(self.tmp / f".part-{i}.{ext}", self.tmp / final)
            weight_map.update(dict.fromkeys(names, final))
        if n > 1:
            index = index_dict(weight_map, self.total_bytes, self.total_numel)
            # save_pretrained's format: indent 2, sorted keys, a final newline
            self._write_text(f"{stem}.{ext}.index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")
        tokenizer = self._load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
        if config is not None and tokenizer is not None:
            config = _with_tokenizer_ids(config, tokenizer)
        if config is not None:
            write_side_files(
                self.tmp, config, self.weights_dtype, architecture=architecture, live_model=live_model
            )
        if tokenizer is not None:
            self._save_tokenizer(tokenizer)
        publish(self.tmp, self.out)
        return self.out

    def _write_text(self, name: str, text: str) -> None:
        path = self.tmp / name
        with open(path, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def _load_tokenizer(self, tokenizer):
        if not hasattr(tokenizer, "save_pretrained"):
            folder = Path(tokenizer)
            if not folder.is_dir():
                raise CheckpointError(
                    f"tokenizer folder {folder} does not exist (it was named when the checkpoint was saved); "
                    "restore it, or leave the tokenizer out"
                )
            if not has_tokenizer(folder):
                raise CheckpointError(
                    f"tokenizer folder {folder} holds none of {', '.join(TOKENIZER_MARKERS)}: "
                    "give a folder written by tokenizer.save_pretrained or processor.save_pretrained"
                )
            tokenizer = load_tokenizer(folder)
        return tokenizer

    def _save_tokenizer(self, tokenizer) -> None:
        before = set(self.tmp.iterdir())
        tokenizer.save_pretrained(str(self.tmp))
        for path in sorted(set(self.tmp.iterdir()) - before):
            fsync_path(path)

    def abort(self) -> None:
        """Drop the temp folder (an exception while writing); the previous output, if any, stays."""
        for w in self._open:
            w.abort()
        self._open = []
        remove_path(self.tmp)
