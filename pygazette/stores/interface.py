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


class ObjectReader(abc.ABC):
    """An open read of one object's bytes, from a start, in chunks as the store sends them.

    `content_encoding` and `size` are as `ObjectRange`'s. `next()` returns the next chunk
    (at most about `chunk_size` bytes), and b"" once the bytes asked for have all come.
    A cloud store reads them over one GET, streamed as they are asked for: an object removed
    meanwhile is read to its end, as Gazette's broker reads the body of the GET it opened
    (retention, or `journals prune`, removing a fragment a read is serving). Not safe for
    concurrent use; `aclose()` releases the request (idempotent; a reader abandoned while a
    `next()` was in flight is closed once it returns).
    """

    content_encoding: str = ""
    size: int = -1

    @abc.abstractmethod
    async def next(self) -> bytes:
        """The next chunk of bytes; b"" at the end."""

    async def aclose(self) -> None:  # noqa: B027 (nothing to release, by default)
        """Release the request."""


class _RangedReader(ObjectReader):
    """An `ObjectReader` made of ranged `FragmentStore.read` calls, for stores that have no
    streaming read of their own."""

    def __init__(self, store: FragmentStore, path: str, start: int, end: int, chunk: int) -> None:
        self._store, self._path = store, path
        self._pos, self._end, self._chunk = start, end, chunk
        self._first: ObjectRange | None = None
        self._done = False

    async def open(self) -> _RangedReader:
        self._first = await self._read()
        self.content_encoding, self.size = self._first.content_encoding, self._first.size
        return self

    async def _read(self) -> ObjectRange:
        n = self._chunk if self._end < 0 else min(self._chunk, self._end - self._pos)
        got = await self._store.read(self._path, start=self._pos, length=n)
        self._pos += len(got.data)
        self._done = len(got.data) < n or 0 <= got.size <= self._pos or self._pos == self._end
        return got

    async def next(self) -> bytes:
        if self._first is not None:
            data, self._first = self._first.data, None
            return data
        if self._done:
            return b""
        return (await self._read()).data


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

    async def open_read(
        self, path: str, *, start: int = 0, length: int = -1, chunk_size: int = 1 << 20
    ) -> ObjectReader:
        """Open a read of bytes [start, start + length) of the object at `path` (to its end
        if length < 0), its chunks about `chunk_size` bytes. StoreNotFound if it is missing.

        This default reads `chunk_size` ranges one after another; cloud stores stream one GET.
        """
        end = -1 if length < 0 else start + length
        return await _RangedReader(self, path, start, end, chunk_size).open()

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
