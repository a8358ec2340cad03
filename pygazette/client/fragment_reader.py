"""Direct reads of fragment files: open a fragment by URL and stream its decompressed content.

Used when a broker answers a `do_not_proxy` read with a fragment URL instead of content, and by
batch tools that list fragments with signed URLs. A fragment's name promises exactly
`end - begin` bytes of content; the reader checks that promise and fails loudly on a file that
is shorter (`UnexpectedFragmentEOF`) or longer (`DidNotReadExpectedEOF`) than that.

File and HTTP I/O and decompression are blocking and run on worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import unquote, urlsplit

from pygazette.client.byte_stream import ByteStream
from pygazette.client.errors import (
    CorruptFragment,
    DidNotReadExpectedEOF,
    FragmentOpenError,
    FragmentReadError,
    UnexpectedFragmentEOF,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs

# Raw (compressed) bytes pulled from the file or HTTP body per worker-thread call.
RAW_CHUNK_SIZE = 1 << 20
HTTP_TIMEOUT_SECONDS = 60.0


class RawSource(Protocol):
    """A blocking byte source: a file object or an HTTP response body."""

    def read(self, n: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class FragmentReader(ByteStream):
    """Reads the content of one opened fragment, from a journal offset to the fragment's end.

    `offset` is the journal offset of the next byte `read()` returns. `read()` returns b"" only
    once the underlying file ended exactly at `fragment.end`.
    """

    def __init__(
        self,
        raw: RawSource,
        fragment: pb.Fragment,
        *,
        codec: int | None = None,
        start: int | None = None,
    ) -> None:
        """`start`: the journal offset of `raw`'s first byte, if not the fragment's begin
        (an uncompressed fragment opened at an offset)."""
        self.fragment = fragment
        self.offset = fragment.begin if start is None else start
        self._raw: RawSource | None = raw
        codec = fragment.compression_codec if codec is None else codec
        try:
            self._decompressor = codecs.new_decompressor(codec)
        except ValueError as exc:
            raw.close()
            raise FragmentReadError(f"cannot read fragment {_describe(fragment)}: {exc}") from exc
        self._decoded_end = self.offset  # Journal offset just past all content decoded so far.
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._pulling = False  # A worker thread is reading the raw source.

    async def skip_to(self, offset: int) -> None:
        """Discard content up to journal `offset`, which must lie in [offset, fragment.end]."""
        if offset < self.offset or offset > self.fragment.end:
            raise ValueError(
                f"offset {offset} is outside the readable range "
                f"[{self.offset}, {self.fragment.end}] of fragment {_describe(self.fragment)}"
            )
        while self.offset < offset:
            chunk = await self.read(offset - self.offset)
            if not chunk:  # Cannot happen: EOF is only returned at fragment.end.
                raise UnexpectedFragmentEOF(f"fragment {_describe(self.fragment)} ended early")

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes of content (all that is decoded and pending, if n < 0); b"" at EOF."""
        if n == 0:
            return b""
        while self._pos == len(self._buf):
            if self._eof:
                return b""
            await self._fill()
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = self._buf[self._pos : end]
        self._pos = end
        self.offset += len(out)
        return out

    async def _fill(self) -> None:
        raw = self._raw
        if raw is None:
            raise FragmentReadError(f"fragment reader of {_describe(self.fragment)} is closed")
        self._pulling = True
        try:
            out, raw_eof = await asyncio.to_thread(self._pull, raw)
        except asyncio.CancelledError:
            # The worker thread may still be reading `raw` (a stalled store): closing it
            # waits for that read, so it is closed in the background.
            self._pulling = False
            self._raw = None
            asyncio.get_running_loop().run_in_executor(None, _close_quietly, raw)
            raise
        except BaseException:
            self._pulling = False
            await self.aclose()
            raise
        self._pulling = False
        if self._raw is None:  # Closed meanwhile (`aclose`, from another task).
            raise FragmentReadError(f"fragment reader of {_describe(self.fragment)} is closed")
        self._decoded_end += len(out)
        if self._decoded_end > self.fragment.end:
            await self.aclose()
            raise DidNotReadExpectedEOF(
                f"fragment {_describe(self.fragment)} holds more than its "
                f"{self.fragment.end - self.fragment.begin} bytes of content"
            )
        if raw_eof:
            await self.aclose()
            if self._decoded_end != self.fragment.end:
                raise UnexpectedFragmentEOF(
                    f"fragment {_describe(self.fragment)} ended after "
                    f"{self._decoded_end - self.fragment.begin} of its "
                    f"{self.fragment.end - self.fragment.begin} bytes of content"
                )
            self._eof = True
        self._buf, self._pos = out, 0

    def _pull(self, raw: RawSource) -> tuple[bytes, bool]:
        """Worker thread: up to about RAW_CHUNK_SIZE bytes of content, from what was read
        already or from the next raw chunks; (content, reached EOF). Bounded, however
        compressed the fragment is (a few KiB of it may hold all of its content)."""
        try:
            out = self._decompressor.feed(b"", RAW_CHUNK_SIZE)
            while not out:
                data = raw.read(RAW_CHUNK_SIZE)
                if not data:
                    return self._decompressor.finish(), True
                out = self._decompressor.feed(data, RAW_CHUNK_SIZE)
            return out, False
        except ValueError as exc:
            raise CorruptFragment(f"corrupt fragment {_describe(self.fragment)}: {exc}") from exc
        except OSError as exc:
            raise FragmentReadError(
                f"reading fragment {_describe(self.fragment)} failed: {exc}"
            ) from exc

    async def aclose(self) -> None:
        """Release the underlying file or connection. Idempotent."""
        raw, self._raw = self._raw, None
        if raw is None:
            return
        if self._pulling:
            # A read in flight on a worker thread holds it (a stalled store, say): closing
            # it waits for that read, so it is closed in the background.
            asyncio.get_running_loop().run_in_executor(None, _close_quietly, raw)
            return
        await asyncio.to_thread(raw.close)


async def new_fragment_reader(
    raw: RawSource,
    fragment: pb.Fragment,
    offset: int,
    *,
    codec: int | None = None,
    start: int | None = None,
) -> FragmentReader:
    """Wrap an open raw fragment file and position it at journal `offset` (`start`: the
    journal offset of `raw`'s first byte, if not the fragment's begin)."""
    reader = FragmentReader(raw, fragment, codec=codec, start=start)
    try:
        await reader.skip_to(offset)
    except BaseException:
        await reader.aclose()
        raise
    return reader


async def open_fragment_url(
    fragment: pb.Fragment, offset: int, url: str, *, file_root: str | Path | None = None
) -> FragmentReader:
    """Open the fragment at `url` and position it at journal `offset`.

    `file://` URLs name a local (or shared NAS) file; with `file_root` their path is taken
    relative to that directory, as for a broker's file store root. `http(s)://` URLs (signed
    store URLs) are fetched with a GET.
    """
    if not fragment.begin <= offset <= fragment.end:
        raise ValueError(
            f"offset {offset} is outside fragment {_describe(fragment)} "
            f"[{fragment.begin}, {fragment.end})"
        )
    # The worker thread opening it goes on if the caller is cancelled meanwhile: what it
    # opens is then closed as soon as it has, rather than left to garbage collection.
    opening = asyncio.ensure_future(asyncio.to_thread(_open_raw, fragment, url, file_root, offset))
    try:
        raw, codec, start = await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_abandoned)
        raise
    return await new_fragment_reader(raw, fragment, offset, codec=codec, start=start)


def _close_abandoned(opening: asyncio.Future[tuple[RawSource, int, int]]) -> None:
    """Close a raw source opened for a caller that was cancelled meanwhile."""
    if opening.cancelled() or opening.exception() is not None:
        return  # Nothing was opened (the exception is retrieved: not logged as lost).
    raw, _codec, _start = opening.result()
    opening.get_loop().run_in_executor(None, _close_quietly, raw)


def _close_quietly(raw: RawSource) -> None:
    with contextlib.suppress(OSError):
        raw.close()


def _open_raw(
    fragment: pb.Fragment, url: str, file_root: str | Path | None, offset: int | None = None
) -> tuple[RawSource, int, int]:
    """Worker thread: open the URL; returns the raw source, the codec to decode it with and
    the journal offset of its first byte.

    An uncompressed fragment is opened at `offset` (a seek; a ranged GET, which a server may
    ignore), where Gazette's client reads it from its start and discards up to the offset:
    a Spark partition or a resumed read beginning deep in a large fragment fetched all of
    it before. A compressed one is read from its start.
    """
    parts = urlsplit(url)
    codec = fragment.compression_codec
    skip = 0  # Bytes of an uncompressed fragment to open it past.
    if codec == pb.NONE and offset is not None and fragment.begin < offset < fragment.end:
        skip = offset - fragment.begin
    if parts.scheme == "file":
        # A URL's path is percent-encoded, but brokers sign a file:// store's fragment as its
        # path verbatim (as Gazette's does), and journal names may hold '%': a path that
        # doesn't decode to a file is tried as it is.
        paths = [unquote(parts.path), parts.path]
        if file_root is not None:
            paths = [str(Path(file_root) / p.lstrip("/")) for p in paths]
        path = Path(paths[0])
        try:
            try:
                fobj: IO[bytes] = open(path, "rb")  # Closed by the FragmentReader.
            except FileNotFoundError:
                if paths[1] == paths[0]:
                    raise
                fobj = open(paths[1], "rb")
        except OSError as exc:
            raise FragmentOpenError(f"cannot open fragment file {path}: {exc}") from exc
        if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            codec = pb.GZIP  # A file holds the gzip bytes; no store decompresses for us.
        if skip:
            try:
                fobj.seek(skip)
            except OSError as exc:
                fobj.close()
                raise FragmentOpenError(f"cannot seek fragment file {path}: {exc}") from exc
        return fobj, codec, fragment.begin + skip

    if parts.scheme in ("http", "https"):
        request = urllib.request.Request(url, method="GET")
        if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            # Ask the store to decompress on its side.
            request.add_header("Accept-Encoding", "identity")
        elif codec == pb.GZIP:
            request.add_header("Accept-Encoding", "gzip")
        if skip:
            request.add_header("Range", f"bytes={skip}-")
        try:
            resp = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise FragmentOpenError(
                f"fetching fragment {_redact(url)} failed: HTTP {exc.code} {exc.reason}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise FragmentOpenError(f"fetching fragment {_redact(url)} failed: {exc}") from exc
        if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            # Stores should honour "identity" and send content; some send gzip regardless.
            encoding = (resp.headers.get("Content-Encoding") or "").lower()
            codec = pb.GZIP if encoding == "gzip" else pb.NONE
        start = fragment.begin
        if skip and resp.status == 206:
            # The range asked for, or the server's answer is not to be trusted.
            served = resp.headers.get("Content-Range") or ""
            if not served.startswith(f"bytes {skip}-"):
                resp.close()
                raise FragmentOpenError(
                    f"fetching fragment {_redact(url)} failed: asked for bytes {skip}- and "
                    f"got {served or 'no Content-Range'}"
                )
            start += skip
        return resp, codec, start

    raise FragmentOpenError(f"unsupported fragment URL scheme {parts.scheme!r} ({_redact(url)})")


def _describe(fragment: pb.Fragment) -> str:
    return f"{fragment.journal}@[{fragment.begin}, {fragment.end})"


def _redact(url: str) -> str:
    """The URL without its query string, which carries signatures of signed URLs."""
    return url.split("?", 1)[0]
