"""Codecs produce files the standard tools read, and stream-decompress in any chunking."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs

CODECS = [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY, pb.GZIP_OFFLOAD_DECOMPRESSION]


@settings(max_examples=50, deadline=None)
@given(
    data=st.binary(max_size=200_000),
    cut=st.integers(min_value=1, max_value=70_000),
    codec=st.sampled_from(CODECS),
)
def test_round_trip_any_chunking(data: bytes, cut: int, codec: int) -> None:
    z = codecs.compress(codec, data)
    d = codecs.new_decompressor(codec)
    out = b"".join(d.feed(z[i : i + cut]) for i in range(0, len(z), cut)) + d.finish()
    assert out == data


def test_gzip_reads_with_standard_gzip() -> None:
    data = os.urandom(10_000) * 20
    assert gzip.decompress(codecs.compress(pb.GZIP, data)) == data


@pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd CLI not installed")
def test_zstd_reads_with_zstd_cli() -> None:
    data = b"zstd " * 100_000
    out = subprocess.run(
        ["zstd", "-d", "-c"],
        input=codecs.compress(pb.ZSTANDARD, data),
        capture_output=True,
        check=True,
    ).stdout
    assert out == data


@pytest.mark.parametrize("codec", [pb.GZIP, pb.ZSTANDARD, pb.SNAPPY])
def test_corrupt_input_is_a_value_error(codec: int) -> None:
    z = bytearray(codecs.compress(codec, os.urandom(100_000)))
    z[len(z) // 2] ^= 0xFF
    with pytest.raises(ValueError):
        codecs.decompress(codec, bytes(z))
    with pytest.raises(ValueError):
        codecs.decompress(codec, bytes(z[: len(z) // 3]))


def test_unknown_codec() -> None:
    with pytest.raises(ValueError):
        codecs.compress(pb.INVALID, b"x")


@pytest.mark.parametrize("codec", CODECS)
def test_compress_file_streams_in_chunks(
    codec: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(codecs, "COMPRESS_CHUNK", 64 * 1024)
    data = (os.urandom(50_000) + b"abc" * 100_000) * 3
    src = tmp_path / "src"
    src.write_bytes(data + b"trailing bytes past the length")
    fd = os.open(src, os.O_RDONLY)
    try:
        with open(tmp_path / "out", "wb") as out:
            n = codecs.compress_file(codec, fd, len(data), out)
    finally:
        os.close(fd)
    z = (tmp_path / "out").read_bytes()
    assert n == len(z)
    assert codecs.decompress(codec, z) == data


def test_compress_file_of_a_short_source_fails(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"short")
    fd = os.open(src, os.O_RDONLY)
    try:
        with open(tmp_path / "out", "wb") as out, pytest.raises(OSError, match="shorter"):
            codecs.compress_file(pb.GZIP, fd, 100, out)
    finally:
        os.close(fd)


@settings(max_examples=100, deadline=None)
@given(
    parts=st.lists(st.binary(max_size=20_000), min_size=1, max_size=4),
    cut=st.integers(min_value=1, max_value=30_000),
    at_frames=st.booleans(),
    codec=st.sampled_from([pb.GZIP, pb.ZSTANDARD, pb.SNAPPY]),
)
def test_concatenated_files_read_as_one_in_any_chunking(
    parts: list[bytes], cut: int, at_frames: bool, codec: int
) -> None:
    """A file of several gzip members, zstd frames or snappy streams one after another reads
    as their contents joined (as Gazette's readers do: Go's gzip, DataDog zstd and golang/snappy
    readers all go on past the first), however the file is cut into chunks, including
    exactly where one ends and the next begins."""
    files = [codecs.compress(codec, p) for p in parts]
    if at_frames:
        chunks = files
    else:
        z = b"".join(files)
        chunks = [z[i : i + cut] for i in range(0, len(z), cut)]
    d = codecs.new_decompressor(codec)
    assert b"".join(d.feed(c) for c in chunks) + d.finish() == b"".join(parts)


@settings(max_examples=100, deadline=None)
@given(
    runs=st.lists(
        st.tuples(st.binary(min_size=1, max_size=50), st.integers(min_value=1, max_value=20_000)),
        min_size=1,
        max_size=8,
    ),
    cut=st.integers(min_value=1, max_value=100_000),
    limit=st.integers(min_value=1, max_value=300_000),
    codec=st.sampled_from(CODECS),
)
def test_a_bounded_feed_decodes_near_its_limit(
    runs: list[tuple[bytes, int]], cut: int, limit: int, codec: int
) -> None:
    """Fed with a limit, then with b"" until it returns b"", a decompressor returns all of
    the content, never more than DECODE_OVERSHOOT past the limit at a time, however
    compressed (repeated runs) and however the file is cut."""
    data = b"".join(piece * n for piece, n in runs)
    z = codecs.compress(codec, data)
    d = codecs.new_decompressor(codec)
    out = []
    for i in range(0, len(z), cut):
        got = d.feed(z[i : i + cut], limit)
        while got:
            assert len(got) <= limit + codecs.DECODE_OVERSHOOT
            out.append(got)
            got = d.feed(b"", limit)
    out.append(d.finish())
    assert b"".join(out) == data
