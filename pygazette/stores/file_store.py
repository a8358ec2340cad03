"""The `file://` fragment store: a directory tree under a configured root.

`file:///a/b/` maps to `<root>/a/b/`. Puts write a temp file beside the target, fsync it and
rename it into place, so a crash never leaves a partial fragment under a fragment name. A
disposable source on the same file system (a compressed scratch file) is hard-linked rather
than copied. Spool files are always copied: spool recovery may cut a spool file, which must
never reach a persisted fragment.

Blocking file I/O runs on the file stores' own threads (FILE_STORE_THREADS): calls stuck on a
hung mount, abandoned and retried, take up at most those, never the default executor that
appends write spools on, and calls queued behind them and cancelled never start. Cancelling
a put cannot stop its thread: an abandoned put's thread drops whatever it reads after the
cancellation and never renames its file into place (`FragmentStore.put_file`).

Signed URLs are `file:///<path under the root>`, relative to the root as Gazette signs them:
readers resolve them under their own file root.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pygazette.stores.interface import (
    FragmentStore,
    ObjectRange,
    StoreAuthError,
    StoredFile,
    StoreError,
    StoreNotFound,
)
from pygazette.stores.store_url import StoreURL

_PUT_PREFIX = ".put-"
FILE_STORE_THREADS = 16
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()

T = TypeVar("T")


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking file system call on the file stores' thread pool."""
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(
                    FILE_STORE_THREADS, thread_name_prefix="pygazette-file-store"
                )
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor, functools.partial(fn, *args, **kwargs))


_COPY_CHUNK = 1 << 20


def _check(abandoned: threading.Event, target: Path) -> None:
    if abandoned.is_set():
        raise StoreError(f"put of {target} abandoned (cancelled)")


def _failed(what: str, exc: OSError) -> StoreError:
    """`what` failed with `exc`: a StoreAuthError if the file system refused permission."""
    cls = StoreAuthError if isinstance(exc, PermissionError) else StoreError
    return cls(f"{what}: {exc}")


def _unless_gone(exc: OSError) -> None:
    if not isinstance(exc, FileNotFoundError):
        raise exc


class FileStore(FragmentStore):
    def __init__(self, url: StoreURL, root: Path) -> None:
        super().__init__(url.url)
        if url.scheme != "file":
            raise StoreError(f"not a file:// store: {url.url}")
        self.parsed = url
        self.root = root.resolve()
        # Joined lexically, as Gazette joins root and path: a store directory that is a
        # symbolic link (a volume linked into the root) is followed by the OS, not refused
        # for resolving outside the root. Only the URL's own '..' may not leave the root.
        root_text = str(self.root)
        base_text = os.path.normpath(os.path.join(root_text, url.prefix))
        if base_text != root_text and not base_text.startswith(os.path.join(root_text, "")):
            raise StoreError(f"store {url.url} escapes the file root {self.root}")
        self.base = Path(base_text)
        self._base_text = base_text
        self._base_prefix = os.path.join(self._base_text, "")  # With its trailing separator.

    def _resolve(self, path: str) -> Path:
        """The file of `path` under the store's base, refused if `..` takes it outside.

        Lexical, as Gazette's file store joins its paths: no system call (a broker resolves
        a path for every fragment it lists, persists or reads). So was the base, under the
        resolved root; a symbolic link the operator placed in the store is followed by the OS."""
        full = os.path.normpath(os.path.join(self._base_text, self.parsed.rewrite(path)))
        if full != self._base_text and not full.startswith(self._base_prefix):
            raise StoreError(f"path {path!r} escapes store {self.url}")
        return Path(full)

    def local_path(self, path: str) -> Path | None:
        return self._resolve(path)

    async def put_file(
        self,
        path: str,
        local: Path,
        *,
        content_encoding: str = "",
        disposable: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        # A file system keeps no Content-Encoding: the file holds the bytes as given.
        abandoned = threading.Event()
        try:
            await _run(
                self._put_file,
                self.base,
                self._resolve(path),
                local,
                disposable,
                abandoned,
                progress,
            )
        except asyncio.CancelledError:
            abandoned.set()  # Its thread goes on (maybe hung), but lands nothing now.
            raise

    @staticmethod
    def _put_file(
        base: Path,
        target: Path,
        local: Path,
        disposable: bool,
        abandoned: threading.Event,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        # As Gazette's file store: the store's own directory must exist; only the
        # directories below it are made. A missing one is most likely a volume that is not
        # mounted, and writing there would put fragments where no reader looks. Refused as
        # Gazette refuses it (an authorization-class error: the store is unhealthy, and a
        # broker persists to the journal's next store, or keeps the spool, until it is back).
        if not os.path.isdir(base):
            raise StoreAuthError(
                f"file store directory {base} does not exist (is its volume mounted?)"
            )
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _failed(f"cannot write under {target.parent}", exc) from exc
        tmp = str(target.parent / f"{_PUT_PREFIX}{uuid.uuid4().hex}")
        try:
            linked = False
            if disposable:
                try:
                    os.link(local, tmp)
                    # The store's mod time is when the fragment was stored, as with a copy:
                    # batch jobs select fragments persisted in a time window by it.
                    os.utime(tmp)
                    linked = True
                    if progress is not None:
                        progress(os.stat(tmp).st_size)
                except OSError:
                    Path(tmp).unlink(missing_ok=True)
            if not linked:
                copied = 0
                with open(tmp, "xb") as out, open(local, "rb") as src:
                    while chunk := src.read(_COPY_CHUNK):
                        # Read after the put was abandoned: `local` may hold other bytes
                        # by now (a spool file reused once a retry persisted it).
                        _check(abandoned, target)
                        out.write(chunk)
                        copied += len(chunk)
                        if progress is not None:
                            progress(copied)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _check(abandoned, target)  # Abandoned: a retry owns the target now.
            os.replace(tmp, target)
            dir_fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise _failed(f"writing {target} failed", exc) from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def exists(self, path: str) -> bool:
        full = self._resolve(path)
        try:
            return await _run(full.is_file)
        except OSError as exc:
            raise _failed(f"checking {full} failed", exc) from exc

    async def read(self, path: str, *, start: int = 0, length: int = -1) -> ObjectRange:
        return await _run(self._read, self._resolve(path), start, length)

    @staticmethod
    def _read(full: Path, start: int, length: int) -> ObjectRange:
        try:
            with open(full, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = os.pread(f.fileno(), size if length < 0 else length, start)
        except FileNotFoundError as exc:
            raise StoreNotFound(f"no such fragment file {full}") from exc
        except OSError as exc:
            raise StoreError(f"reading {full} failed: {exc}") from exc
        return ObjectRange(data=data, content_encoding="", size=size)

    async def list_files(self, prefix: str) -> list[StoredFile]:
        return await _run(self._list_files, prefix)

    def _list_files(self, prefix: str) -> list[StoredFile]:
        top = self._resolve(prefix)
        if not top.is_dir():
            return []
        out = []
        try:
            # A directory that cannot be read fails the listing, as Gazette's (its Walk's
            # error): os.walk would leave it out, and a listing without some of a journal's
            # fragments has readers jump over their offsets (e.g. a postfix directory
            # Gazette made 0750 as another user). One removed meanwhile is just gone.
            walk = list(os.walk(top, onerror=_unless_gone))
        except OSError as exc:
            raise StoreError(f"listing {top} failed: {exc}") from exc
        for dirpath, _dirs, files in walk:
            for name in files:
                if name.startswith(_PUT_PREFIX):
                    continue  # An in-flight or abandoned put.
                full = Path(dirpath) / name
                try:
                    st = _stat(full)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise StoreError(f"listing {top} failed: {exc}") from exc
                rel = full.relative_to(top).as_posix()
                out.append(StoredFile(path=rel, size=st.st_size, mod_time=int(st.st_mtime)))
        return out

    async def remove(self, path: str) -> None:
        full = self._resolve(path)
        try:
            await _run(full.unlink, missing_ok=True)
        except OSError as exc:
            raise _failed(f"removing {full} failed", exc) from exc

    async def signed_url(self, path: str, ttl_seconds: float) -> str:
        """`file:///<path under the file root>`, relative to the root, exactly as Gazette signs.

        Readers map it under their own file root (Gazette's client: InstallFileTransport;
        ours: `file_root`), so a store shared over NFS works wherever it is mounted.
        """
        return "file:///" + self._resolve(path).relative_to(self.root).as_posix()


def _stat(full: Path) -> os.stat_result:
    """A listed file's size and mod time: its target's, for a symbolic link to a fragment,
    else the link's own, as Gazette's listing (filepath.Walk's Lstat) reports a link that
    cannot be followed (a loop, ELOOP; a target it may not search, EACCES): an entry the
    listing then leaves out as no fragment, rather than a listing that fails for it."""
    try:
        return full.stat()
    except FileNotFoundError:
        raise  # Removed meanwhile (or a dangling link): not listed.
    except OSError:
        return full.lstat()
