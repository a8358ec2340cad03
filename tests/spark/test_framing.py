"""Record framing of the connector: boundaries, payloads, parsing (unit and property tests),
and properties that the bulk scanner and the message layer's framings find the same records."""

from __future__ import annotations

import csv
import io
import json
import re

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.message import (
    CSVFraming,
    Envelope,
    FixedFraming,
    JSONFraming,
    MessageDecodeError,
    Unpacker,
)
from pygazette.message import Framing as MessageFraming
from pygazette.message.csv_framing import format_record
from pygazette.message.fixed_framing import (
    FIXED_FRAME_HEADER,
    FIXED_FRAME_WORD,
    MAX_FRAME_LENGTH,
    encode_fixed_frame,
)
from pygazette.message.framing import FrameDesync
from pygazette.spark import framing as fr
from pygazette.spark.framing import Framing, RecordError

lines_st = st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=40)


def records_of(framing: Framing, buf: bytes, *, final: bool = True) -> list[tuple[int, bytes]]:
    spans = fr.scan(framing, buf, final=final)
    values = fr.binary_values(buf, spans).to_pylist()
    return list(zip(spans.starts.tolist(), values, strict=True))


@settings(deadline=None)
@given(lines_st, st.booleans())
def test_lines_round_trip(lines: list[bytes], trailing: bool) -> None:
    buf = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    got = records_of(Framing.LINES, buf)
    expected = buf.split(b"\n")
    if buf.endswith(b"\n") or not buf:
        expected = expected[:-1]
    assert [v for _, v in got] == expected
    offset = 0
    for start, value in got:
        assert start == offset
        offset += len(value) + 1


@settings(deadline=None)
@given(lines_st, st.booleans(), st.integers(min_value=0, max_value=40), st.data())
def test_newline_framed_payloads_match_the_general_path(
    lines: list[bytes], trailing: bool, lo: int, data: st.DataObject
) -> None:
    """The newline fast path (drop every newline at once) keeps exactly the payloads, for any
    run of records a piece owns (empty lines and a final line without newline included)."""
    buf = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    spans = fr.scan(Framing.LINES, buf, final=True)
    lo = min(lo, len(spans))
    hi = data.draw(st.integers(min_value=lo, max_value=len(spans)))
    owned = spans.select(lo, hi)
    fast = fr.binary_values(buf, owned, newline_framed=True)
    assert fast.to_pylist() == fr.binary_values(buf, owned).to_pylist()
    assert fast.to_pylist() == buf.split(b"\n")[lo:hi]
    fast.validate(full=True)


@settings(deadline=None)
@given(lines_st, st.integers(min_value=0, max_value=400))
def test_scanning_in_pieces_agrees_with_one_scan(lines: list[bytes], cut: int) -> None:
    """Scanning a prefix (not final) then the rest finds exactly the whole-buffer records."""
    buf = b"".join(line + b"\n" for line in lines)
    cut = min(cut, len(buf))
    first = fr.scan(Framing.LINES, buf[:cut], final=False)
    rest = fr.scan(Framing.LINES, buf[first.consumed :], final=True)
    starts = first.starts.tolist() + (rest.starts + first.consumed).tolist()
    assert starts == fr.scan(Framing.LINES, buf, final=True).starts.tolist()


@settings(deadline=None)
@given(lines_st, st.integers(min_value=1, max_value=400))
def test_resync_finds_the_first_record_beginning_after_a_point(lines: list[bytes], at: int) -> None:
    buf = b"".join(line + b"\n" for line in lines)
    if at > len(buf):
        return
    starts = fr.scan(Framing.LINES, buf, final=True).starts.tolist()
    # Scanning from at-1 and dropping the partial record finds the first start >= at.
    first = fr.resync(buf[at - 1 :])
    expected = [s for s in starts if s >= at]
    if first < 0 or at - 1 + first == len(buf):  # No record begins at or after `at`.
        assert not expected
    else:
        assert at - 1 + first == expected[0]


csv_fields = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)


@settings(deadline=None)
@given(st.lists(st.lists(csv_fields, min_size=1, max_size=4), max_size=20))
def test_csv_boundaries_respect_quoted_newlines(rows: list[list[str]]) -> None:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL).writerows(rows)
    buf = out.getvalue().encode()
    spans = fr.scan(Framing.CSV, buf, final=True)
    parsed = [
        next(csv.reader([buf[lo:hi].decode()]), [])
        for lo, hi in zip(spans.value_starts.tolist(), spans.value_ends.tolist(), strict=True)
    ]
    assert parsed == rows


def test_csv_unbalanced_quote_at_the_end_is_an_error() -> None:
    with pytest.raises(RecordError, match="inside a quoted field"):
        fr.scan(Framing.CSV, b'1,"open\n2,x\n', final=True)
    # Not final: the open record simply is not complete yet.
    assert len(fr.scan(Framing.CSV, b'1,"open\n2,x\n', final=False)) == 0


@settings(deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=30))
def test_fixed_framing_round_trip(payloads: list[bytes]) -> None:
    buf = b"".join(encode_fixed_frame(p) for p in payloads)
    got = records_of(Framing.PROTOBUF_FIXED, buf)
    assert [v for _, v in got] == payloads
    assert got[0][0] == 0 if payloads else True


def test_fixed_framing_detects_desync_and_truncation() -> None:
    good = encode_fixed_frame(b"hello")
    with pytest.raises(RecordError, match="desynchronised"):
        fr.scan(Framing.PROTOBUF_FIXED, good + b"garbage!!" + good, final=True)
    with pytest.raises(RecordError, match="truncated"):
        fr.scan(Framing.PROTOBUF_FIXED, good + good[:6], final=True)
    partial = fr.scan(Framing.PROTOBUF_FIXED, good + good[:6], final=False)
    assert len(partial) == 1 and partial.consumed == len(good)
    # A header announcing more than a frame may hold is not waited for: it is a desync.
    huge = FIXED_FRAME_HEADER.pack(FIXED_FRAME_WORD, MAX_FRAME_LENGTH + 1)
    with pytest.raises(RecordError, match=r"desynchronised at \+13: implausible frame length"):
        fr.scan(Framing.PROTOBUF_FIXED, good + huge, final=False)


def test_json_blank_lines_are_not_records_and_errors_name_the_record() -> None:
    buf = b'{"a": 1}\n\n{"a": 2}\r\n \t\r\n{"a": 3}\n'
    spans = fr.scan(Framing.JSON, buf, final=True)
    spans = spans.mask(~fr.blank_records(Framing.JSON, buf, spans))
    table = fr.parse_json(buf, spans, pa.schema([("a", pa.int64())]))
    assert table.column("a").to_pylist() == [1, 2, 3]
    assert spans.starts.tolist() == [0, 10, 24]

    # Only JSON white space makes a blank line: a form feed is not, nor is any line of the
    # lines framing, which has no blank rule.
    odd = b"\x0c\n \n"
    spans = fr.scan(Framing.JSON, odd, final=True)
    assert fr.blank_records(Framing.JSON, odd, spans).tolist() == [False, True]
    assert fr.blank_records(Framing.LINES, odd, spans).tolist() == [False, False]


def test_csv_blank_lines_are_empty_or_a_lone_carriage_return() -> None:
    """As Go's encoding/csv: an empty line (LF or CRLF) is skipped; white space is a field."""
    buf = b"a,b\n\n\r\n  \n\r\r\nc,d\n"
    spans = fr.scan(Framing.CSV, buf, final=True)
    assert fr.blank_records(Framing.CSV, buf, spans).tolist() == [
        False,
        True,
        True,
        False,
        False,
        False,
    ]

    bad = b'{"a": 1}\n{"a": oops}\n'
    spans = fr.scan(Framing.JSON, bad, final=True)
    with pytest.raises(RecordError, match=r"at offset 9.*invalid JSON"):
        fr.parse_json(bad, spans, None, describe=lambda s: f"at offset {s}")


@settings(deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries({"n": st.integers(-(2**40), 2**40), "s": st.text(max_size=10)}),
        min_size=1,
        max_size=20,
    )
)
def test_json_parse_matches_json_loads(docs: list[dict[str, object]]) -> None:
    buf = b"".join(json.dumps(d).encode() + b"\n" for d in docs)
    spans = fr.scan(Framing.JSON, buf, final=True)
    table = fr.parse_json(buf, spans, pa.schema([("n", pa.int64()), ("s", pa.string())]))
    assert table.to_pylist() == docs


def test_framing_names() -> None:
    assert Framing.parse("Protobuf-Fixed") is Framing.PROTOBUF_FIXED
    with pytest.raises(ValueError, match="unknown framing 'xml'"):
        Framing.parse("xml")


# The bulk scanner and the message layer's framings agree ----------------------------------

Record = tuple[int, int, bool]  # [begin, end) with delimiter or header, and blankness.


def split_records(framing: MessageFraming, buf: bytes) -> tuple[list[Record], int, bool]:
    """Records `framing.split` finds at the front of `buf`, called until it finds no more (as
    the Unpacker does); how many bytes they span; and whether a desync stopped it."""
    records: list[Record] = []
    pos = 0
    while True:
        try:
            payloads, consumed = framing.split(buf[pos:])
        except FrameDesync:
            return records, pos, True
        if not payloads:
            return records, pos, False
        start = pos
        for payload in payloads:
            end = pos + len(payload) + framing.overhead
            records.append((pos, end, framing.is_blank(payload)))
            pos = end
        assert pos - start == consumed


def scan_records(framing: Framing, buf: bytes) -> tuple[list[Record], int, bool]:
    """The same, from the bulk scanner (not final: the buffer may end within a record). At a
    desync the scanner fails the read, naming where; the records are those before it."""
    desync = False
    try:
        spans = fr.scan(framing, buf, final=False)
    except RecordError as exc:
        where = re.search(r"desynchronised at \+(\d+)", str(exc))
        assert where is not None, exc
        buf = buf[: int(where.group(1))]
        spans = fr.scan(framing, buf, final=True)
        desync = True
    starts = spans.starts.tolist()
    ends = [*starts[1:], spans.consumed] if starts else []
    blank = fr.blank_records(framing, buf, spans).tolist()
    return list(zip(starts, ends, blank, strict=True)), spans.consumed, desync


def unpacked(framing: MessageFraming, buf: bytes) -> list[tuple[int, int]]:
    """[begin, end) of each message (or undecodable frame) the Unpacker reports."""
    out: list[Envelope | BaseException] = []
    Unpacker(framing, "j").feed(buf, out)
    spans = []
    for item in out:
        assert isinstance(item, Envelope | MessageDecodeError), item
        spans.append((item.begin, item.end))
    return spans


def assert_agree(framing: Framing, rules: MessageFraming, buf: bytes) -> None:
    scanned = scan_records(framing, buf)
    assert scanned == split_records(rules, buf)
    if not scanned[2]:
        # Readers of messages skip exactly the records the connector does not make rows of.
        assert unpacked(rules, buf) == [(b, e) for b, e, blank in scanned[0] if not blank]


def cut_at(data: bytes, cut: int) -> bytes:
    return data[: cut % (len(data) + 1)]


# Lines of JSON, blank ones (JSON white space, CRLF), white space that JSON does not allow
# (form feed), and arbitrary bytes.
json_lines = st.lists(
    st.sampled_from(
        [b"", b"\r", b" ", b" \t\r", b"\x0c", b'{"a": 1}', b' {"b": [1, 2]}\r', b"[]", b"x"]
    )
    | st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")),
    max_size=30,
)


@settings(deadline=None)
@given(json_lines, st.integers(min_value=0))
def test_json_and_lines_scanning_agrees_with_the_message_framing(
    lines: list[bytes], cut: int
) -> None:
    buf = cut_at(b"".join(line + b"\n" for line in lines), cut)
    assert_agree(Framing.JSON, JSONFraming(), buf)
    # The lines framing has the same boundaries, and no blank records.
    records, consumed, _ = scan_records(Framing.LINES, buf)
    assert [(b, e) for b, e, _ in records] == [
        (b, e) for b, e, _ in split_records(JSONFraming(), buf)[0]
    ]
    assert consumed == split_records(JSONFraming(), buf)[1]
    assert not any(blank for _, _, blank in records)


csv_text = st.text(st.sampled_from('ab ,"\n\r\t\u00e9'), max_size=6)
csv_lines = st.lists(
    st.lists(csv_text, min_size=1, max_size=4).map(lambda r: format_record(r).encode())
    | st.sampled_from([b"\n", b"\r\n", b"  \n", b"\r\r\n"])
    # Lines Go's writer would not write: a stray quote mid-field or after a closing quote
    # (an invalid row, ending with its line, as in Go's reader), or a quoted field left open.
    | st.sampled_from([b'a"b\n', b'"\n', b'x,"y\n', b'"x"y,z\n', b'u,"a""b"\rc\n']),
    max_size=25,
)


@settings(deadline=None)
@given(csv_lines, st.integers(min_value=0))
def test_csv_scanning_agrees_with_the_message_framing(lines: list[bytes], cut: int) -> None:
    """Quoted newlines, CRLF and blank lines: the same rows end at the same offsets."""
    assert_agree(Framing.CSV, CSVFraming(), cut_at(b"".join(lines), cut))


fixed_pieces = st.lists(
    st.binary(max_size=30).map(encode_fixed_frame)
    | st.sampled_from(
        [
            b"garbage!",  # Not a header.
            FIXED_FRAME_HEADER.pack(FIXED_FRAME_WORD, MAX_FRAME_LENGTH + 1),  # Implausible.
            FIXED_FRAME_WORD,  # A word and no length.
        ]
    ),
    max_size=15,
)


@settings(deadline=None)
@given(fixed_pieces, st.integers(min_value=0))
def test_fixed_scanning_agrees_with_the_message_framing(pieces: list[bytes], cut: int) -> None:
    """Whole frames, incomplete ones and desyncs are found at the same offsets."""
    assert_agree(Framing.PROTOBUF_FIXED, FixedFraming(), cut_at(b"".join(pieces), cut))


def test_json_string_columns_take_any_value_as_its_text_as_spark_does() -> None:
    # Spark's JSON reader fills a string column from a number, a boolean, an object or an
    # array as the value's JSON text; Arrow's refused the block ('changed from string to
    # number'), failing the read. A value the type cannot hold still fails, naming it.
    buf = b'{"n":1,"s":"text"}\n{"n":2,"s":12}\n{"n":3,"s":{"a":[1,true]}}\n{"n":4}\n'
    spans = fr.scan(Framing.JSON, buf, final=True)
    table = fr.parse_json(buf, spans, pa.schema([("n", pa.int64()), ("s", pa.string())]))
    assert table.to_pylist() == [
        {"n": 1, "s": "text"},
        {"n": 2, "s": "12"},
        {"n": 3, "s": '{"a":[1,true]}'},
        {"n": 4, "s": None},
    ]
    bad = b'{"n":"5"}\n'
    with pytest.raises(RecordError, match="column n"):
        fr.parse_json(bad, fr.scan(Framing.JSON, bad, final=True), pa.schema([("n", pa.int64())]))


def test_csv_float_fields_of_nan_are_nan_not_null() -> None:
    # Arrow's CSV reader takes 'NaN' and 'nan' for null; Spark's reads them as NaN (its
    # nanValue), and the sink writes a NaN double as 'nan': it came back null.
    buf = b"NaN,1\nnan,NULL\n-nan,NA\n,\n"
    spans = fr.scan(Framing.CSV, buf, final=True)
    schema = pa.schema([("x", pa.float64()), ("n", pa.int64())])
    rows = fr.parse_csv(buf, spans, ["x", "n"], schema).to_pylist()
    assert [r["n"] for r in rows] == [1, None, None, None]
    assert [r["x"] != r["x"] for r in rows[:3]] == [True, True, True]  # NaN
    assert rows[3]["x"] is None


def test_csv_binary_fields_read_back_what_the_sink_wrote() -> None:
    # The sink writes a binary column under csv as base64 text; read with a binary schema,
    # the field came back as that text's bytes (b'AGhpCg==' for b'\x00hi\n').
    from pygazette.spark import sink
    from pygazette.spark.options import parse_write_options

    schema = pa.schema([("b", pa.binary()), ("n", pa.int64())])
    batch = pa.RecordBatch.from_pylist(
        [{"b": b"\x00hi\n", "n": 1}, {"b": b"", "n": 2}, {"b": bytes(range(256)), "n": 3}],
        schema=schema,
    )
    opts = parse_write_options({"journal": "a/csv", "framing": "csv"})
    plan = sink.SinkPlan(opts, Framing.CSV, ("b", "n"), (), False, ("b", "n"), "writer")
    data = sink.encode(plan, batch, None)
    rows = fr.parse_csv(data, fr.scan(Framing.CSV, data, final=True), ["b", "n"], schema)
    assert rows.to_pylist() == batch.to_pylist()
    bad = b"not base64!,4\n"
    with pytest.raises(RecordError, match="column b"):
        fr.parse_csv(bad, fr.scan(Framing.CSV, bad, final=True), ["b", "n"], schema)
