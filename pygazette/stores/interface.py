"""The fragment store interface: `FragmentStore`, what it returns, and its errors.

A store holds fragment files under `<store URL>/<journal>/<path postfix>/<name>`. Stores move
whole files: put a local file, check that an object exists, read an object or a byte range
of it, list by prefix, remove, and sign a URL that a batch tool can read directly. Every
failure is a `StoreError` carrying a one-line reason; a missing object is `StoreNotFound`.

This module imports no other of `pygazette.stores`, so the implementations — `file://`
(`file_store`), and `s3://`, `gs://`, `azure://`, `azure-ad://` through obstore
(`object_store`, configured by `cloud_stores`) — import it, and `store`, which opens them,
imports them, without an import cycle.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class StoreError(Exception):
    """A store operation failed (unreachable, permission, bad configuration...)."""


class StoreNotFound(StoreError):
    """The object does not exist."""


class StoreAuthError(StoreError):
    """The store refused for want of authorization: permission denied, unauthenticated, or
    no such bucket (Gazette's `Store.IsAuthError`). A broker exiting persists its spools to
    the journal's next store instead (`Persister.exit`)."""


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One object of a listing: its path relative to the listed prefix, size and mod time."""

    path: str
    size: int
    mod_time: int  # Unix seconds.


@dataclass(frozen=True, slots=True)
class ObjectRange:
    """Bytes of an object as the store served them.

    `content_encoding` is the Content-Encoding they were served with ("gzip" when a
    GZIP_OFFLOAD_DECOMPRESSION fragment comes back still compressed; "" for identity, or
    when the store keeps no such metadata, as a file store). `size` is the object's total
    size in bytes.
    """

    data: bytes
    content_encoding: str
    size: int


class FragmentStore(abc.ABC):
    """One configured store (one URL). Paths are relative to the store URL."""

    def __init__(self, url: str) -> None:
        self.url = url

    @abc.abstractmethod
    async def put_file(
        self,
        path: str,
        local: Path,
        *,
        content_encoding: str = "",
        disposable: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Store the local file's bytes at `path`, atomically (all or nothing).

        `disposable` promises that `local` is never written again and is removed after the
        put, so a store may take the file over (a file store hard-links it) instead of
        copying it.

        A put may be cancelled (the persister abandons one past its deadline, and retries):
        whatever a store's call still does on a thread, it then lands nothing it read from
        `local` after the cancellation, which may be other bytes by then (a spool file
        reused once the retry persisted it). A put that lands anyway read its bytes before.

        `progress`, if given, is called (on any thread) with the number of bytes read from
        `local` so far as the put goes on: the persister abandons a put that makes none for
        a while, not one that is merely slow (a large fragment on a slow store).
        """

    @abc.abstractmethod
    async def exists(self, path: str) -> bool:
        """Whether an object is stored at `path`."""

    @abc.abstractmethod
    async def read(self, path: str, *, start: int = 0, length: int = -1) -> ObjectRange:
        """Bytes [start, start + length) of the object at `path` (to its end if length < 0).

        Fewer bytes than asked come back only at the end of the object; b"" past it.
        """

    async def get(self, path: str, *, start: int = 0, length: int = -1) -> bytes:
        """Bytes of the object at `path`, or a range of them."""
        return (await self.read(path, start=start, length=length)).data

    @abc.abstractmethod
    async def list_files(self, prefix: str) -> list[StoredFile]:
        """Every object whose path starts with `prefix` (a directory-like prefix ending '/')."""

    @abc.abstractmethod
    async def remove(self, path: str) -> None:
        """Remove the object at `path` (missing objects are not an error)."""

    @abc.abstractmethod
    async def signed_url(self, path: str, ttl_seconds: float) -> str:
        """A URL from which a reader without store credentials may GET the object."""

    @abc.abstractmethod
    def local_path(self, path: str) -> Path | None:
        """The object's file on this machine, if the store is a local file system."""
