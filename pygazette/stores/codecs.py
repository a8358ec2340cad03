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
from typing import Any, BinaryIO, Protocol

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
    """Incremental decompression: feed compressed chunks, get content back.

    `feed(chunk, limit)` takes `chunk` and returns content decoded from what was fed so far:
    all of it when `limit` < 0, else at most about `limit` bytes (DECODE_OVERSHOOT more at
    most, a zstd block), and b"" only once nothing more can be decoded without more input.
    A reader that must stay bounded feeds a chunk with a limit, then b"" with it until it
    gets b"" back, and only then the next chunk: a highly compressed fragment (a few KiB of
    zstd or gzip can hold hundreds of MiB of repeated bytes) never decodes at once.
    `finish()` ends the input: the rest of the content, or ValueError if it is truncated.
    """

    def feed(self, chunk: bytes, limit: int = -1) -> bytes: ...

    def finish(self) -> bytes: ...


# How far past its limit a bounded `feed` may decode: one zstd block (snappy chunks are 64 KiB).
DECODE_OVERSHOOT = 128 << 10


class _Identity:
    def __init__(self) -> None:
        self._pending = b""
        self._pos = 0  # Of the first byte of `_pending` not returned yet.

    def feed(self, chunk: bytes, limit: int = -1) -> bytes:
        if chunk:
            rest = self._pending[self._pos :] if self._pos < len(self._pending) else b""
            self._pending, self._pos = rest + chunk if rest else chunk, 0
        end = len(self._pending) if limit < 0 else min(len(self._pending), self._pos + limit)
        out = self._pending[self._pos : end]
        self._pos = end
        return bytes(out)

    def finish(self) -> bytes:
        return self.feed(b"")


class _Gzip:
    def __init__(self) -> None:
        self._d = zlib.decompressobj(31)
        self._in = b""  # Input the decompressor has not taken yet.
        self._more = False  # The last call stopped at its limit: output may be pending.

    def feed(self, chunk: bytes, limit: int = -1) -> bytes:
        if chunk:
            self._in = self._in + chunk if self._in else chunk
        out = []
        n = 0
        try:
            while (self._in or self._more) and (limit < 0 or n < limit):
                if self._d.eof:
                    if not self._in:
                        break
                    # Another gzip member follows (concatenated files are valid gzip).
                    self._d = zlib.decompressobj(31)
                want = 0 if limit < 0 else limit - n
                data = self._d.decompress(self._in, want)
                self._more = want > 0 and len(data) == want
                self._in = self._d.unused_data if self._d.eof else self._d.unconsumed_tail
                out.append(data)
                n += len(data)
        except zlib.error as exc:
            raise ValueError(f"corrupt gzip fragment: {exc}") from exc
        return b"".join(out)

    def finish(self) -> bytes:
        rest = self.feed(b"")
        if not self._d.eof:
            raise ValueError("truncated gzip fragment")
        return rest


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50  # The low 4 bits are free.
_FRAME, _BLOCK, _CHECKSUM = range(3)  # What the next part of a zstd file is.


class _Zstd:
    """Zstd frames one after another (and skippable frames), decoded a block at a time.

    The file's frame and block headers are read here, and each frame's decompressor is given
    input a block at a time (a block holds at most 128 KiB of content), so that a bounded
    `feed` stops near its limit: zstd's decompressobj has no limit of its own.
    """

    def __init__(self) -> None:
        self._d: Any = None  # The decompressobj of the frame being decoded.
        self._in = b""
        self._pos = 0  # Of the next byte of `_in` not yet taken.
        self._next = _FRAME  # What begins at `_pos`, once `_left` is 0.
        self._left = 0  # Bytes of the current part still to give the decompressor (or skip).
        self._skipping = False
        self._checksum = False  # The current frame ends with a checksum.

    def _parse(self, avail: memoryview) -> int:
        """The length of the part beginning `avail` (0: more bytes needed to tell)."""
        if self._next == _FRAME:
            if len(avail) < 4:
                return 0
            (magic,) = struct.unpack_from("<I", avail)
            if magic & 0xFFFFFFF0 == _ZSTD_SKIPPABLE_MAGIC:
                if len(avail) < 8:
                    return 0
                self._skipping = True
                self._next = _FRAME
                return 8 + int(struct.unpack_from("<I", avail, 4)[0])
            if magic != _ZSTD_MAGIC:
                raise ValueError(f"corrupt zstd fragment: unknown frame magic {magic:#010x}")
            if len(avail) < 5:
                return 0
            fhd = avail[4]
            single_segment = fhd >> 5 & 1
            self._checksum = bool(fhd >> 2 & 1)
            fcs = (single_segment, 2, 4, 8)[fhd >> 6]
            self._d = zstandard.ZstdDecompressor().decompressobj()
            self._skipping = False
            self._next = _BLOCK
            return 5 + (1 - single_segment) + (0, 1, 2, 4)[fhd & 3] + fcs
        if self._next == _BLOCK:
            if len(avail) < 3:
                return 0
            header = avail[0] | avail[1] << 8 | avail[2] << 16
            kind, size = header >> 1 & 3, header >> 3
            if kind == 3:
                raise ValueError("corrupt zstd fragment: reserved block type")
            if header & 1:  # The frame's last block.
                self._next = _CHECKSUM if self._checksum else _FRAME
            return 3 + (1 if kind == 1 else size)
        self._next = _FRAME
        return 4  # The frame's checksum.

    def feed(self, chunk: bytes, limit: int = -1) -> bytes:
        if chunk:
            self._in = self._in[self._pos :] + chunk if self._pos < len(self._in) else chunk
            self._pos = 0
        out = []
        n = 0
        view = memoryview(self._in)
        try:
            while self._pos < len(view) and (limit < 0 or n < limit):
                if not self._left:
                    frame_ended = self._next == _FRAME and self._d is not None
                    if frame_ended and not self._skipping and not self._d.eof:
                        raise ValueError("corrupt zstd fragment: a frame ends early")
                    self._left = self._parse(view[self._pos :])
                    if not self._left:
                        break  # Its header is not all here yet.
                take = min(self._left, len(view) - self._pos)
                if not self._skipping:
                    data = self._d.decompress(view[self._pos : self._pos + take])
                    out.append(data)
                    n += len(data)
                self._pos += take
                self._left -= take
        except zstandard.ZstdError as exc:
            raise ValueError(f"corrupt zstd fragment: {exc}") from exc
        return b"".join(out)

    def finish(self) -> bytes:
        rest = self.feed(b"")
        ended = self._next == _FRAME and not self._left and self._pos == len(self._in)
        if not ended or (self._d is not None and not self._skipping and not self._d.eof):
            raise ValueError("truncated zstd fragment")
        return rest


class _FramedSnappy:
    """Parses the snappy framing format chunk by chunk, checking each chunk's masked CRC-32C."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # Of the next chunk in `_buf`.

    def feed(self, chunk: bytes, limit: int = -1) -> bytes:
        buf = self._buf
        if chunk:
            if self._pos:
                del buf[: self._pos]
                self._pos = 0
            buf += chunk
        out: list[bytes] = []
        n = 0
        pos = self._pos
        while len(buf) - pos >= 4 and (limit < 0 or n < limit):
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
                n += len(data)
            elif 0x02 <= kind <= 0x7F:
                raise ValueError(f"corrupt snappy fragment: reserved chunk type {kind:#x}")
            # 0x80-0xfe: skippable / padding.
        self._pos = pos
        return b"".join(out)

    def finish(self) -> bytes:
        rest = self.feed(b"")
        if len(self._buf) > self._pos:
            raise ValueError("truncated snappy fragment")
        return rest


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
