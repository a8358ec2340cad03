"""Fragment names and paths (cases from Gazette's fragment_extensions_test.go)."""

from __future__ import annotations

import hashlib

import pytest

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import (
    CODEC_EXTENSIONS,
    codec_from_extension,
    fragment_content_path,
    fragment_file_name,
    parse_fragment_file_name,
    parse_fragment_path,
    sha1sum_from_digest,
    sha1sum_from_hex,
    sha1sum_is_zero,
    sha1sum_to_digest,
    sha1sum_to_hex,
)
from pygazette.protocol.pb import protocol_pb2 as pb

MAX_INT64 = (1 << 63) - 1
SUM = pb.SHA1Sum(part1=0x0102030405060708, part2=0x090A0B0C0D0E0F10, part3=0x11121314)
HEX = "0102030405060708090a0b0c0d0e0f1011121314"


def frag(**kwargs: object) -> pb.Fragment:
    base: dict[str, object] = {
        "journal": "a/journal",
        "begin": 1234567890,
        "end": MAX_INT64,
        "sum": SUM,
        "compression_codec": pb.GZIP,
    }
    base.update(kwargs)
    return pb.Fragment(**base)  # type: ignore[arg-type]


def test_content_name() -> None:
    f = frag()
    assert fragment_file_name(f) == f"00000000499602d2-7fffffffffffffff-{HEX}.gz"
    f.compression_codec = pb.SNAPPY
    assert fragment_file_name(f) == f"00000000499602d2-7fffffffffffffff-{HEX}.sz"
    f.compression_codec = pb.ZSTANDARD
    assert fragment_file_name(f) == f"00000000499602d2-7fffffffffffffff-{HEX}.zst"
    f.compression_codec = pb.NONE
    assert fragment_file_name(f) == f"00000000499602d2-7fffffffffffffff-{HEX}.raw"
    # Gazette writes offload-decompression fragments without an extension.
    f.compression_codec = pb.GZIP_OFFLOAD_DECOMPRESSION
    assert fragment_file_name(f) == f"00000000499602d2-7fffffffffffffff-{HEX}"
    f.compression_codec = pb.INVALID
    with pytest.raises(ValidationError):
        fragment_file_name(f)


def test_content_path() -> None:
    f = frag(journal="a/journal/name")
    assert fragment_content_path(f) == (
        f"a/journal/name/00000000499602d2-7fffffffffffffff-{HEX}.gz"
    )
    f.path_postfix = "a=1/b=2"
    assert fragment_content_path(f) == (
        f"a/journal/name/a=1/b=2/00000000499602d2-7fffffffffffffff-{HEX}.gz"
    )


def test_parse_success_cases() -> None:
    assert parse_fragment_path("a/journal", f"00000000499602d2-7fffffffffffffff-{HEX}.gz") == frag()
    assert parse_fragment_path(
        "a/journal", f"a=b/two=3/00000000499602d2-7fffffffffffffff-{HEX}.gz"
    ) == frag(path_postfix="a=b/two=3")
    assert parse_fragment_path("a/journal", f"00000000499602d2-7fffffffffffffff-{HEX}") == frag(
        compression_codec=pb.GZIP_OFFLOAD_DECOMPRESSION
    )
    empty = parse_fragment_path(
        "a/journal", "00000000499602d2-00000000499602d2-" + "0" * 40 + ".raw"
    )
    assert empty == frag(end=1234567890, sum=pb.SHA1Sum(), compression_codec=pb.NONE)
    assert sha1sum_is_zero(empty.sum)
    # Alternate extensions, any case.
    for ext, codec in [(".GZIP", pb.GZIP), (".zstandard", pb.ZSTANDARD), (".snappy", pb.SNAPPY),
                       (".gzod", pb.GZIP_OFFLOAD_DECOMPRESSION), (".RAW", pb.NONE)]:  # fmt: skip
        parsed = parse_fragment_path("a/journal", f"0-1-{HEX}{ext}")
        assert parsed.compression_codec == codec
        assert (parsed.begin, parsed.end) == (0, 1)
    assert parse_fragment_file_name("a/journal", f"0-1-{HEX}.gz").begin == 0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (f"00000000499602d2-7fffffffffffffff-{HEX}-extra.gz", "wrong Fragment format: "),
        (f"00000000499602XX-7fffffffffffffff-{HEX}.gz", "Begin: strconv.ParseInt: "),
        (f"00000000499602d2-7fffffffffffffXX-{HEX}.gz", "End: strconv.ParseInt: "),
        (f"00000000499602d2-8000000000000000-{HEX}.gz", "End: strconv.ParseInt: "),
        (f"-7fffffffffffffff-{HEX}.gz", "Begin: strconv.ParseInt: "),
        (f"00000000499602d2-7fffffffffffffff-{HEX[:-2]}XX.gz", "Sum: encoding/hex: "),
        (f"00000000499602d2-7fffffffffffffff-{HEX[:-1]}.gz", "Sum: encoding/hex: "),
        (f"00000000499602d2-7fffffffffffffff-{HEX[:-2]}.gz", "invalid SHA1Sum length: "),
        (
            f"00000000499602d2-7fffffffffffffff-{HEX}.XXX",
            "unrecognized compression extension: .XXX",
        ),
        (f"7fffffffffffffff-00000000499602d2-{HEX}.gz", "expected Begin <= End "),
        (f"/abs/0-1-{HEX}.gz", "PathPostfix: cannot begin with '/' (/abs)"),
        (f"a b/0-1-{HEX}.gz", "PathPostfix: not a valid token (a b)"),
        (f"./0-1-{HEX}.gz", "Begin: strconv.ParseInt: "),  # Go's path.Dir is "."
        # A file name's undecodable bytes (os.fsdecode's escapes): no Fragment holds them.
        (f"date=\udcff/0-1-{HEX}.gz", "wrong Fragment format: "),
        ("", "wrong Fragment format: "),
    ],
)
def test_parse_error_cases(name: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_fragment_path("a/journal", name)
    assert str(info.value).startswith(message), str(info.value)


def test_parse_validates_journal() -> None:
    with pytest.raises(ValidationError, match="Journal: invalid length"):
        parse_fragment_path("ab", f"0-1-{HEX}.gz")
    with pytest.raises(ValidationError, match="expected a file name"):
        parse_fragment_file_name("a/journal", f"x=1/0-1-{HEX}.gz")


def test_sha1_sums() -> None:
    digest = hashlib.sha1(b"hello").digest()
    s = sha1sum_from_digest(digest)
    assert sha1sum_to_digest(s) == digest
    assert sha1sum_to_hex(s) == digest.hex()
    assert sha1sum_from_hex(digest.hex().upper()) == s
    assert not sha1sum_is_zero(s) and sha1sum_is_zero(pb.SHA1Sum())
    assert sha1sum_to_hex(SUM) == HEX
    for bad in ("", "zz" * 20, "ab " * 20, HEX + "00"):
        with pytest.raises(ValidationError):
            sha1sum_from_hex(bad)
    with pytest.raises(ValidationError):
        sha1sum_from_digest(b"short")


def test_codec_extensions() -> None:
    assert CODEC_EXTENSIONS == {
        pb.NONE: ".raw",
        pb.GZIP: ".gz",
        pb.ZSTANDARD: ".zst",
        pb.SNAPPY: ".sz",
        pb.GZIP_OFFLOAD_DECOMPRESSION: "",
    }
    for codec, ext in CODEC_EXTENSIONS.items():
        assert codec_from_extension(ext) == codec
    assert codec_from_extension(".GzOd") == pb.GZIP_OFFLOAD_DECOMPRESSION
    with pytest.raises(ValidationError, match=r"unrecognized compression extension: \.lz4"):
        codec_from_extension(".lz4")
