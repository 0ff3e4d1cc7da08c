"""NVMe optimizer offload: the fp32 master and optimizer state of a rank's shard in a swap file.

This module owns the storage of `offload_optimizer.device == "nvme"`: one swap file per rank under
`nvme_path`, split into chunks (shard_optimizer.Chunk: one per gradient bucket's shard, stages 1/2 bucket or
stage 3 unit bucket), streamed through `buffer_count` host buffers (pinned when asked and an accelerator
exists) by one background I/O thread: while chunk i steps, chunk i+1.. are read ahead into free buffers and
chunk i-1 is written behind. Host memory for master + state stays `buffer_count` chunks, whatever the model
size. It also owns synchronous range reads/writes (checkpoints, construction), disk-space/path errors, and
removing the file on close, garbage collection or interpreter exit. The optimizer step over the chunks is
shard_optimizer.py's; the grads and collectives are the engine's.

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
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .. import placement


class NvmeError(ValueError):
    """A swap-file problem the user fixes (path, permissions, space); the message names the fix."""


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


def _full_error(option: str, folder: str, needed_bytes: int) -> NvmeError:
    free = shutil.disk_usage(folder).free
    return NvmeError(
        f"{option}.nvme_path {folder} is full: {needed_bytes} bytes needed, {free} free; "
        "free space there or point nvme_path at a larger disk"
    )


class SwapStore:
    """Chunks of `kinds` tensors of one dtype in one file, streamed through `buffer_count` host buffers.

    `option` names the recipe block the folder came from (offload_optimizer / offload_param) in errors.
    `buffer_count=0` allocates no streaming buffers: only read/read_into/write (random access) are used.
    """

    def __init__(
        self,
        folder: str,
        chunk_numels: list[int],
        kinds: tuple[str, ...],
        buffer_count: int,
        *,
        rank: int = 0,
        pin: bool = False,
        dtype: torch.dtype = torch.float32,
        option: str = "offload_optimizer",
    ):
        if buffer_count < 1 and option == "offload_optimizer":
            raise NvmeError(f"{option}.buffer_count must be >= 1, got {buffer_count}")
        if not os.path.isdir(folder):
            what = "is not a folder" if os.path.exists(folder) else "does not exist"
            raise NvmeError(
                f"{option}.nvme_path {folder} {what}; create it (mkdir -p {folder}) or point "
                "nvme_path at a folder on a local NVMe disk"
            )
        self.option = option
        self.dtype = dtype
        self._element_bytes = torch.empty((), dtype=dtype).element_size()
        self.folder = folder
        self.kinds = kinds
        self.chunk_numels = list(chunk_numels)
        self._bases: list[int] = []
        cursor = 0
        for numel in self.chunk_numels:
            self._bases.append(cursor)
            cursor += numel * len(kinds) * self._element_bytes
        self.file_bytes = cursor
        """Bytes of the swap file: everything this rank keeps there."""
        what = "optim" if option == "offload_optimizer" else "param"
        self.path = os.path.join(
            folder, f"zerolaunch-{what}-rank{rank}-{os.getpid()}-{uuid.uuid4().hex[:8]}.swap"
        )
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise NvmeError(
                f"{option}.nvme_path {folder} is not writable ({e.strerror}); fix its permissions "
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
                raise _full_error(option, folder, self.file_bytes) from None
            raise NvmeError(
                f"{option}.nvme_path {folder}: cannot size the swap file ({e.strerror})"
            ) from None
        self._fd = fd
        slot_numel = max(self.chunk_numels, default=0) * len(kinds)
        self.buffers = [
            placement.empty(slot_numel, torch.device("cpu"), dtype=dtype, pin=pin)
            for _ in range(buffer_count)
        ]
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
                raise _full_error(self.option, self.folder, self.file_bytes) from None
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
        return self._bases[chunk] + (k * chunk_numel + start) * self._element_bytes

    def read(self, kind: str, chunk: int, start: int, numel: int) -> torch.Tensor:
        """A new tensor of `kind` elements [start, start + numel) of `chunk`."""
        out = torch.empty(numel, dtype=self.dtype)
        self.read_into(kind, chunk, start, out)
        return out

    def read_into(self, kind: str, chunk: int, start: int, out: torch.Tensor) -> None:
        """out (a contiguous host tensor of the store's dtype) <- `kind` elements [start, start + n)."""
        self._check_open()
        self._io.submit(self._pread, out, self._file_offset(kind, chunk, start, out.numel())).result()

    def write(self, kind: str, chunk: int, start: int, values: torch.Tensor) -> None:
        """`kind` elements [start, start + values.numel()) of `chunk` <- values (cast to the dtype)."""
        self._check_open()
        src = values.detach().reshape(-1).to(device="cpu", dtype=self.dtype).contiguous()
        self._io.submit(self._pwrite, src, self._file_offset(kind, chunk, start, src.numel())).result()
