"""The `pygazette.dev/retention-bytes` journal label: a size bound on a journal's fragments.

Gazette retains fragments by age only (`fragment.retention`). A journal labelled
`pygazette.dev/retention-bytes: <size>` also keeps no more than `<size>` bytes of persisted
journal content: once its persisted fragments span more, the oldest are removed (by the
broker's retention loop and `pygazette journals prune`; see `broker.fragment.retention` for the
rules that keep the head and never leave a gap). A label keeps specs wire-compatible: Gazette
brokers and gazctl carry it along and ignore it.

A size is a positive integer number of bytes, optionally followed by a unit: `B`; decimal
`kB`/`KB`, `MB`, `GB`, `TB` (powers of 1000); binary `KiB`, `MiB`, `GiB`, `TiB` (powers of
1024). No spaces, no fractions: `1073741824`, `500MB`, `10GiB`. Bytes are journal content
(offsets), before compression. The label takes a single value.
"""

from __future__ import annotations

import re

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.labels import label_values
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = [
    "RETENTION_BYTES_LABEL",
    "format_retention_bytes",
    "parse_retention_bytes",
    "retention_bytes",
    "validate_retention_bytes_label",
]

RETENTION_BYTES_LABEL = "pygazette.dev/retention-bytes"
MAX_RETENTION_BYTES = (1 << 63) - 1  # A protobuf int64 offset.

_UNITS = {
    "": 1,
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
}
_SIZE = re.compile(r"([0-9]{1,20})([A-Za-z]{0,3})")


def parse_retention_bytes(value: str) -> int:
    """The byte count a `pygazette.dev/retention-bytes` value names; ValidationError if bad."""
    match = _SIZE.fullmatch(value)
    unit = _UNITS.get(match.group(2)) if match else None
    if match is None or unit is None:
        raise ValidationError(
            f"invalid {RETENTION_BYTES_LABEL} ({value!r}; expected a positive integer number "
            "of bytes, optionally with a unit B, kB, MB, GB, TB, KiB, MiB, GiB or TiB, "
            "e.g. 10GiB)"
        )
    size = int(match.group(1)) * unit
    if not 0 < size <= MAX_RETENTION_BYTES:
        raise ValidationError(
            f"invalid {RETENTION_BYTES_LABEL} ({value!r}; expected 0 < bytes <= "
            f"{MAX_RETENTION_BYTES})"
        )
    return size


def validate_retention_bytes_label(labels: pb.LabelSet) -> None:
    """A journal's retention-bytes label, if any, has one valid value."""
    values = label_values(labels, RETENTION_BYTES_LABEL)
    if len(values) > 1:
        raise ValidationError(
            f"{RETENTION_BYTES_LABEL} takes a single value (got {len(values)}: {values[:2]})"
        )
    if values:
        parse_retention_bytes(values[0])


def retention_bytes(spec: pb.JournalSpec) -> int:
    """The byte bound of `spec`'s persisted fragments, or 0 (unbounded) without a valid label.

    Specs are validated on Apply; one that slipped past (written to etcd by hand) is
    treated as unbounded rather than failing retention for every other journal.
    """
    values = label_values(spec.labels, RETENTION_BYTES_LABEL)
    if len(values) != 1:
        return 0
    try:
        return parse_retention_bytes(values[0])
    except ValidationError:
        return 0


def format_retention_bytes(size: int) -> str:
    """`size` in the largest binary unit that divides it (the inverse of parsing)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)
