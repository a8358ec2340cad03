"""`AppendBuffer`: the queued content of one asynchronous append, held on local disk.

Writes collect in a small in-memory front (at most `spill_size` bytes) that spills into an
anonymous temporary file (unlinked on creation, so the OS reclaims it whatever happens to
the process). A broker outage is therefore ridden out up to the capacity of the disk, not of
the heap. `truncate` rolls content back to an earlier size; `chunks` reads it back for an
Append RPC; `reset` empties the buffer for reuse. Buffers are pooled by `AppendBufferPool`.

Not thread-safe: an AppendService only touches a buffer under its journal's lock, or after
the buffer's append was sealed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import IO

# In-memory front of a buffer; beyond it, content goes to the temporary file.
SPILL_SIZE = 256 << 10
# Idle buffers kept for reuse by a pool.
POOL_SIZE = 16
# A reused buffer keeps the blocks of its file (overwriting them is cheaper than freeing and
# allocating them again), unless the file grew beyond this.
KEEP_FILE_BYTES = 16 << 20


class AppendBuffer:
    """Append-only bytes backed by an unlinked temporary file."""

    __slots__ = ("_dir", "_extent", "_file", "_file_size", "_mem", "spill_size")

    def __init__(self, directory: str | None = None, spill_size: int = SPILL_SIZE) -> None:
        if spill_size <= 0:
            raise ValueError(f"invalid spill size {spill_size}")
        self._dir = directory
        self.spill_size = spill_size
        self._mem = bytearray()
        self._file: IO[bytes] | None = None
        self._file_size = 0  # Bytes of content in the file...
        self._extent = 0  # ...which may be longer (with stale bytes after them).

    @property
    def size(self) -> int:
        """Bytes held (on disk and in memory)."""
        return self._file_size + len(self._mem)

    @property
    def on_disk(self) -> int:
        """Bytes held in the temporary file."""
        return self._file_size

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Add `data`. Raises OSError if the temporary file cannot take it (e.g. a full disk);
        the content already held is unaffected then, but `data` may be partly added: roll
        back with `truncate`."""
        if not self._mem and len(data) >= self.spill_size:
            self._write_file(memoryview(data).cast("B"))  # Large: straight to the file.
            return
        self._mem += data
        if len(self._mem) >= self.spill_size:
            self.spill()

    def spill(self) -> None:
        """Move the in-memory front to the temporary file."""
        if not self._mem:
            return
        view = memoryview(self._mem)
        before = self._file_size
        try:
            self._write_file(view)
        finally:
            view.release()
            # What reached the file leaves the front, all of it or (an OSError) a part.
            del self._mem[: self._file_size - before]

    def _write_file(self, view: memoryview) -> None:
        """Write `view` after the file's content (on an OSError, the file's content ends
        after the part that was written)."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self._dir, prefix="pygazette-append-")
        fd = self._file.fileno()
        written = 0
        try:
            while written < len(view):
                written += os.pwrite(fd, view[written:], self._file_size + written)
        finally:
            self._file_size += written
            self._extent = max(self._extent, self._file_size)

    def truncate(self, size: int) -> None:
        """Discard everything after the first `size` bytes."""
        if not 0 <= size <= self.size:
            raise ValueError(f"cannot truncate a buffer of {self.size} bytes to {size}")
        if size >= self._file_size:
            del self._mem[size - self._file_size :]
            return
        self._mem.clear()
        self._file_size = size  # Bytes after it are stale, and overwritten by later writes.

    def chunks(self, end: int, chunk_size: int) -> Iterator[bytes | memoryview]:
        """The first `end` bytes, in pieces of at most `chunk_size` bytes.

        In-memory content is returned as memoryviews: do not write to the buffer until
        they have been consumed.
        """
        if not 0 <= end <= self.size:
            raise ValueError(f"cannot read {end} bytes from a buffer of {self.size}")
        offset = 0
        if self._file is not None:
            fd = self._file.fileno()
            file_end = min(end, self._file_size)
            while offset < file_end:
                chunk = os.pread(fd, min(chunk_size, file_end - offset), offset)
                if not chunk:
                    raise OSError(f"append buffer file ended at {offset} of {file_end} bytes")
                offset += len(chunk)
                yield chunk
        mem = memoryview(self._mem)
        while offset < end:
            start = offset - self._file_size
            piece = mem[start : start + min(chunk_size, end - offset)]
            offset += len(piece)
            yield piece

    def read_all(self, end: int | None = None) -> bytes:
        """The first `end` bytes (default: all) as one bytes object."""
        return b"".join(bytes(c) for c in self.chunks(self.size if end is None else end, 1 << 20))

    def reset(self) -> None:
        """Empty the buffer, keeping its temporary file for reuse."""
        self._mem = bytearray()
        if self._file is not None and self._extent > KEEP_FILE_BYTES:
            os.ftruncate(self._file.fileno(), 0)
            self._extent = 0
        self._file_size = 0

    def close(self) -> None:
        self._mem = bytearray()
        self._file_size = self._extent = 0
        if self._file is not None:
            self._file.close()
            self._file = None


class AppendBufferPool:
    """Reuses AppendBuffers (and their temporary files) across appends."""

    def __init__(
        self, directory: str | None = None, spill_size: int = SPILL_SIZE, keep: int = POOL_SIZE
    ) -> None:
        if directory is not None and not os.path.isdir(directory):
            raise ValueError(f"append buffer directory {directory!r} is not a directory")
        self.directory = directory
        self.spill_size = spill_size
        self.keep = keep
        self._idle: list[AppendBuffer] = []

    def get(self) -> AppendBuffer:
        try:
            return self._idle.pop()
        except IndexError:
            return AppendBuffer(self.directory, self.spill_size)

    def put(self, buf: AppendBuffer) -> None:
        try:
            buf.reset()
        except OSError:
            buf.close()
            return
        if len(self._idle) < self.keep:
            self._idle.append(buf)
        else:
            buf.close()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for buf in idle:
            buf.close()
