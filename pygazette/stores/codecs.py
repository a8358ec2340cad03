"""Fragment compression codecs, byte-compatible with Gazette's.

NONE is raw bytes; GZIP and GZIP_OFFLOAD_DECOMPRESSION are single-member gzip; ZSTANDARD is a
zstd frame; SNAPPY is the snappy *framing* format (stream identifier, then CRC-checked chunks),
as Gazette writes with golang/snappy's buffered writer. Whole-buffer calls release the GIL and
are meant to run on a worker thread. Stream compressors let a fragment be compressed from its
spool file in bounded chunks (`compress_file`); stream decompressors serve fragment reads.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import BinaryIO, Protocol

import cramjam
import google_crc32c
import zstandard

from pygazette.protocol.pb import protocol_pb2 as pb

_GZIP_LEVEL = 6
_ZSTD_LEVEL = 3

_SNAPPY_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
_SNAPPY_MAX_CHUNK = 1 << 16


def _check_codec(codec: int) -> None:
    if codec not in (pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY, pb.GZIP_OFFLOAD_DECOMPRESSION):
        raise ValueError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes | memoryview) -> bytes:
    """Compress a whole fragment's content with `codec`."""
    _check_codec(codec)
    if codec == pb.NONE:
        return bytes(data)
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        co = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
        return co.compress(data) + co.flush()
    if codec == pb.ZSTANDARD:
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True).compress(data)
    return bytes(cramjam.snappy.compress(bytes(data)))


class StreamCompressor(Protocol):
    """Incremental compression: feed content chunks, get compressed bytes back."""

    def compress(self, chunk: bytes | memoryview) -> bytes: ...

    def finish(self) -> bytes: ...


class _IdentityCompressor:
    def compress(self, chunk: bytes | memoryview) -> bytes:
        return bytes(chunk)

    def finish(self) -> bytes:
        return b""


class _GzipCompressor:
    def __init__(self) -> None:
        self._c = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)

    def compress(self, chunk: bytes | memoryview) -> bytes:
        return self._c.compress(chunk)

    def finish(self) -> bytes:
        return self._c.flush()


class _ZstdCompressor:
    def __init__(self) -> None:
        self._c = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True).compressobj()

    def compress(self, chunk: bytes | memoryview) -> bytes:
        return bytes(self._c.compress(chunk))

    def finish(self) -> bytes:
        return bytes(self._c.flush())


class _SnappyFramedCompressor:
    """The snappy framing format: the stream identifier once, then CRC-checked chunks."""

    def __init__(self) -> None:
        self._c = cramjam.snappy.Compressor()

    def compress(self, chunk: bytes | memoryview) -> bytes:
        self._c.compress(bytes(chunk))
        return bytes(self._c.flush())

    def finish(self) -> bytes:
        return bytes(self._c.finish())


def new_compressor(codec: int) -> StreamCompressor:
    """A stream compressor for `codec`; its output is one valid file of the codec."""
    _check_codec(codec)
    if codec == pb.NONE:
        return _IdentityCompressor()
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipCompressor()
    if codec == pb.ZSTANDARD:
        return _ZstdCompressor()
    return _SnappyFramedCompressor()


COMPRESS_CHUNK = 1 << 20  # Measured fastest for snappy and zstd; no worse for gzip.


def compress_file(codec: int, src_fd: int, length: int, out: BinaryIO) -> int:
    """Compress bytes [0, length) of the open file `src_fd` into `out`; returns bytes written.

    Blocking and CPU-bound (the codecs release the GIL): run it on a worker thread. Reads
    with pread in COMPRESS_CHUNK pieces, so memory stays bounded whatever the length.
    """
    compressor = new_compressor(codec)
    written = 0
    pos = 0
    while pos < length:
        data = os.pread(src_fd, min(COMPRESS_CHUNK, length - pos), pos)
        if not data:
            raise OSError(f"source is shorter ({pos} bytes) than the {length} to compress")
        pos += len(data)
        block = compressor.compress(data)
        out.write(block)
        written += len(block)
    block = compressor.finish()
    out.write(block)
    return written + len(block)


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    """Decompress a whole fragment file; raises ValueError on corrupt input."""
    d = new_decompressor(codec)
    return d.feed(bytes(data)) + d.finish()


class StreamDecompressor(Protocol):
    """Incremental decompression: feed compressed chunks, get content back."""

    def feed(self, chunk: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class _Identity:
    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def finish(self) -> bytes:
        return b""


class _Gzip:
    def __init__(self) -> None:
        self._d = zlib.decompressobj(31)

    def feed(self, chunk: bytes) -> bytes:
        out = []
        data = chunk
        try:
            while data:
                out.append(self._d.decompress(data))
                data = self._d.unused_data
                if data:  # Another gzip member follows (concatenated files are valid gzip).
                    self._d = zlib.decompressobj(31)
        except zlib.error as exc:
            raise ValueError(f"corrupt gzip fragment: {exc}") from exc
        return b"".join(out)

    def finish(self) -> bytes:
        if not self._d.eof:
            raise ValueError("truncated gzip fragment")
        return self._d.flush()


class _Zstd:
    def __init__(self) -> None:
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._fed = False

    def feed(self, chunk: bytes) -> bytes:
        self._fed = self._fed or bool(chunk)
        out = []
        data = chunk
        try:
            while data:
                if self._d.eof:  # Concatenated frames: another begins (maybe at a chunk's
                    # start, where the one before ended: a decompressobj decodes one frame).
                    self._d = zstandard.ZstdDecompressor().decompressobj()
                out.append(self._d.decompress(data))
                data = self._d.unused_data
        except zstandard.ZstdError as exc:
            raise ValueError(f"corrupt zstd fragment: {exc}") from exc
        return b"".join(out)

    def finish(self) -> bytes:
        if self._fed and not self._d.eof:
            raise ValueError("truncated zstd fragment")
        return b""


class _FramedSnappy:
    """Parses the snappy framing format chunk by chunk, checking each chunk's masked CRC-32C."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        self._buf += chunk
        out: list[bytes] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            kind = buf[pos]
            length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
            if len(buf) - pos - 4 < length:
                break
            body = bytes(buf[pos + 4 : pos + 4 + length])
            pos += 4 + length
            if kind == 0xFF:
                if body != b"sNaPpY":
                    raise ValueError("corrupt snappy fragment: bad stream identifier")
            elif kind in (0x00, 0x01):
                if length < 4:
                    raise ValueError("corrupt snappy fragment: short chunk")
                (want,) = struct.unpack("<I", body[:4])
                try:
                    data = bytes(cramjam.snappy.decompress_raw(body[4:]) if kind == 0 else body[4:])
                except cramjam.DecompressionError as exc:
                    raise ValueError(f"corrupt snappy fragment: {exc}") from exc
                if _masked_crc32c(data) != want:
                    raise ValueError("corrupt snappy fragment: checksum mismatch")
                out.append(data)
            elif 0x02 <= kind <= 0x7F:
                raise ValueError(f"corrupt snappy fragment: reserved chunk type {kind:#x}")
            # 0x80-0xfe: skippable / padding.
        del buf[:pos]
        return b"".join(out)

    def finish(self) -> bytes:
        if self._buf:
            raise ValueError("truncated snappy fragment")
        return b""


def new_decompressor(codec: int) -> StreamDecompressor:
    """A stream decompressor for `codec`."""
    _check_codec(codec)
    if codec == pb.NONE:
        return _Identity()
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return _Gzip()
    if codec == pb.ZSTANDARD:
        return _Zstd()
    return _FramedSnappy()


def _masked_crc32c(data: bytes) -> int:
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
