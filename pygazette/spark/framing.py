"""Record framing of journal content, as the Spark connector reads and writes it: a bulk,
vectorised scanner that finds every record of a large buffer at once.

A journal is a byte stream; a framing says where its records begin and end. The rules are
the message layer's (`pygazette.message`), which this module applies in bulk:

- ``lines`` and ``json``: records end with `LINE_DELIMITER` (``\\n``); for ``json`` a line of
  JSON white space only is blank, not a record (`JSONFraming.is_blank`).
- ``csv``: RFC 4180 rows ending with ``\\n`` outside quotes (a quoted field may hold
  newlines; `csv_framing.QUOTE`); an empty line, or a lone CR, is blank
  (`CSVFraming.is_blank`, as Go's ``encoding/csv`` that Gazette uses). A stray quote (not
  one opening a field, closing it or escaped) makes its row invalid, and the row ends with
  its line, as in Go's reader (`csv_framing.record_end`).
- ``protobuf-fixed``: Gazette's fixed framing (`fixed_framing`: a header of the magic word
  ``66 33 93 36`` and a little-endian uint32 length before each message); a header that is
  not one (wrong word, implausible length) is a desynchronisation.
- ``raw`` has no records: rows are append-aligned chunks (see `partition_reader`).

Scanning works on a buffer that begins at a record boundary and finds whole records with
numpy passes (newline and quote positions), never a per-byte Python loop; fixed frames are
walked header to header with the message layer's `fixed_frame_starts`. Content that ends
without a final delimiter (an append that did not end in ``\\n``) is a last record ending at
the range end. The message layer's per-message `Framing.split` finds the same boundaries
(tests/spark/test_framing.py checks it); this module exists because Spark reads buffers of
many megabytes into Arrow columns, where one numpy pass beats a list of payloads, and
because numpy is a dependency of the ``spark`` extra only.
"""

from __future__ import annotations

import enum
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pygazette.message.csv_framing import CARRIAGE_RETURN, QUOTE, CSVFraming
from pygazette.message.csv_framing import record_end as csv_record_end
from pygazette.message.fixed_framing import (
    FIXED_FRAME_HEADER_LENGTH,
    FixedFraming,
    check_fixed_header,
    fixed_frame_starts,
)
from pygazette.message.framing import LINE_DELIMITER, FrameDesync
from pygazette.message.framing import Framing as MessageFraming
from pygazette.message.json_framing import JSONFraming
from pygazette.protocol.errors import GazetteError
from pygazette.spark.json_values import JSONValueError, needs_conversion
from pygazette.spark.json_values import column as json_column

if TYPE_CHECKING:
    import pyarrow as pa

_NEWLINE = LINE_DELIMITER[0]
_QUOTE = QUOTE[0]
_CR = CARRIAGE_RETURN[0]
_COMMA = ord(",")


class Framing(enum.Enum):
    RAW = "raw"
    LINES = "lines"
    JSON = "json"
    CSV = "csv"
    PROTOBUF_FIXED = "protobuf-fixed"

    @classmethod
    def parse(cls, text: str) -> Framing:
        value = text.strip().lower()
        for framing in cls:
            if framing.value == value:
                return framing
        choices = ", ".join(f.value for f in cls)
        raise ValueError(f"unknown framing {text!r} (expected one of: {choices})")

    @property
    def resyncs(self) -> bool:
        """Whether a record boundary can be found from any offset (the byte before it is a
        newline), rather than only by scanning from a known boundary."""
        return self in (Framing.LINES, Framing.JSON)

    @property
    def has_records(self) -> bool:
        return self is not Framing.RAW

    @property
    def message_framing(self) -> MessageFraming | None:
        """The message-layer framing whose rules this one follows (None for raw and lines,
        which carry no messages)."""
        return _MESSAGE_FRAMINGS.get(self)


_MESSAGE_FRAMINGS: dict[Framing, MessageFraming] = {
    Framing.JSON: JSONFraming(),
    Framing.CSV: CSVFraming(),
    Framing.PROTOBUF_FIXED: FixedFraming(),
}


class RecordError(GazetteError, ValueError):
    """Journal content that does not follow its framing (desync, truncation, bad JSON/CSV)."""


@dataclass(frozen=True, slots=True)
class RecordSpans:
    """Whole records found in a buffer. Arrays index into the buffer.

    `starts[i]` is where record i begins, `[value_starts[i], value_ends[i])` is its payload
    (without delimiter or header), and `consumed` is the offset just past the last whole
    record: the next scan starts there.
    """

    starts: np.ndarray[Any, np.dtype[np.int64]]
    value_starts: np.ndarray[Any, np.dtype[np.int64]]
    value_ends: np.ndarray[Any, np.dtype[np.int64]]
    consumed: int

    def __len__(self) -> int:
        return len(self.starts)

    def select(self, lo: int, hi: int) -> RecordSpans:
        """Records lo..hi-1 (consumed is then the end of record hi-1, or unchanged if empty)."""
        if lo == 0 and hi == len(self.starts):
            return self
        return RecordSpans(
            self.starts[lo:hi],
            self.value_starts[lo:hi],
            self.value_ends[lo:hi],
            self.consumed,
        )

    def mask(self, keep: np.ndarray[Any, np.dtype[np.bool_]]) -> RecordSpans:
        return RecordSpans(
            self.starts[keep], self.value_starts[keep], self.value_ends[keep], self.consumed
        )


_EMPTY = np.zeros(0, dtype=np.int64)


def empty_spans(consumed: int = 0) -> RecordSpans:
    return RecordSpans(_EMPTY, _EMPTY, _EMPTY, consumed)


def scan(framing: Framing, buf: bytes, *, final: bool) -> RecordSpans:
    """Whole records of `buf`, which begins at a record boundary.

    With `final`, `buf` ends at a record boundary too: trailing content without a delimiter
    is a last record (or, for fixed framing, a truncation error).
    """
    if framing in (Framing.LINES, Framing.JSON):
        return _scan_newlines(buf, final)
    if framing is Framing.CSV:
        return _scan_csv(buf, final)
    if framing is Framing.PROTOBUF_FIXED:
        return _scan_fixed(buf, final)
    raise ValueError(f"framing {framing.value} has no records")


def _as_array(buf: bytes) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.frombuffer(buf, dtype=np.uint8)


def _spans_from_ends(
    ends: np.ndarray[Any, np.dtype[np.int64]], size: int, final: bool
) -> RecordSpans:
    """Records delimited by newlines at `ends` (plus a trailing partial one when final)."""
    tail = int(ends[-1]) + 1 if len(ends) else 0
    if final and tail < size:
        value_ends = np.append(ends, size).astype(np.int64)
        consumed = size
    else:
        value_ends = ends.astype(np.int64, copy=False)
        consumed = int(ends[-1]) + 1 if len(ends) else 0
    starts = np.empty(len(value_ends), dtype=np.int64)
    if len(value_ends):
        starts[0] = 0
        starts[1:] = value_ends[:-1] + 1
    return RecordSpans(starts, starts, value_ends, consumed)


def _scan_newlines(buf: bytes, final: bool) -> RecordSpans:
    ends = np.flatnonzero(_as_array(buf) == _NEWLINE)
    return _spans_from_ends(ends, len(buf), final)


def _quotes_are_well_placed(
    arr: np.ndarray[Any, np.dtype[np.uint8]], quotes: np.ndarray[Any, np.dtype[np.int64]]
) -> bool:
    """Whether every quote of `arr` (which begins at a record boundary; `quotes` are their
    offsets) opens a quoted field at a field's start, closes one before a comma or line end,
    or is half of an escaped quote: then the quotes before a newline are balanced iff it
    ends a record."""
    if not len(quotes):
        return True
    size = len(arr)
    opening, closing = quotes[0::2], quotes[1::2]
    before = arr[opening[opening > 0] - 1]
    if not np.all((before == _COMMA) | (before == _NEWLINE) | (before == _QUOTE)):
        return False
    after_at = closing[closing + 1 < size] + 1
    after = arr[after_at]
    if np.all((after == _COMMA) | (after == _NEWLINE) | (after == _QUOTE)):
        return True
    cr = after_at[after == _CR]
    ok = (after == _COMMA) | (after == _NEWLINE) | (after == _QUOTE)
    ok[after == _CR] = (cr + 1 >= size) | (arr[np.minimum(cr + 1, size - 1)] == _NEWLINE)
    return bool(np.all(ok))


def _scan_csv(buf: bytes, final: bool) -> RecordSpans:
    arr = _as_array(buf)
    newlines = np.flatnonzero(arr == _NEWLINE)
    if len(newlines):
        is_quote = arr == _QUOTE
        quotes = np.flatnonzero(is_quote)
    if len(newlines) and _quotes_are_well_placed(arr, quotes):
        if len(quotes):
            # A newline ends a record when the quotes before it are balanced.
            parity = np.cumsum(is_quote, dtype=np.int64)
            ends = newlines[(parity[newlines] & 1) == 0]
        else:
            ends = newlines
    elif len(newlines):
        # A quote where Go's reader takes it for an error of its record (which then ends
        # with its line), not for the start of a quoted field: its rules, record by record.
        found: list[int] = []
        pos = 0
        while (end := csv_record_end(buf, pos)) >= 0:
            found.append(end)
            pos = end + 1
        ends = np.asarray(found, dtype=np.int64)
    else:
        ends = newlines
    if final:
        tail = int(ends[-1]) + 1 if len(ends) else 0
        if tail < len(buf) and QUOTE in buf[tail:]:
            if csv_record_end(buf[tail:] + LINE_DELIMITER, 0) < 0:
                raise RecordError("CSV record ends inside a quoted field")
    return _spans_from_ends(ends, len(buf), final)


def _scan_fixed(buf: bytes, final: bool) -> RecordSpans:
    starts, pos = fixed_frame_starts(buf)
    try:
        check_fixed_header(buf, pos)
    except FrameDesync as exc:
        raise RecordError(f"fixed framing desynchronised at +{pos}: {exc.detail}") from None
    size = len(buf)
    if final and pos != size:
        raise RecordError(
            f"truncated fixed-framed record at +{pos}: {size - pos} bytes remain of a frame"
        )
    s = np.asarray(starts, dtype=np.int64)
    ends = np.empty(len(s), dtype=np.int64)
    ends[:-1] = s[1:]
    if len(s):
        ends[-1] = pos
    return RecordSpans(s, s + FIXED_FRAME_HEADER_LENGTH, ends, pos)


def resync(buf: bytes) -> int:
    """For newline framings: where the first record begins in `buf`, whose first byte is the
    one just before a possible boundary (one past the first newline), or -1 if none is
    in `buf` yet."""
    nl = buf.find(LINE_DELIMITER)
    return -1 if nl < 0 else nl + len(LINE_DELIMITER)


def blank_records(
    framing: Framing, buf: bytes, spans: RecordSpans
) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Which records are blank under the message layer's rule for `framing` (they are not
    rows). Only empty records and those beginning with a `blank_lead` byte are asked."""
    rules = framing.message_framing
    n = len(spans)
    blank = np.zeros(n, dtype=np.bool_)
    if rules is None or not n:
        return blank
    lengths = spans.value_ends - spans.value_starts
    empty = lengths == 0
    if empty.any():
        blank[empty] = rules.is_blank(b"")
    if rules.blank_lead:
        nonempty = np.flatnonzero(~empty)
        firsts = _as_array(buf)[spans.value_starts[nonempty]]
        lead = np.frombuffer(rules.blank_lead, dtype=np.uint8)
        is_blank = rules.is_blank
        for i in nonempty[np.isin(firsts, lead)].tolist():
            blank[i] = is_blank(buf[int(spans.value_starts[i]) : int(spans.value_ends[i])])
    return blank


def binary_values(buf: bytes, spans: RecordSpans, *, newline_framed: bool = False) -> pa.Array:
    """The records' payloads as an Arrow binary array (one copy of the bytes).

    `newline_framed`: the spans were found by a newline framing's scan, so every newline in
    their range is a delimiter (no payload holds one)."""
    import pyarrow as pa

    n = len(spans)
    if n == 0:
        return pa.array([], type=pa.binary())
    arr = _as_array(buf)
    starts, ends = spans.value_starts, spans.value_ends
    lengths = ends - starts
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 1 << 31:
        raise RecordError(f"{total} bytes of records do not fit one Arrow batch")
    gaps = starts[1:] - ends[:-1]
    if n == 1 or bool(np.all(gaps == gaps[0])):
        # Evenly spaced payloads (newline or header gaps): drop the gap bytes in one pass.
        lo, hi = int(starts[0]), int(ends[-1])
        if n == 1 or gaps[0] == 0:
            data = arr[lo:hi]
        elif newline_framed and gaps[0] == 1:
            # Every newline in the range is a gap, and every gap a newline: removing them all
            # (bytes.replace, a C loop at memory speed) keeps exactly the payloads.
            return pa.Array.from_buffers(
                pa.binary(),
                n,
                [
                    None,
                    pa.py_buffer(offsets.astype(np.int32)),
                    pa.py_buffer(buf[lo:hi].replace(LINE_DELIMITER, b"")),
                ],
            )
        else:
            keep = np.ones(hi - lo, dtype=np.bool_)
            gap = int(gaps[0])
            for k in range(gap):
                keep[(ends[:-1] - lo) + k] = False
            data = arr[lo:hi][keep]
    else:
        delta = np.zeros(len(buf) + 1, dtype=np.int8)
        np.add.at(delta, starts, 1)
        np.add.at(delta, ends, -1)
        data = arr[np.cumsum(delta[:-1], dtype=np.int8) > 0]
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data.tobytes())],
    )


def block(buf: bytes, spans: RecordSpans) -> bytes:
    """The bytes from the first record's start to the last record's end (with delimiter)."""
    if not len(spans):
        return b""
    last_end = int(spans.value_ends[-1])
    if buf.startswith(LINE_DELIMITER, last_end):
        last_end += len(LINE_DELIMITER)
    return buf[int(spans.starts[0]) : last_end]


def parse_json(
    buf: bytes, spans: RecordSpans, schema: pa.Schema | None, *, describe: Any = None
) -> pa.Table:
    """Parse JSON-lines records (no blank ones) into a table of `schema` (inferred if None)."""
    import pyarrow as pa
    import pyarrow.json as pj

    # Columns Arrow's reader cannot fill as Spark does (maps, dates, binary) are built from
    # the records' values instead (`json_values`); a date column's text is read by Arrow as
    # a string and cast (vectorised).
    converted = []
    read_by_arrow = schema
    if schema is not None:
        converted = [f for f in schema if needs_conversion(f.type) and not _is_date(f.type)]
        read_by_arrow = pa.schema(
            [
                pa.field(f.name, pa.string()) if _is_date(f.type) else f
                for f in schema
                if f not in converted
            ]
        )
    data = block(buf, spans)
    read_options = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1))
    if read_by_arrow is not None:
        parse_options = pj.ParseOptions(
            explicit_schema=read_by_arrow, unexpected_field_behavior="ignore"
        )
    else:
        parse_options = pj.ParseOptions()
    table: pa.Table | None = None
    try:
        if read_by_arrow is None or len(read_by_arrow) or not converted:
            table = pj.read_json(
                io.BytesIO(data), read_options=read_options, parse_options=parse_options
            )
    except pa.ArrowInvalid as exc:
        if schema is None:
            raise _locate_json_error(buf, spans, exc, describe) from None
        # Values Arrow will not convert, though Spark's reader does (a number or an object
        # in a string column, as its JSON text): the block is built from its values.
        built = _converted_columns(buf, spans, list(schema), describe)
        return pa.Table.from_arrays([built[f.name] for f in schema], schema=schema)
    if table is not None and table.num_rows != len(spans):
        raise RecordError(
            f"JSON parser found {table.num_rows} records where the framing found {len(spans)}"
        )
    if schema is None:
        assert table is not None
        return table
    built = _converted_columns(buf, spans, converted, describe) if converted else {}
    for f in schema:
        if _is_date(f.type):
            assert table is not None
            try:
                built[f.name] = table.column(f.name).cast(f.type)
            except pa.ArrowInvalid as exc:
                raise RecordError(
                    _where(describe, None)
                    + f"JSON records do not match the schema: column {f.name} (date): {exc}"
                ) from None
    columns = [
        built[f.name] if f.name in built else table.column(f.name)  # type: ignore[union-attr]
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _is_date(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_date32(t))


def _converted_columns(
    buf: bytes, spans: RecordSpans, fields: list[pa.Field], describe: Any
) -> dict[str, pa.Array]:
    """The `fields` columns of the records, built from their values (`json_values`)."""
    import orjson

    records = []
    for start, lo, hi in zip(
        spans.starts.tolist(), spans.value_starts.tolist(), spans.value_ends.tolist(), strict=True
    ):
        try:
            record = orjson.loads(buf[lo:hi])
        except orjson.JSONDecodeError as exc:
            raise RecordError(
                _where(describe, start) + f"invalid JSON record: {exc}: {buf[lo:hi][:80]!r}"
            ) from None
        if not isinstance(record, dict):
            raise RecordError(
                _where(describe, start) + f"JSON record is not an object: {buf[lo:hi][:80]!r}"
            )
        records.append(record)
    out = {}
    for f in fields:
        try:
            out[f.name] = json_column([r.get(f.name) for r in records], f.type)
        except JSONValueError as exc:
            raise RecordError(
                _where(describe, None) + f"JSON records do not match the schema: column "
                f"{f.name} ({f.type}): {exc}"
            ) from None
    return out


def _locate_json_error(
    buf: bytes, spans: RecordSpans, exc: Exception, describe: Any
) -> RecordError:
    import json

    for start, lo, hi in zip(
        spans.starts.tolist(), spans.value_starts.tolist(), spans.value_ends.tolist(), strict=True
    ):
        text = buf[lo:hi]
        try:
            value = json.loads(text)
        except ValueError as err:
            return RecordError(
                _where(describe, start) + f"invalid JSON record: {err}: {text[:80]!r}"
            )
        if not isinstance(value, dict):
            return RecordError(
                _where(describe, start) + f"JSON record is not an object: {text[:80]!r}"
            )
    return RecordError(_where(describe, None) + f"JSON records do not match the schema: {exc}")


# Texts a non-string CSV field is null for: Arrow's, but for the spellings of NaN, which a
# float column reads as NaN, as Spark's CSV reader does (and as the sink writes NaN).
_CSV_NULLS = [
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "1.#IND",
    "1.#QNAN",
    "N/A",
    "NA",
    "NULL",
    "n/a",
    "null",
]


def parse_csv(
    buf: bytes, spans: RecordSpans, names: list[str], schema: pa.Schema, *, describe: Any = None
) -> pa.Table:
    """Parse CSV records (no blank ones) into columns `names` of types from `schema`."""
    import pyarrow as pa
    import pyarrow.csv as pc

    data = block(buf, spans)
    read_options = pc.ReadOptions(
        column_names=names, use_threads=False, block_size=max(1 << 20, len(data) + 1)
    )
    parse_options = pc.ParseOptions(newlines_in_values=True)
    # A binary field is base64 text, as the sink writes it (Spark's CSV has no binary type).
    binary = [f for f in schema if pa.types.is_binary(f.type)]
    convert_options = pc.ConvertOptions(
        column_types={f.name: pa.string() if f in binary else f.type for f in schema},
        strings_can_be_null=False,
        null_values=_CSV_NULLS,
    )
    try:
        table = pc.read_csv(
            io.BytesIO(data),
            read_options=read_options,
            parse_options=parse_options,
            convert_options=convert_options,
        )
    except pa.ArrowInvalid as exc:
        raise RecordError(_where(describe, int(spans.starts[0])) + f"invalid CSV: {exc}") from None
    if table.num_rows != len(spans):
        raise RecordError(
            _where(describe, int(spans.starts[0]))
            + f"CSV parser found {table.num_rows} records where the framing found {len(spans)}"
        )
    for f in binary:
        try:
            decoded = json_column(table.column(f.name).to_pylist(), f.type)
        except JSONValueError as exc:
            raise RecordError(
                _where(describe, int(spans.starts[0])) + f"invalid CSV: column {f.name}: {exc}"
            ) from None
        table = table.set_column(table.schema.get_field_index(f.name), f, decoded)
    return table


def _where(describe: Any, start: int | None) -> str:
    if describe is None:
        return ""
    return f"{describe(start)}: "
