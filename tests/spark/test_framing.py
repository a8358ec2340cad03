"""Record framing of the connector: boundaries, payloads, parsing (unit and property tests)."""

from __future__ import annotations

import csv
import io
import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    buf = b"".join(fr.encode_fixed(p) for p in payloads)
    got = records_of(Framing.PROTOBUF_FIXED, buf)
    assert [v for _, v in got] == payloads
    assert got[0][0] == 0 if payloads else True


def test_fixed_framing_detects_desync_and_truncation() -> None:
    good = fr.encode_fixed(b"hello")
    with pytest.raises(RecordError, match="desynchronised"):
        fr.scan(Framing.PROTOBUF_FIXED, good + b"garbage!!" + good, final=True)
    with pytest.raises(RecordError, match="truncated"):
        fr.scan(Framing.PROTOBUF_FIXED, good + good[:6], final=True)
    partial = fr.scan(Framing.PROTOBUF_FIXED, good + good[:6], final=False)
    assert len(partial) == 1 and partial.consumed == len(good)


def test_json_blank_lines_are_not_records_and_errors_name_the_record() -> None:
    buf = b'{"a": 1}\n\n{"a": 2}\r\n   \n{"a": 3}\n'
    spans = fr.scan(Framing.JSON, buf, final=True)
    keep = ~fr.blank_records(buf, spans) & ~fr.whitespace_records(buf, spans)
    spans = spans.mask(keep)
    table = fr.parse_json(buf, spans, pa.schema([("a", pa.int64())]))
    assert table.column("a").to_pylist() == [1, 2, 3]
    assert spans.starts.tolist() == [0, 10, 24]

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
