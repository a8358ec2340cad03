"""The fragment store interface, and opening a store from its URL.

A store holds fragment files under `<store URL>/<journal>/<path postfix>/<name>`. Stores move
whole files: put a local file, get a file or a byte range, list by prefix, remove, and sign
a URL that a batch tool can read directly.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


class StoreError(Exception):
    """A store operation failed (unreachable, permission, missing object...)."""


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One object of a listing: its path relative to the listed prefix, size and mod time."""

    path: str
    size: int
    mod_time: int  # Unix seconds.


class FragmentStore(abc.ABC):
    """One configured store (one URL). Paths are relative to the store URL."""

    def __init__(self, url: str) -> None:
        self.url = url

    @abc.abstractmethod
    async def put_file(self, path: str, local: Path, *, content_encoding: str = "") -> None:
        """Store the local file's bytes at `path`, atomically (all or nothing)."""

    @abc.abstractmethod
    async def get(self, path: str, *, start: int = 0, length: int = -1) -> bytes:
        """Bytes of the object at `path`, or a range of them."""

    @abc.abstractmethod
    async def list_files(self, prefix: str) -> list[StoredFile]:
        """Every object whose path starts with `prefix` (a directory-like prefix ending '/')."""

    @abc.abstractmethod
    async def remove(self, path: str) -> None:
        """Remove the object at `path` (missing objects are not an error)."""

    @abc.abstractmethod
    def signed_url(self, path: str, ttl_seconds: float) -> str:
        """A URL from which a reader without store credentials may GET the object."""

    @abc.abstractmethod
    def local_path(self, path: str) -> Path | None:
        """The object's file on this machine, if the store is a local file system."""


def open_store(url: str, *, file_root: Path) -> FragmentStore:
    """A store for `url`. `file://` URLs are rooted under `file_root`."""
    scheme = urlsplit(url).scheme
    if scheme == "file":
        from pygazette.stores.file_store import FileStore

        return FileStore(url, file_root)
    raise StoreError(f"unsupported fragment store scheme {scheme!r} ({url})")


class StoreRegistry:
    """Opens each store URL once and hands out the shared instance."""

    def __init__(self, file_root: Path) -> None:
        self.file_root = file_root
        self._stores: dict[str, FragmentStore] = {}

    def get(self, url: str) -> FragmentStore:
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = open_store(url, file_root=self.file_root)
        return store
