"""Reading a zerolaunch checkpoint at any granularity: element ranges of one kind of state, full tensors.

`CheckpointReader(folder)` validates the manifest and the rank files' sizes and headers up front (missing
or truncated file -> CheckpointError naming it), then answers `read(kind, name, start, stop)` by stitching
the pieces of whichever saved fragments intersect [start, stop): this is what makes a checkpoint load at
another world size, bucket size or stage. Only the requested bytes are read (tensorfile.SafetensorsReader),
so memory is the size of the answer.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import torch

from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.extra import decode_extra
from zerolaunch.checkpoint.manifest import Manifest, ParamEntry, fragment_key, read_manifest
from zerolaunch.checkpoint.tensorfile import SafetensorsReader, dtype_from_name


class CheckpointReader:
    def __init__(self, folder, *, verify: bool = True):
        """verify: check the manifest's own crc32 now and every tensor read against the manifest's crc32s
        (checkpoints without checksums, written before they existed, are read unverified)."""
        self.folder = Path(folder)
        self.manifest: Manifest = read_manifest(self.folder, verify=verify)
        self._files: list[SafetensorsReader] = []
        try:
            for r, entry in enumerate(self.manifest.ranks):
                path = self.folder / entry.file
                if not path.is_file():
                    raise CheckpointError(
                        f"missing rank file {path} (rank {r} of world size "
                        f"{self.manifest.world_size}); the checkpoint is incomplete"
                    )
                size = path.stat().st_size
                if size != entry.bytes:
                    raise CheckpointError(
                        f"{path} is truncated or was modified: {size} bytes, the manifest says {entry.bytes}"
                    )
                self._files.append(SafetensorsReader(path, entry.checksums if verify else None))
        except BaseException:
            self.close()
            raise
        self.params: dict[str, ParamEntry] = {p.name: p for p in self.manifest.params}
        # name -> sorted [(start, stop, rank)] of the saved fragments.
        self._index: dict[str, list[tuple[int, int, int]]] = {}
        for r, entry in enumerate(self.manifest.ranks):
            for name, a, b in entry.fragments:
                self._index.setdefault(name, []).append((a, b, r))
        for pieces in self._index.values():
            pieces.sort()
        self._starts = {n: [a for a, _, _ in p] for n, p in self._index.items()}
        # name -> sorted [(start, stop, rank)] of the saved frozen fragments (stage 3 shards frozen params).
        self._frozen_index: dict[str, list[tuple[int, int, int]]] = {}
        for r, entry in enumerate(self.manifest.ranks):
            for name, a, b in entry.frozen_fragments:
                self._frozen_index.setdefault(name, []).append((a, b, r))
        for pieces in self._frozen_index.values():
            pieces.sort()
        self._replicated_names = {e.name for e in self.manifest.replicated}

    def read(self, kind: str, name: str, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of the flattened fp32 `kind` state of param `name`.

        Scalar state saved once per fragment (the optimizer `step`) is answered with that scalar, shape (1,).
        """
        param = self.params.get(name)
        if param is None or not param.trainable:
            raise CheckpointError(f"{self.folder} holds no trainable param {name!r}")
        if kind not in self.manifest.kinds:
            raise CheckpointError(
                f"{self.folder} holds no {kind!r} state (it has {list(self.manifest.kinds)}); "
                "was it saved with another optimizer?"
            )
        if not 0 <= start < stop <= param.numel:
            raise CheckpointError(
                f"range [{start}, {stop}) is outside param {name!r} of {param.numel} elements"
            )
        pieces = self._index[name]
        i = max(0, bisect.bisect_right(self._starts[name], start) - 1)
        out: torch.Tensor | None = None
        while i < len(pieces) and pieces[i][0] < stop:
            a, b, r = pieces[i]
            i += 1
            if b <= start:
                continue
            key = fragment_key(kind, name, a)
            file = self._files[r]
            entry = file.entry(key)
            if entry.numel != b - a:
                if entry.numel == 1:
                    return file.read_flat(key, 0, 1).to(torch.float32)
                raise CheckpointError(
                    f"{file.path}: tensor {key!r} has {entry.numel} elements, its fragment "
                    f"[{a}, {b}) needs {b - a}"
                )
            lo, hi = max(a, start), min(b, stop)
            if out is None:
                out = torch.empty(stop - start, dtype=torch.float32)
            if entry.dtype == torch.float32:  # straight from the file into place: no temporary copy
                file.read_into(key, lo - a, out[lo - start : hi - start])
            else:
                out[lo - start : hi - start] = file.read_flat(key, lo - a, hi - a)
        if out is None:
            raise CheckpointError(f"{self.folder}: no fragment holds {kind} of {name!r}[{start}:{stop}]")
        return out

    def is_scalar(self, kind: str, name: str) -> bool:
        """Whether `kind` is saved as one element per fragment (the optimizer step) rather than per element."""
        a, b, r = self._index[name][0]
        return b - a != 1 and self._files[r].entry(fragment_key(kind, name, a)).numel == 1

    def full_param(self, name: str, kind: str = "master") -> torch.Tensor:
        """The whole fp32 `kind` state of a trainable param, in its shape."""
        param = self.params[name]
        if param.numel == 0:
            return torch.zeros(param.shape, dtype=torch.float32)
        return self.read(kind, name, 0, param.numel).view(param.shape)

    def frozen_param(self, name: str) -> torch.Tensor:
        """The whole value of a frozen param, in its saved dtype and shape, wherever it was saved: from the
        ranks' frozen fragments (stage 3) or from the replicated state (stages 0-2, older checkpoints)."""
        param = self.params.get(name)
        if param is None or param.trainable:
            raise CheckpointError(f"{self.folder} holds no frozen param {name!r}")
        if name in self._replicated_names:
            return self.replicated(name)
        return self.read_frozen(name, 0, param.numel).view(param.shape)

    def read_frozen(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of the flattened frozen param `name`, in its saved dtype."""
        param = self.params.get(name)
        if param is None or param.trainable:
            raise CheckpointError(f"{self.folder} holds no frozen param {name!r}")
        if name in self._replicated_names:
            return self.replicated(name).reshape(-1)[start:stop].clone()
        out: torch.Tensor | None = None
        for a, b, r in self._frozen_index.get(name, ()):
            lo, hi = max(a, start), min(b, stop)
            if lo >= hi:
                continue
            piece = self._files[r].read_flat(f"frozen/{name}/{a}", lo - a, hi - a)
            if out is None:
                out = torch.empty(stop - start, dtype=piece.dtype)
            out[lo - start : hi - start] = piece
        if out is None:
            if start == stop:
                return torch.empty(0, dtype=dtype_from_name(param.dtype))
            raise CheckpointError(f"{self.folder}: no frozen fragment holds {name!r}[{start}:{stop}]")
        return out

    def holds_sharded_frozen(self, name: str) -> bool:
        """Whether frozen param `name` was saved as fragments (not in the replicated state)."""
        return name in self._frozen_index

    def replicated(self, name: str) -> torch.Tensor:
        return self._files[0].read(f"replicated/{name}")

    def replicated_state(self) -> dict[str, torch.Tensor]:
        return {e.name: self.replicated(e.name) for e in self.manifest.replicated}

    def extra(self, rank: int) -> dict:
        """The `extra` rank `rank` saved; a rank beyond the saved world size gets rank 0's."""
        r = rank if rank < self.manifest.world_size else 0
        entry = self.manifest.ranks[r]
        return decode_extra(entry.extra, self._files[r].read)

    def param_dtype(self, name: str) -> torch.dtype:
        return dtype_from_name(self.params[name].dtype)

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
