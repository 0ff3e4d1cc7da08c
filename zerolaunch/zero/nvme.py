"""NVMe optimizer offload: the fp32 master and optimizer state of a rank's shard in a swap file.

This module owns `offload_optimizer.device == "nvme"`: one swap file per rank under `nvme_path`, split into
chunks (one per gradient bucket's shard: stages 1/2 bucket, stage 3 unit bucket), streamed through
`buffer_count` host buffers (pinned when asked and an accelerator exists) by one background I/O thread:
while chunk i steps, chunk i+1.. are read ahead into free buffers and chunk i-1 is written behind. Host
memory for master + state stays `buffer_count` chunks, whatever the model size. It also owns the per-chunk
optimizer step (a torch optimizer whose param and state are the chunk's views in a buffer), synchronous
range reads/writes for the checkpoint contract, disk-space/path errors, and removing the file on close,
garbage collection or interpreter exit. It does not own the grads (the engine's host grad shards) nor the
collectives (the engine publishes each stepped chunk through its `on_stepped` callback).

[Note: swap file layout]
Chunk c occupies `len(kinds) * numel_c` fp32 elements, at the sum of the earlier chunks' sizes; inside
it, kind k (kinds[0] is "master", then the optimizer's state kinds) is elements [k * numel_c, (k+1) *
numel_c). A chunk is one contiguous read and one contiguous write.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from . import offload
from .optim import build_optimizer, state_kinds
from .options import OffloadOptions, OptimizerOptions

FP32_BYTES = 4


class NvmeError(ValueError):
    """A swap-file problem the user fixes (path, permissions, space); the message names the fix."""


@dataclass(frozen=True)
class Chunk:
    group: int
    """Optimizer param group."""
    offset: int
    """First element inside this rank's flat fp32 shard of `group`."""
    numel: int


def _bytes_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (no copy), for os.preadv / os.pwrite."""
    nbytes = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _close_file(fd: int, path: str, io: ThreadPoolExecutor) -> None:
    # a weakref.finalize callback: must not reference the store, so it gets what it frees.
    io.shutdown(wait=True)
    os.close(fd)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _full_error(folder: str, needed_bytes: int) -> NvmeError:
    free = shutil.disk_usage(folder).free
    return NvmeError(
        f"offload_optimizer.nvme_path {folder} is full: {needed_bytes} bytes needed, {free} free; "
        "free space there or point nvme_path at a larger disk"
    )


class SwapStore:
    """Chunks of `kinds` fp32 tensors in one file, streamed through `buffer_count` host buffers."""

    def __init__(
        self,
        folder: str,
        chunk_numels: list[int],
        kinds: tuple[str, ...],
        buffer_count: int,
        *,
        rank: int = 0,
        pin: bool = False,
    ):
        if buffer_count < 1:
            raise NvmeError(f"offload_optimizer.buffer_count must be >= 1, got {buffer_count}")
        if not os.path.isdir(folder):
            what = "is not a folder" if os.path.exists(folder) else "does not exist"
            raise NvmeError(
                f"offload_optimizer.nvme_path {folder} {what}; create it (mkdir -p {folder}) or point "
                "nvme_path at a folder on a local NVMe disk"
            )
        self.folder = folder
        self.kinds = kinds
        self.chunk_numels = list(chunk_numels)
        self._bases: list[int] = []
        cursor = 0
        for numel in self.chunk_numels:
            self._bases.append(cursor)
            cursor += numel * len(kinds) * FP32_BYTES
        self.file_bytes = cursor
        """Bytes of the swap file: the whole master + state of this rank."""
        self.path = os.path.join(
            folder, f"zerolaunch-optim-rank{rank}-{os.getpid()}-{uuid.uuid4().hex[:8]}.swap"
        )
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise NvmeError(
                f"offload_optimizer.nvme_path {folder} is not writable ({e.strerror}); fix its permissions "
                "or point nvme_path at a folder this user can write"
            ) from None
        try:
            # reserve the space now: a full disk fails here, not halfway through a step.
            if self.file_bytes:
                os.posix_fallocate(fd, 0, self.file_bytes)
        except OSError as e:
            os.close(fd)
            os.unlink(self.path)
            if e.errno == errno.ENOSPC:
                raise _full_error(folder, self.file_bytes) from None
            raise NvmeError(
                f"offload_optimizer.nvme_path {folder}: cannot size the swap file ({e.strerror})"
            ) from None
        self._fd = fd
        slot_numel = max(self.chunk_numels, default=0) * len(kinds)
        self.buffers = [offload.zeros(slot_numel, torch.device("cpu"), pin=pin) for _ in range(buffer_count)]
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerolaunch-nvme")
        self._finalizer = weakref.finalize(self, _close_file, fd, self.path, self._io)
        self.max_chunks_held = 0
        """Most buffers taken at once by chunks being read or in use."""
        self.bytes_read = 0
        self.bytes_written = 0

    # ---- sizes -------------------------------------------------------------------------------------------
    @property
    def buffer_bytes(self) -> int:
        """Host bytes of the staging buffers: everything of master + state that is ever in memory."""
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def close(self) -> None:
        """Wait for pending I/O, close and delete the swap file (also runs at GC and interpreter exit)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    # ---- I/O on the worker thread -----------------------------------------------------------------------
    def _region(self, slot: int, chunk: int) -> torch.Tensor:
        return self.buffers[slot][: self.chunk_numels[chunk] * len(self.kinds)]

    def _pread(self, dst: torch.Tensor, file_offset: int) -> None:
        view, done = _bytes_view(dst), 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], file_offset + done)
            if n == 0:
                raise NvmeError(
                    f"swap file {self.path} is shorter than expected; was it truncated or deleted?"
                )
            done += n
        self.bytes_read += done

    def _pwrite(self, src: torch.Tensor, file_offset: int) -> None:
        view, done = _bytes_view(src), 0
        try:
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], file_offset + done)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise _full_error(self.folder, self.file_bytes) from None
            raise NvmeError(f"writing swap file {self.path} failed ({e.strerror})") from None
        self.bytes_written += done

    def _check_open(self) -> None:
        if self.closed:
            raise NvmeError("the nvme swap store is closed (engine.close() was called); build a new engine")

    # ---- streaming ---------------------------------------------------------------------------------------
    def views(self, slot: int, chunk: int) -> dict[str, torch.Tensor]:
        numel = self.chunk_numels[chunk]
        region = self._region(slot, chunk)
        return {kind: region[k * numel : (k + 1) * numel] for k, kind in enumerate(self.kinds)}

    def sweep(
        self, order: Iterable[int], *, read: bool = True, write: bool = True
    ) -> Iterator[tuple[int, dict]]:
        """Yield (chunk, {kind: fp32 view}) for each chunk of `order`, the views valid until the next item.

        Chunks after the current one are read ahead into free buffers; a yielded chunk is written back
        (write=True) once the consumer asks for the next. read=False skips reading (the consumer fills
        every element, e.g. at initialization). One FIFO I/O thread keeps a buffer's write before its
        reuse by a later read.
        """
        self._check_open()
        todo = iter(order)
        free = deque(range(len(self.buffers)))
        loading: deque[tuple[int, int, Future | None]] = deque()
        writes: deque[Future] = deque()
        last_write: list[Future | None] = [None] * len(self.buffers)

        def read_ahead() -> None:
            while free:
                chunk = next(todo, None)
                if chunk is None:
                    return
                slot = free.popleft()
                fut = (
                    self._io.submit(self._pread, self._region(slot, chunk), self._bases[chunk])
                    if read
                    else None
                )
                loading.append((chunk, slot, fut))
                self.max_chunks_held = max(self.max_chunks_held, len(self.buffers) - len(free))

        try:
            read_ahead()
            while loading:
                chunk, slot, fut = loading.popleft()
                if fut is not None:
                    fut.result()
                elif last_write[slot] is not None:
                    # no read is queued behind this buffer's write-behind: wait for it before the refill.
                    last_write[slot].result()
                yield chunk, self.views(slot, chunk)
                if write:
                    last_write[slot] = self._io.submit(
                        self._pwrite, self._region(slot, chunk), self._bases[chunk]
                    )
                    writes.append(last_write[slot])
                while writes and writes[0].done():
                    writes.popleft().result()  # surfaces a write error early
                free.append(slot)
                read_ahead()
        finally:
            # nothing may still target the buffers once the sweep ends (or is abandoned).
            for pending in [f for _, _, f in loading if f is not None] + list(writes):
                pending.result()

    # ---- random access (checkpoints) --------------------------------------------------------------------
    def _file_offset(self, kind: str, chunk: int, start: int, numel: int) -> int:
        chunk_numel = self.chunk_numels[chunk]
        if not (0 <= start and start + numel <= chunk_numel):
            raise IndexError(f"elements [{start}, {start + numel}) are outside chunk {chunk} ({chunk_numel})")
        k = self.kinds.index(kind)
        return self._bases[chunk] + (k * chunk_numel + start) * FP32_BYTES

    def read(self, kind: str, chunk: int, start: int, numel: int) -> torch.Tensor:
        """A new fp32 tensor of `kind` elements [start, start + numel) of `chunk`."""
        self._check_open()
        out = torch.empty(numel, dtype=torch.float32)
        self._io.submit(self._pread, out, self._file_offset(kind, chunk, start, numel)).result()
        return out

    def write(self, kind: str, chunk: int, start: int, values: torch.Tensor) -> None:
        """`kind` elements [start, start + values.numel()) of `chunk` <- values."""
        self._check_open()
        src = values.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()
        self._io.submit(self._pwrite, src, self._file_offset(kind, chunk, start, src.numel())).result()


class NvmeOptimizer:
    """A rank's fp32 master + optimizer state in a SwapStore, stepped one chunk at a time."""

    def __init__(
        self,
        options: OptimizerOptions,
        offload_options: OffloadOptions,
        chunks: list[Chunk],
        group_weight_decays: list[float],
        *,
        rank: int = 0,
    ):
        if not offload_options.nvme_path:
            raise NvmeError(
                "offload_optimizer.device is nvme but no nvme_path is given; add nvme_path: /local/nvme"
            )
        self.chunks = chunks
        self.state_kinds = state_kinds(options)
        self.counts_steps = options.name in ("adam", "adamw")
        """Adam keeps a step count (checkpointed as "step"); SGD keeps none, as torch's."""
        self.store = SwapStore(
            offload_options.nvme_path,
            [c.numel for c in chunks],
            ("master", *self.state_kinds),
            offload_options.buffer_count,
            rank=rank,
            pin=offload_options.pin_memory,
        )
        # one torch optimizer per param group whose single param is swapped for each chunk's master view;
        # the placeholder only satisfies the constructor and is never stepped.
        self._placeholders = [torch.zeros(1) for _ in group_weight_decays]
        self.optimizers = [
            build_optimizer(options, [{"params": [p], "weight_decay": wd}], torch.device("cpu"))
            for p, wd in zip(self._placeholders, group_weight_decays, strict=True)
        ]
        self.step_count = 0
        """Optimizer steps taken (the Adam "step" every element shares)."""

    @property
    def host_bytes(self) -> int:
        return self.store.buffer_bytes

    @property
    def nvme_bytes(self) -> int:
        return self.store.file_bytes

    def close(self) -> None:
        self.store.close()

    def initialize(self, fill: Callable[[int, torch.Tensor], None]) -> None:
        """fill(chunk, master_view) writes each chunk's initial fp32 master; the state starts at zero."""
        for c, views in self.store.sweep(range(len(self.chunks)), read=False):
            fill(c, views["master"])
            for kind in self.state_kinds:
                views[kind].zero_()

    @torch.no_grad()
    def step(
        self, grads: list[torch.Tensor], lr: float, on_stepped: Callable[[int, torch.Tensor], None]
    ) -> None:
        """Step every chunk with its slice of `grads` (per-group flat fp32 grad shards) at `lr`;
        on_stepped(chunk, master_view) runs while the chunk is still in its buffer."""
        for c, views in self.store.sweep(range(len(self.chunks))):
            chunk = self.chunks[c]
            master = views["master"]
            opt = self.optimizers[chunk.group]
            group = opt.param_groups[0]
            state = {kind: views[kind] for kind in self.state_kinds}
            if self.counts_steps:
                state["step"] = torch.tensor(float(self.step_count))
            master.grad = grads[chunk.group][chunk.offset : chunk.offset + chunk.numel]
            group["params"], group["lr"] = [master], lr
            opt.state[master] = state
            try:
                opt.step()
            finally:
                stepped = opt.state.pop(master)
                group["params"] = [self._placeholders[chunk.group]]
                master.grad = None
            for kind in self.state_kinds:
                if stepped[kind] is not views[kind]:  # an optimizer that replaced its state tensor
                    views[kind].copy_(stepped[kind])
            on_stepped(c, master)
        self.step_count += 1

    # ---- checkpoint access ----------------------------------------------------------------------------
    def locate(self, group: int, offset: int, numel: int) -> tuple[int, int]:
        """(chunk, start inside it) of shard elements [offset, offset + numel) of `group` (one chunk)."""
        for c, chunk in enumerate(self.chunks):
            if (
                chunk.group == group
                and chunk.offset <= offset
                and offset + numel <= chunk.offset + chunk.numel
            ):
                return c, offset - chunk.offset
        raise IndexError(f"shard elements [{offset}, {offset + numel}) of group {group} span no single chunk")

    def read(self, kind: str, group: int, offset: int, numel: int) -> torch.Tensor:
        c, start = self.locate(group, offset, numel)
        return self.store.read(kind, c, start, numel)

    def write(self, kind: str, group: int, offset: int, values: torch.Tensor) -> None:
        c, start = self.locate(group, offset, values.numel())
        self.store.write(kind, c, start, values)
