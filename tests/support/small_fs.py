"""A small, real file system for full-disk tests: a size-capped tmpfs mounted by the test.

Mounting needs root (CAP_SYS_ADMIN); where it is not permitted the test is skipped with the
reason. `fill` takes the free space with a ballast file (written until the kernel answers
ENOSPC), and `free` gives it back, so a test can fill the disk under a live process and free
it again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

_CHUNK = 64 * 1024


class SmallFs:
    """A mounted size-capped tmpfs at `root`, with a ballast file to fill it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ballast = root / "ballast"

    def free_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Grow the ballast until at most `leave` bytes (rounded to pages) stay free."""
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            chunk = b"\xba" * _CHUNK
            while (want := self.free_bytes() - leave) > 0:
                try:
                    os.write(fd, chunk[: min(_CHUNK, want)])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        finally:
            os.close(fd)

    def free(self) -> None:
        """Remove the ballast: its space is free again."""
        self.ballast.unlink(missing_ok=True)


@contextlib.contextmanager
def mounted_tmpfs(root: Path, size: str = "8m") -> Iterator[SmallFs]:
    """Mount a tmpfs of `size` at `root` for the block; unmount it after (lazily if busy)."""
    root.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a size-capped tmpfs here: {mount.stderr.strip()}")
    try:
        yield SmallFs(root)
    finally:
        if subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], capture_output=True)
