"""The one writer of a Hugging Face model folder: used by `convert-checkpoint` and `api.save_hf_pretrained`.

Owns the folder's life, not where the tensors come from: the folder is built under a temp name next to its
final one, each weight file is written as a `.part-N` file and fsynced, and `finish()` names the parts as
save_pretrained does (`model.safetensors`, or `model-0000i-of-0000n.safetensors` + an index with
`total_parameters` and `total_size`), adds config.json / generation_config.json (checkpoint/hf_out.py) and
the tokenizer files, fsyncs, and renames the folder into place ([Note: atomic save]). A reader sees the
previous folder or the complete new one; a crash leaves only a `.tmp-*` folder, removed by the next write.

Two ways in, because the two callers hold their tensors differently:
- `write_part(entries, tensors)`: the names, shapes and dtypes of one part are known up front (convert, from
  the checkpoint's manifest), tensors arrive one at a time; peak memory is the largest tensor.
- `add(name, tensor)`: tensors arrive from a gather whose shapes are not declared ahead
  (engine.full_state_dict); the writer keeps one part in memory and writes it when the next tensor would
  overflow `max_shard_bytes` -- the same greedy rule as convert's plan_shards.
Tied aliases are left out by the callers (hf_out.tied_aliases_to_drop) before they reach the writer.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch

from zerolaunch.checkpoint.atomic import TMP_PREFIX, fsync_path, publish, remove_path
from zerolaunch.checkpoint.errors import CheckpointError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
"""The files tokenizer.save_pretrained writes (whichever a tokenizer has); copied as they are."""

STEMS = {"safetensors": ("model", "safetensors"), "torch": ("pytorch_model", "bin")}


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files in `folder` (empty when it holds none, e.g. a model folder without a tokenizer)."""
    folder = Path(folder)
    return [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]


def recipe_tokenizer_dir(model_args: dict, data_args: dict) -> Path | None:
    """The tokenizer folder a recipe names: `data.args.tokenizer` (the one the data was tokenized with), else
    `model.args.path` when that model folder holds tokenizer files; None when the recipe names none.
    Absolute, so a checkpoint converted from another directory still finds it."""
    tokenizer = data_args.get("tokenizer")
    if isinstance(tokenizer, (str, os.PathLike)) and Path(tokenizer).is_dir():
        return Path(tokenizer).resolve()
    path = model_args.get("path")
    if isinstance(path, (str, os.PathLike)) and Path(path).is_dir() and tokenizer_files(Path(path)):
        return Path(path).resolve()
    return None


class HFFolderWriter:
    def __init__(self, out: Path, *, fmt: str = "safetensors", max_shard_bytes: int | None = None):
        if fmt not in STEMS:
            raise CheckpointError(f"unknown format {fmt!r}: choose one of {', '.join(STEMS)}")
        self.out = Path(out)
        self.fmt = fmt
        self.max_shard_bytes = max_shard_bytes
        self.tmp = self.out.with_name(f"{TMP_PREFIX}{self.out.name}")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_path(self.tmp)  # left by a killed writer
        self.tmp.mkdir()
        self._parts: list[list[str]] = []
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self.total_bytes = 0
        self.total_numel = 0
        self.weights_dtype: torch.dtype | None = None
        """dtype of the first floating-point tensor written: config.json's `dtype`."""

    # ---- weights ---------------------------------------------------------------------------------------
    def _part_path(self) -> Path:
        return self.tmp / f".part-{len(self._parts) + 1}.{STEMS[self.fmt][1]}"

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
        path = self._part_path()
        if self.fmt == "safetensors":
            from zerolaunch.checkpoint.tensorfile import SafetensorsWriter

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

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Buffer one tensor (a private CPU copy); writes the buffered part first if this one overflows it."""
        nbytes = tensor.numel() * tensor.element_size()
        if self._pending and self.max_shard_bytes is not None:
            if self._pending_bytes + nbytes > self.max_shard_bytes:
                self._flush()
        # a copy: gathered tensors may be views of one bucket that the next gather overwrites
        self._pending[name] = tensor.detach().to("cpu", copy=True).contiguous()
        self._pending_bytes += nbytes

    def _flush(self) -> None:
        if self._pending:
            items = list(self._pending.items())
            self._pending, self._pending_bytes = {}, 0
            self.write_part([(n, tuple(t.shape), t.dtype) for n, t in items], (t for _, t in items))

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
        tokenizer_dir: a folder written by tokenizer.save_pretrained (its tokenizer files are copied), or a
        tokenizer object (its save_pretrained writes into the folder)."""
        self._flush()
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
            from zerolaunch.checkpoint.hf_out import index_dict

            index = index_dict(weight_map, self.total_bytes, self.total_numel)
            # save_pretrained's format: indent 2, sorted keys, a final newline
            self._write_text(f"{stem}.{ext}.index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")
        if config is not None:
            from zerolaunch.checkpoint.hf_out import write_side_files

            write_side_files(
                self.tmp, config, self.weights_dtype, architecture=architecture, live_model=live_model
            )
        if hasattr(tokenizer_dir, "save_pretrained"):  # a tokenizer object: it writes its own files
            tokenizer_dir.save_pretrained(self.tmp)
            for path in tokenizer_files(self.tmp):
                fsync_path(path)
        elif tokenizer_dir is not None:
            self._copy_tokenizer(Path(tokenizer_dir))
        publish(self.tmp, self.out)
        return self.out

    def _write_text(self, name: str, text: str) -> None:
        path = self.tmp / name
        with open(path, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def _copy_tokenizer(self, folder: Path) -> None:
        if not folder.is_dir():
            raise CheckpointError(
                f"tokenizer folder {folder} does not exist (it was named when the checkpoint was saved); "
                "restore it, or leave the tokenizer out"
            )
        files = tokenizer_files(folder)
        if not files:
            raise CheckpointError(
                f"tokenizer folder {folder} holds none of {', '.join(TOKENIZER_FILES[:3])}, ...: "
                "give a folder written by tokenizer.save_pretrained"
            )
        for src in files:
            dst = self.tmp / src.name
            shutil.copyfile(src, dst)
            fsync_path(dst)

    def abort(self) -> None:
        """Drop the temp folder (an exception while writing); the previous output, if any, stays."""
        self._pending = {}
        remove_path(self.tmp)
