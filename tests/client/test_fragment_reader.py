"""Direct fragment reads: codecs, seeking into a fragment, and the exact-length checks."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import http.server
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.client import (
    CorruptFragment,
    DidNotReadExpectedEOF,
    FragmentOpenError,
    UnexpectedFragmentEOF,
    open_fragment_url,
)
from pygazette.client import fragment_reader as fr
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs

CODECS = [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY]
DATA = b"".join(b"line %06d of the fragment\n" % i for i in range(20_000))


def fragment(begin: int, end: int, codec: int) -> pb.Fragment:
    return pb.Fragment(journal="a/journal", begin=begin, end=end, compression_codec=codec)  # type: ignore[arg-type]


def write(tmp_path: Path, data: bytes, codec: int, name: str = "frag") -> Path:
    path = tmp_path / name
    path.write_bytes(codecs.compress(codec, data))
    return path


async def read_all(reader: fr.FragmentReader, n: int = -1) -> bytes:
    out = bytearray()
    while chunk := await reader.read(n):
        out += chunk
    return bytes(out)


@pytest.fixture(autouse=True)
def small_raw_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Exercise many raw reads per fragment.
    monkeypatch.setattr(fr, "RAW_CHUNK_SIZE", 4096)


@pytest.mark.parametrize("codec", CODECS)
async def test_reads_whole_fragment(tmp_path: Path, codec: int) -> None:
    path = write(tmp_path, DATA, codec)
    frag = fragment(1000, 1000 + len(DATA), codec)
    async with await open_fragment_url(frag, 1000, path.as_uri()) as reader:
        assert await read_all(reader) == DATA
        assert reader.offset == frag.end
        assert await reader.read() == b""


@pytest.mark.parametrize("codec", CODECS)
async def test_seeks_to_an_offset_within_the_fragment(tmp_path: Path, codec: int) -> None:
    path = write(tmp_path, DATA, codec)
    frag = fragment(500, 500 + len(DATA), codec)
    async with await open_fragment_url(frag, 500 + 123_457, path.as_uri()) as reader:
        assert reader.offset == 500 + 123_457
        assert await read_all(reader, 1000) == DATA[123_457:]


@pytest.mark.parametrize("codec", [pb.GZIP, pb.ZSTANDARD, pb.SNAPPY])
async def test_a_highly_compressed_fragment_is_read_in_bounded_memory(
    tmp_path: Path, codec: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 64 MiB of repeated lines, a few KiB of gzip or zstd: each raw chunk read was decoded at
    # once, so a reader held all of it (snappy: 21 MiB per 1 MiB chunk) before its first read.
    monkeypatch.setattr(fr, "RAW_CHUNK_SIZE", 1 << 20)
    content = b"0123456789abcdef" * (4 << 20)
    path = write(tmp_path, content, codec)
    frag = fragment(0, len(content), codec)
    digest = hashlib.sha1(content[100:]).hexdigest()
    del content
    tracemalloc.start()
    try:
        read = hashlib.sha1()
        async with await open_fragment_url(frag, 100, path.as_uri()) as reader:
            while chunk := await reader.read(1 << 20):
                read.update(chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert read.hexdigest() == digest
    assert peak < 12 << 20, f"peak {peak >> 20} MiB while reading"


async def test_offset_at_the_end_reads_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, DATA, pb.SNAPPY)
    frag = fragment(0, len(DATA), pb.SNAPPY)
    async with await open_fragment_url(frag, len(DATA), path.as_uri()) as reader:
        assert await reader.read() == b""


async def test_offset_outside_the_fragment_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, DATA, pb.NONE)
    with pytest.raises(ValueError):
        await open_fragment_url(fragment(10, 10 + len(DATA), pb.NONE), 5, path.as_uri())


@pytest.mark.parametrize("codec", CODECS)
async def test_too_short_content_is_an_error(tmp_path: Path, codec: int) -> None:
    path = write(tmp_path, DATA, codec)
    frag = fragment(0, len(DATA) + 1, codec)
    reader = await open_fragment_url(frag, 0, path.as_uri())
    with pytest.raises(UnexpectedFragmentEOF, match="ended after"):
        await read_all(reader)


@pytest.mark.parametrize("codec", CODECS)
async def test_too_long_content_is_an_error(tmp_path: Path, codec: int) -> None:
    path = write(tmp_path, DATA, codec)
    frag = fragment(0, len(DATA) - 1, codec)
    reader = await open_fragment_url(frag, 0, path.as_uri())
    with pytest.raises(DidNotReadExpectedEOF):
        await read_all(reader)


async def test_exactly_sized_content_ending_mid_read_is_detected_as_too_long(
    tmp_path: Path,
) -> None:
    # The extra byte arrives in a later raw chunk than the one reaching `end`.
    data = b"x" * 4096 + b"y"
    path = write(tmp_path, data, pb.NONE)
    reader = await open_fragment_url(fragment(0, 4096, pb.NONE), 0, path.as_uri())
    assert await reader.read() == b"x" * 4096
    with pytest.raises(DidNotReadExpectedEOF):
        await reader.read()


async def test_corrupt_content_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "frag"
    path.write_bytes(b"\x00not zstd at all" * 10)
    reader = await open_fragment_url(fragment(0, 100, pb.ZSTANDARD), 0, path.as_uri())
    with pytest.raises(CorruptFragment):
        await read_all(reader)


async def test_missing_file_and_unknown_scheme(tmp_path: Path) -> None:
    with pytest.raises(FragmentOpenError):
        await open_fragment_url(fragment(0, 1, pb.NONE), 0, (tmp_path / "nope").as_uri())
    with pytest.raises(FragmentOpenError, match="unsupported"):
        await open_fragment_url(fragment(0, 1, pb.NONE), 0, "s3://bucket/key")


async def test_file_root_roots_file_urls(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    write(tmp_path / "a", DATA, pb.GZIP, "frag.gz")
    frag = fragment(0, len(DATA), pb.GZIP)
    async with await open_fragment_url(frag, 0, "file:///a/frag.gz", file_root=tmp_path) as r:
        assert await read_all(r) == DATA


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, tuple[bytes, str]] = {}

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in self.files:
            self.send_error(404)
            return
        body, encoding = self.files[path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_reads_over_http(http_server: str) -> None:
    _Handler.files["/frag.sz"] = (codecs.compress(pb.SNAPPY, DATA), "")
    frag = fragment(0, len(DATA), pb.SNAPPY)
    url = f"{http_server}/frag.sz?X-Signature=abc"
    async with await open_fragment_url(frag, 10, url) as reader:
        assert await read_all(reader) == DATA[10:]


async def test_offloaded_gzip_is_decoded_as_the_store_sends_it(http_server: str) -> None:
    # A store honouring Accept-Encoding: identity sends content; one that does not sends gzip.
    _Handler.files["/plain.gzod"] = (DATA, "")
    _Handler.files["/gz.gzod"] = (gzip.compress(DATA), "gzip")
    frag = fragment(0, len(DATA), pb.GZIP_OFFLOAD_DECOMPRESSION)
    for name in ("/plain.gzod", "/gz.gzod"):
        async with await open_fragment_url(frag, 0, http_server + name) as reader:
            assert await read_all(reader) == DATA


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves `body`, honouring a Range header ('bytes=N-') as S3 does; records each one."""

    body = b""
    ranges: list[str | None] = []
    content_range = ""  # Answered instead of the right one, if set.

    def do_GET(self) -> None:
        asked = self.headers.get("Range")
        self.ranges.append(asked)
        if asked is None:
            self.send_response(200)
            body = self.body
        else:
            start = int(asked.removeprefix("bytes=").removesuffix("-"))
            body = self.body[start:]
            self.send_response(206)
            self.send_header(
                "Content-Range",
                self.content_range or f"bytes {start}-{len(self.body) - 1}/{len(self.body)}",
            )
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_an_uncompressed_fragment_is_opened_at_the_offset(
    tmp_path: Path, http_server: str
) -> None:
    # Gazette's client GETs a fragment whole and discards up to the offset: a Spark partition
    # or a resumed read beginning deep in a large uncompressed fragment fetched all of it.
    # An uncompressed one is fetched from the offset (a compressed one must be decoded from
    # its start).
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/f?X-Amz-Signature=x"
    try:
        frag = fragment(500, 500 + len(DATA), pb.NONE)
        _RangeHandler.body, _RangeHandler.ranges = DATA, []
        for offset in (500 + 123_457, 500, frag.end - 1, frag.end):
            async with await open_fragment_url(frag, offset, url) as reader:
                assert reader.offset == offset
                assert await read_all(reader) == DATA[offset - 500 :]
        assert _RangeHandler.ranges == ["bytes=123457-", None, f"bytes={len(DATA) - 1}-", None]
        # Compressed: from its start.
        _RangeHandler.body, _RangeHandler.ranges = codecs.compress(pb.ZSTANDARD, DATA), []
        zfrag = fragment(500, 500 + len(DATA), pb.ZSTANDARD)
        async with await open_fragment_url(zfrag, 500 + 123_457, url) as reader:
            assert await read_all(reader) == DATA[123_457:]
        assert _RangeHandler.ranges == [None]
        # The length checks hold from the offset: a fragment longer or shorter than its name.
        _RangeHandler.body = DATA + b"more"
        with pytest.raises(DidNotReadExpectedEOF):
            async with await open_fragment_url(frag, 600, url) as reader:
                await read_all(reader)
        _RangeHandler.body = DATA[:-1]
        with pytest.raises(UnexpectedFragmentEOF):
            async with await open_fragment_url(frag, 600, url) as reader:
                await read_all(reader)
        # A range the server answered for other bytes is refused, not read as if asked.
        _RangeHandler.body, _RangeHandler.content_range = DATA, "bytes 0-9/10"
        with pytest.raises(FragmentOpenError, match="asked for bytes 100- and got bytes 0-9/10"):
            await open_fragment_url(frag, 600, url)
    finally:
        _RangeHandler.content_range = ""
        server.shutdown()
        server.server_close()
    # A server that ignores Range (200, all of it): discarded up to the offset, as before.
    _Handler.files["/norange.raw"] = (DATA, "")
    async with await open_fragment_url(frag, 600, f"{http_server}/norange.raw") as reader:
        assert await read_all(reader) == DATA[100:]
    # A file is opened at the offset (a seek).
    path = write(tmp_path, DATA, pb.NONE)
    async with await open_fragment_url(frag, 600, path.as_uri()) as reader:
        assert reader.offset == 600
        assert reader._raw is not None and reader._raw.tell() > 0  # type: ignore[attr-defined]
        assert await read_all(reader) == DATA[100:]


async def test_http_errors_are_open_errors(http_server: str) -> None:
    with pytest.raises(FragmentOpenError, match="HTTP 404") as info:
        await open_fragment_url(fragment(0, 1, pb.NONE), 0, f"{http_server}/missing?sig=secret")
    assert "secret" not in str(info.value)  # Signatures are not leaked into messages.


class _Recorded:
    """A raw fragment source whose closing the test can wait for."""

    def __init__(self, raw: fr.RawSource) -> None:
        self.raw = raw
        self.closed = threading.Event()

    def read(self, n: int = -1, /) -> bytes:
        return self.raw.read(n)

    def close(self) -> None:
        self.raw.close()
        self.closed.set()


@pytest.mark.parametrize("scheme", ["file", "http"])
async def test_a_read_cancelled_while_it_opens_closes_what_it_opened(
    tmp_path: Path, http_server: str, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The open runs on a worker thread, which goes on when the read is cancelled meanwhile.
    # The file or HTTP response it then opened was dropped, open, until garbage collection.
    _Handler.files["/cancelled.raw"] = (DATA, "")
    path = write(tmp_path, DATA, pb.NONE)
    url = path.as_uri() if scheme == "file" else f"{http_server}/cancelled.raw"
    opened: list[_Recorded] = []
    in_open, go_on = threading.Event(), threading.Event()
    open_raw = fr._open_raw

    def open_slowly(
        fragment: pb.Fragment, url: str, file_root: str | Path | None, offset: int | None
    ) -> tuple[fr.RawSource, int, int]:
        raw, codec, start = open_raw(fragment, url, file_root, offset)
        opened.append(_Recorded(raw))  # Held here: garbage collection won't close it.
        in_open.set()
        go_on.wait(30)
        return opened[-1], codec, start

    monkeypatch.setattr(fr, "_open_raw", open_slowly)
    task = asyncio.ensure_future(open_fragment_url(fragment(0, len(DATA), pb.NONE), 0, url))
    try:
        assert await asyncio.to_thread(in_open.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        go_on.set()
    (raw,) = opened
    try:
        assert await asyncio.to_thread(raw.closed.wait, 10), "left open"
    finally:
        raw.raw.close()
