"""Files of deleted spools, kept to be a new spool's files instead of creating fresh ones.

A spool is two files (`spool.py`), and a journal that takes appends rolls its spool after its
first write and every flush interval: removing a persisted spool's files and creating the
next spool's costs two unlinks and two inode allocations each time. On the benchmark VM's file
system (ext4 without a journal) an allocation scans the inodes deleted in the last minutes,
and took 0.3-1 ms of CPU once a broker had rolled a few thousand spools, more than the rest
of a small append's work. So a deleted spool's files are moved (renamed) into a pool
directory beside the journals' spool directories, `<spool root>/.#free`, and a new spool's
files are renamed out of it: no inode is freed or allocated. A file is emptied as it enters
the pool (a pool holds inodes, not data); one a killed broker left unemptied is emptied when
the next run lists the pool.

Only small files are kept (a large one's blocks would be freed when it is emptied, on the
event loop), and at most MAX_FILES a pool; others are removed as before. A pool's files are
nobody's: recovery never looks in it, and files a stopped broker left there are taken again
by the next run (listed once, on first use).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

# No journal's spool directory: "#" is in no journal name, and `replica.spool_directory` would
# quote it (".free" is a valid journal name, whose live spools must not be taken).
POOL_DIR = ".#free"
MAX_FILES = 1024
MAX_BYTES = 1 << 20

_lock = threading.Lock()
_pools: dict[Path, list[Path]] = {}  # Pool directory -> its files, in this process.


def _pool(directory: Path) -> list[Path]:
    """The pool of the spool root holding `directory` (a journal's spool directory), its
    directory made if missing. Holds _lock."""
    root = directory.parent / POOL_DIR
    files = _pools.get(root)
    if files is None:
        root.mkdir(exist_ok=True)
        files = _pools[root] = [p for p in root.iterdir() if p.is_file()][:MAX_FILES]
        for p in files:
            # Left by an earlier run, maybe killed before `give` emptied it: emptied before a
            # spool takes it, so that no deleted spool's log and content are renamed into a
            # journal's directory, to be recovered as its spool if a crash follows.
            os.truncate(p, 0)
    return files


def take(directory: Path, target: Path) -> bool:
    """Move a pooled file to `target` (in `directory`); False if there is none to take."""
    while True:
        with _lock:
            files = _pool(directory)
            if not files:
                return False
            source = files.pop()
        try:
            os.rename(source, target)  # Empty (`give`, `_pool`).
            return True
        except FileNotFoundError:
            continue  # Removed behind our back: take another.
        except OSError as exc:
            log.warning("cannot reuse a spool file", extra={"path": str(source), "error": str(exc)})
            return False


def give(directory: Path, path: Path, size: int) -> None:
    """Keep `path` (a deleted spool's file of `size` bytes, in `directory`) for a later spool,
    or remove it."""
    target: Path | None = None
    if size <= MAX_BYTES:
        try:
            with _lock:
                files = _pool(directory)
                if len(files) < MAX_FILES:
                    target = directory.parent / POOL_DIR / uuid.uuid4().hex
        except OSError:
            target = None  # No pool directory to be had: remove the file.
    if target is not None:
        try:
            os.rename(path, target)
        except OSError:
            target = None  # The pool's directory may be gone (or the file): removed.
    if target is None:
        path.unlink(missing_ok=True)
        return
    # Emptied before the pool offers it: a pool holds no data, only inodes.
    with contextlib.suppress(OSError):
        os.truncate(target, 0)
    with _lock:
        _pool(directory).append(target)
