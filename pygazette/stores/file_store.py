"""The `file://` fragment store: a directory tree under a configured root.

`file:///a/b/` maps to `<root>/a/b/`. Puts write a temp file beside the target, fsync it and
rename it into place, so a crash never leaves a partial fragment under a fragment name.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pygazette.stores.store import FragmentStore, StoredFile, StoreError


class FileStore(FragmentStore):
    def __init__(self, url: str, root: Path) -> None:
        super().__init__(url)
        parts = urlsplit(url)
        if parts.scheme != "file":
            raise StoreError(f"not a file:// store: {url}")
        rel = unquote(parts.netloc + parts.path).lstrip("/")
        self.prefix = rel  # The store's directory under the root: "" or "a/b/".
        self.root = root.resolve()
        self.base = (self.root / rel).resolve()
        if self.base != self.root and self.root not in self.base.parents:
            raise StoreError(f"store {url} escapes the file root {self.root}")

    def _resolve(self, path: str) -> Path:
        full = (self.base / path).resolve()
        if full != self.base and self.base not in full.parents:
            raise StoreError(f"path {path!r} escapes store {self.url}")
        return full

    def local_path(self, path: str) -> Path | None:
        return self._resolve(path)

    async def put_file(self, path: str, local: Path, *, content_encoding: str = "") -> None:
        await asyncio.to_thread(self._put_file, self._resolve(path), local)

    @staticmethod
    def _put_file(target: Path, local: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as out, open(local, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def get(self, path: str, *, start: int = 0, length: int = -1) -> bytes:
        return await asyncio.to_thread(self._get, self._resolve(path), start, length)

    @staticmethod
    def _get(full: Path, start: int, length: int) -> bytes:
        try:
            with open(full, "rb") as f:
                f.seek(start)
                return f.read() if length < 0 else f.read(length)
        except FileNotFoundError as exc:
            raise StoreError(f"no such fragment file {full}") from exc

    async def list_files(self, prefix: str) -> list[StoredFile]:
        return await asyncio.to_thread(self._list_files, prefix)

    def _list_files(self, prefix: str) -> list[StoredFile]:
        top = self._resolve(prefix)
        if not top.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                if name.startswith(".put-"):
                    continue  # An in-flight or abandoned put.
                full = Path(dirpath) / name
                try:
                    st = full.stat()
                except FileNotFoundError:
                    continue
                rel = full.relative_to(top).as_posix()
                out.append(StoredFile(path=rel, size=st.st_size, mod_time=int(st.st_mtime)))
        return out

    async def remove(self, path: str) -> None:
        self._resolve(path).unlink(missing_ok=True)

    def signed_url(self, path: str, ttl_seconds: float) -> str:
        """`file:///<store prefix><path>`, relative to the file root, exactly as Gazette signs.

        Readers map it under their own file root (Gazette's client: InstallFileTransport;
        ours: `file_root`), so a store shared over NFS works wherever it is mounted.
        """
        self._resolve(path)  # Refuse paths escaping the store.
        return f"file:///{self.prefix}{path}"
