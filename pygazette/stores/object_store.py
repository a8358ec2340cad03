"""Fragment stores on cloud object storage, through obstore (S3, GCS, Azure).

`ObjectStore` adapts one configured obstore store (bucket and prefix already applied) to the
`FragmentStore` interface. Calls use obstore's blocking API on a dedicated pool of worker
threads (STORE_THREADS): obstore releases the GIL while its Rust runtime does the I/O, and —
unlike its asyncio API, whose runtime threads may still hold Python objects when the
interpreter exits, aborting the process — nothing of it outlives the call. A dedicated pool
keeps slow store calls from starving the default executor that appends write spools on.
Its errors — long, multi-line reports — become `StoreError`s with a one-line reason.

Reads of objects (`open_read`) stream one GET, a chunk at a time as the reader asks for it
(the connection's flow control holds the rest back: memory stays at a chunk or two), so
that an object removed meanwhile is read to its end, as Gazette's broker reads the body of
the GET it opened. They go through a second client of the store (`stream_store`) whose
requests have no short overall deadline, only one on stalls (no bytes for a while): a
reader may take its time over a large fragment.
"""

from __future__ import annotations

import asyncio
import functools
import html
import io
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import obstore
from obstore.exceptions import (
    BaseError,
    InvalidPathError,
    PermissionDeniedError,
    UnauthenticatedError,
)

from pygazette.stores.interface import (
    FragmentStore,
    ObjectRange,
    ObjectReader,
    StoreAuthError,
    StoredFile,
    StoreError,
    StoreNotFound,
)
from pygazette.stores.store_url import StoreURL

if TYPE_CHECKING:
    from obstore import BytesStream
    from obstore.store import AzureStore, GCSStore, S3Store

    CloudStore = S3Store | GCSStore | AzureStore

T = TypeVar("T")

STORE_THREADS = 16
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking obstore call on the store thread pool."""
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="pygazette-store")
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor, functools.partial(fn, *args, **kwargs))


class _PutSource(io.RawIOBase):
    """The file a put uploads, read for obstore by this process: once the put is abandoned
    (its call cancelled, its thread going on) a read fails, so the upload fails rather than
    complete with bytes read since, which may be another's (a spool file reused once a
    retry persisted it). What it read before then was the file's own content."""

    def __init__(
        self,
        local: Path,
        abandoned: threading.Event,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__()
        self._file = open(local, "rb", buffering=0)  # Closed by close().
        self._abandoned = abandoned
        self._progress = progress
        self._read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)
        if self._abandoned.is_set():  # Checked after the read: it may have read other bytes.
            raise OSError("put abandoned (cancelled)")
        n = n if n is not None else 0
        if n and self._progress is not None:
            self._read += n
            self._progress(self._read)  # Read ahead of the upload by a few parts at most.
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


# A signed URL is valid for at least this long and at most this long (S3's limit is 7 days).
MIN_SIGNED_TTL_SECONDS = 1
MAX_SIGNED_TTL_SECONDS = 7 * 24 * 3600


def describe(exc: BaseException) -> str:
    """A one-line description of an obstore error.

    obstore's report is many lines: the first says what failed, down to the HTTP status and
    the start of the store's answer; the answer follows, then a debug dump. The store's own
    reason, in its answer (S3's and Azure's XML <Code> and <Message>, GCS's JSON "message"),
    takes the place of the answer's start: 'Server returned non-2xx status code: 403
    Forbidden: SignatureDoesNotMatch: The request signature we calculated does not match
    ...', where the first line alone ended with '<?xml version="1.0" encoding="UTF-8"?>'.
    """
    text = str(exc).strip()
    lines = text.splitlines()
    first = lines[0] if lines else type(exc).__name__
    report, _, debug = text.partition("\nDebug source:")
    reason = _answer_reason(report) or _transport_reason(first, debug)
    first = _ANSWER_START.sub("", first)  # Or a ': ' with nothing after (a HEAD's answer).
    if reason:
        return f"{first[:400]}: {reason[:300]}"
    return first[:500]


# What obstore's first line says of a request that got no answer, whose cause (refused,
# reset, timed out, a name that does not resolve, a certificate refused) is in its debug dump.
_TRANSPORT_FAILURES = ("error sending request", "request or response body error")
_DEBUG_MESSAGE = re.compile(r'\b(?:message|error): "((?:[^"\\]|\\.){1,300})"')
_DEBUG_CERTIFICATE = re.compile(r"\b(InvalidCertificate\([^)]{1,100}\))")


def _transport_reason(first: str, debug: str) -> str:
    """The innermost cause of a request that failed without an answer, from obstore's debug
    dump: the OS's or resolver's message, a refused certificate, or 'timed out'."""
    if not first.rstrip().endswith(_TRANSPORT_FAILURES):
        return ""
    messages: list[str] = _DEBUG_MESSAGE.findall(debug)
    if messages:
        return messages[-1].replace('\\"', '"')
    if found := _DEBUG_CERTIFICATE.search(debug):
        return found.group(1)
    if "TimedOut" in debug or "kind: Timeout" in debug:
        return "timed out"
    if found := _DEBUG_HYPER.search(debug):
        kind = found.group(1)
        return _HYPER_ERRORS.get(kind, kind)
    return ""


_DEBUG_HYPER = re.compile(r"hyper::Error\(\s*(\w+)")
_HYPER_ERRORS = {
    "IncompleteMessage": "the connection closed before the answer was complete",
    "ChannelClosed": "the connection closed",
    "Canceled": "the connection closed before the request was sent",
}


# Where the first line of a report shows the start of the store's answer.
_ANSWER_START = re.compile(r"(?::\s*\ufeff?(?:<\?xml.*|<Error>.*|\{.*)?)?\s*$")
_XML_CODE = re.compile(r"<Code>([^<]{1,200})</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]{1,2000})</Message>")
_JSON_MESSAGE = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.){1,2000})"')


def _answer_reason(text: str) -> str:
    """The store's reason in the answer quoted by an obstore report: '<Code>: <Message>'
    (the message's first line), or GCS's error message; "" if there is none."""
    code = _XML_CODE.search(text)
    message = _XML_MESSAGE.search(text)
    if code or message:
        parts = [html.unescape(m.group(1)).strip() for m in (code, message) if m]
        return ": ".join(p.splitlines()[0] for p in parts if p)
    found = _JSON_MESSAGE.search(text)
    if found:
        try:
            return str(json.loads(f'"{found.group(1)}"')).strip().splitlines()[0]
        except (ValueError, IndexError):
            return found.group(1)
    return ""


class ObjectStore(FragmentStore):
    """A `FragmentStore` over an obstore store whose prefix is the store URL's path."""

    def __init__(
        self,
        url: StoreURL,
        store: CloudStore,
        *,
        put_attributes: dict[str, str] | None = None,
        list_raw: Callable[[str], list[StoredFile]] | None = None,
        stream_store: CloudStore | None = None,
    ) -> None:
        super().__init__(url.url)
        self.parsed = url
        self._store = store
        # Streaming reads: a client of the same store without the short request deadline.
        self._stream_store = store if stream_store is None else stream_store
        self._put_attributes = dict(put_attributes or {})
        # Lists a key prefix without obstore (`s3_listing`), where obstore refuses a key.
        self._list_raw = list_raw

    def _key(self, path: str) -> str:
        key = self.parsed.rewrite(path)
        if key.startswith("/") or "//" in key or any(p in (".", "..") for p in key.split("/")):
            raise StoreError(f"invalid object path {path!r} in store {self.url}")
        return key

    def _error(self, op: str, key: str, exc: BaseException) -> StoreError:
        # The store URL without its query (endpoint, region, ...), then the object's key.
        where = f"{self.url.split('?', 1)[0]}{key}"
        if _refused(exc):
            return StoreAuthError(f"{op} {where}: {describe(exc)}")
        if isinstance(exc, FileNotFoundError):
            return StoreNotFound(f"{op} {where}: not found")
        return StoreError(f"{op} {where}: {describe(exc)}")

    async def put_file(
        self,
        path: str,
        local: Path,
        *,
        content_encoding: str = "",
        disposable: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        key = self._key(path)
        attributes: dict[str, str] = dict(self._put_attributes)
        if content_encoding:
            attributes["Content-Encoding"] = content_encoding
        abandoned = threading.Event()
        try:
            await _run(self._put, key, Path(local), attributes or None, abandoned, progress)
        except asyncio.CancelledError:
            abandoned.set()  # Its thread goes on (maybe hung), but lands nothing now.
            raise
        except (BaseError, OSError, ValueError) as exc:
            raise self._error("put", key, exc) from exc

    def _put(
        self,
        key: str,
        local: Path,
        attributes: Any,
        abandoned: threading.Event,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        with _PutSource(local, abandoned, progress) as source:
            obstore.put(self._store, key, source, attributes=attributes)

    async def exists(self, path: str) -> bool:
        key = self._key(path)
        try:
            await _run(obstore.head, self._store, key)
        except FileNotFoundError:
            return False
        except (BaseError, OSError, ValueError) as exc:
            raise self._error("head", key, exc) from exc
        return True

    async def read(self, path: str, *, start: int = 0, length: int = -1) -> ObjectRange:
        key = self._key(path)
        options: dict[str, Any] = {}
        if length == 0:
            return ObjectRange(b"", "", -1)
        if start or length > 0:
            options["range"] = (start, start + length) if length > 0 else {"offset": start}
        try:
            data, encoding, size = await _run(self._get, key, options)
        except (BaseError, OSError, ValueError) as exc:
            if start and not isinstance(exc, FileNotFoundError) and _past_end(exc):
                return ObjectRange(b"", "", -1)  # A range starting at or past the end.
            raise self._error("get", key, exc) from exc
        return ObjectRange(data=data, content_encoding=encoding.lower(), size=size)

    async def open_read(
        self, path: str, *, start: int = 0, length: int = -1, chunk_size: int = 1 << 20
    ) -> ObjectReader:
        key = self._key(path)
        if length == 0:
            return _StreamReader(self, key, None, "", -1)
        options: dict[str, Any] = {}
        if start or length > 0:
            options["range"] = (start, start + length) if length > 0 else {"offset": start}
        try:
            stream, encoding, size = await _run(self._open_stream, key, options, chunk_size)
        except (BaseError, OSError, ValueError) as exc:
            if start and not isinstance(exc, FileNotFoundError) and _past_end(exc):
                return _StreamReader(self, key, None, "", -1)  # At or past the end.
            raise self._error("get", key, exc) from exc
        return _StreamReader(self, key, stream, encoding.lower(), size)

    def _open_stream(
        self, key: str, options: dict[str, Any], chunk_size: int
    ) -> tuple[BytesStream, str, int]:
        result = obstore.get(self._stream_store, key, options=options or None)  # type: ignore[arg-type]
        encoding = str(result.attributes.get("Content-Encoding", "") or "")
        return result.stream(min_chunk_size=chunk_size), encoding, int(result.meta["size"])

    def _get(self, key: str, options: dict[str, Any]) -> tuple[bytes, str, int]:
        result = obstore.get(self._store, key, options=options or None)  # type: ignore[arg-type]
        data = bytes(result.bytes())
        encoding = str(result.attributes.get("Content-Encoding", "") or "")
        return data, encoding, int(result.meta["size"])

    async def list_files(self, prefix: str) -> list[StoredFile]:
        key = self._key(prefix)
        try:
            return await _run(self._list, key)
        except (BaseError, OSError, ValueError) as exc:
            raise self._error("list", key, exc) from exc

    def _list(self, key: str) -> list[StoredFile]:
        try:
            return self._list_obstore(key)
        except InvalidPathError as exc:
            # An object whose key obstore refuses as a path ('a//b', a '.' segment, a control
            # character) fails its whole listing, and so hid every fragment of the journal.
            # Gazette lists every key (and skips those that are no fragments): so do we, over
            # the store's own API where we can, else fail naming the key.
            if self._list_raw is None:
                raise
            try:
                return self._list_raw(key)
            except StoreError as raw:
                raise StoreError(f"{describe(exc)}; {raw}") from exc

    def _list_obstore(self, key: str) -> list[StoredFile]:
        out: list[StoredFile] = []
        for chunk in obstore.list(self._store, prefix=key, chunk_size=1000):
            for meta in chunk:
                obj_path = str(meta["path"])
                if obj_path.endswith("/") or not obj_path.startswith(key):
                    continue  # Directory markers.
                out.append(
                    StoredFile(
                        path=obj_path[len(key) :],
                        size=int(meta["size"]),
                        mod_time=int(meta["last_modified"].timestamp()),
                    )
                )
        return out

    async def remove(self, path: str) -> None:
        key = self._key(path)
        try:
            await _run(obstore.delete, self._store, key)
        except FileNotFoundError:
            return
        except (BaseError, OSError, ValueError) as exc:
            raise self._error("delete", key, exc) from exc

    async def signed_url(self, path: str, ttl_seconds: float) -> str:
        key = self._key(path)
        ttl = min(max(ttl_seconds, MIN_SIGNED_TTL_SECONDS), MAX_SIGNED_TTL_SECONDS)
        try:
            return await _run(obstore.sign, self._store, "GET", key, timedelta(seconds=ttl))
        except (BaseError, OSError, ValueError) as exc:
            raise self._error("sign", key, exc) from exc

    def local_path(self, path: str) -> Path | None:
        return None


class _StreamReader(ObjectReader):
    """The body of one GET, pulled a chunk at a time on the store's threads."""

    def __init__(
        self, store: ObjectStore, key: str, stream: BytesStream | None, encoding: str, size: int
    ) -> None:
        self._owner, self._key = store, key
        self._stream = stream
        self.content_encoding, self.size = encoding, size

    async def next(self) -> bytes:
        stream = self._stream
        if stream is None:
            return b""
        try:
            chunk = await _run(_next_chunk, stream)
        except asyncio.CancelledError:
            self._stream = None  # Its thread lets go of it once the pull returns.
            raise
        except (BaseError, OSError, ValueError) as exc:
            self._stream = None
            raise self._owner._error("get", self._key, exc) from exc
        if not chunk:
            self._stream = None
        return chunk

    async def aclose(self) -> None:
        # Dropping the stream drops its connection (not reused: its body was not read out).
        self._stream = None


def _next_chunk(stream: BytesStream) -> bytes:
    """Store thread: the stream's next chunk (b"" at its end), the GIL released meanwhile."""
    return next(stream, b"")


def _refused(exc: BaseException) -> bool:
    """Whether the store refused for want of authorization, as Gazette's S3, GCS and Azure
    stores' IsAuthError tell: denied, unauthenticated, or no such bucket or container (which
    obstore reports as an object not found). The code is read as the answer's error code
    (<Code>...</Code>), not anywhere in the message, which names the object's key."""
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)):
        return True
    text = str(exc)
    # Any 403, as Gazette's S3 store takes it: obstore reports a listing's as a generic error.
    # (The status is read where obstore states it: no key holds a space.)
    if "non-2xx status code: 403 Forbidden" in text:
        return True
    return any(
        f"<Code>{code}</Code>" in text
        for code in ("NoSuchBucket", "AccessDenied", "ContainerNotFound")
    )


def _past_end(exc: BaseException) -> bool:
    text = str(exc)
    return "416" in text or "Range Not Satisfiable" in text or "InvalidRange" in text
