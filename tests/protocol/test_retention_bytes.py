"""The `pygazette.dev/retention-bytes` label: parsing, formatting and spec validation."""

from __future__ import annotations

import pytest

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.retention_bytes import (
    RETENTION_BYTES_LABEL,
    format_retention_bytes,
    parse_retention_bytes,
    retention_bytes,
)
from pygazette.protocol.validation import validate_journal_spec


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("1", 1),
        ("1073741824", 1 << 30),
        ("512B", 512),
        ("3kB", 3000),
        ("3KB", 3000),
        ("500MB", 500_000_000),
        ("2GB", 2_000_000_000),
        ("1TB", 10**12),
        ("4KiB", 4096),
        ("10MiB", 10 << 20),
        ("10GiB", 10 << 30),
        ("2TiB", 2 << 40),
    ],
)
def test_parse(value: str, size: int) -> None:
    assert parse_retention_bytes(value) == size


@pytest.mark.parametrize(
    "value",
    [
        "",
        "0",
        "0MiB",
        "-1",
        "1.5GiB",
        "10 MiB",
        "10mib",
        "10Mb",
        "10M",
        "GiB",
        "1e9",
        "9" * 21,
        "9223372036854775808",
        "99999999999TiB",
    ],
)
def test_parse_rejects(value: str) -> None:
    with pytest.raises(ValidationError, match=RETENTION_BYTES_LABEL):
        parse_retention_bytes(value)


def test_format_round_trips() -> None:
    for size in (1, 1000, 1024, 10 << 20, 3 << 30, (5 << 40) + 1):
        assert parse_retention_bytes(format_retention_bytes(size)) == size
    assert format_retention_bytes(10 << 20) == "10MiB"


def _spec(*values: str) -> pb.JournalSpec:
    spec = pb.JournalSpec(name="bounded/journal", replication=1)
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.refresh_interval.seconds = 60
    for value in sorted(values):
        spec.labels.labels.add(name=RETENTION_BYTES_LABEL, value=value)
    return spec


def test_spec_validation() -> None:
    validate_journal_spec(_spec("64MiB"))
    assert retention_bytes(_spec("64MiB")) == 64 << 20
    assert retention_bytes(_spec()) == 0
    with pytest.raises(ValidationError, match=r"^Labels: invalid pygazette.dev/retention-bytes"):
        validate_journal_spec(_spec("lots"))
    with pytest.raises(ValidationError, match="takes a single value"):
        validate_journal_spec(_spec("1MiB", "2MiB"))
    assert retention_bytes(_spec("lots")) == 0  # Unvalidated (hand-written): unbounded.
