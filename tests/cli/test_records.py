"""Cutting CLI input into records, and journal output at message boundaries."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pygazette.cli.records import MessageAligner, RecordError, RecordSplitter
from pygazette.message import encode_fixed_frame

_cuts = st.lists(st.integers(0, 10**6), max_size=8)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


@given(
    st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20),
    _cuts,
    st.booleans(),
)
def test_lines_are_cut_whole_however_input_arrives(
    lines: list[bytes], cuts: list[int], whole: bool
) -> None:
    data = b"".join(line + b"\n" for line in lines)
    splitter = RecordSplitter("lines")
    got: list[bytes] = []
    joined = b""
    for piece in pieces(data, cuts):
        if whole:
            block = splitter.whole(piece)
            assert block.endswith(b"\n") or not block
            joined += block
        else:
            got.extend(splitter.feed(piece))
    assert splitter.finish() == b""
    if whole:
        assert joined == data
    else:
        assert got == [line + b"\n" for line in lines]


@given(st.lists(st.binary(max_size=40), max_size=12), _cuts, st.booleans())
def test_fixed_frames_are_cut_whole(payloads: list[bytes], cuts: list[int], whole: bool) -> None:
    frames = [encode_fixed_frame(p) for p in payloads]
    data = b"".join(frames)
    splitter = RecordSplitter("fixed")
    got: list[bytes] = []
    for piece in pieces(data, cuts):
        if whole:
            block = splitter.whole(piece)
            if block:
                got.append(block)
        else:
            got.extend(splitter.feed(piece))
    splitter.finish()
    assert (b"".join(got) if whole else got) == (data if whole else frames)
    if not whole:
        assert [splitter.key(f, False) for f in got] == payloads


def test_bad_input_is_a_clear_error() -> None:
    splitter = RecordSplitter("fixed")
    with pytest.raises(RecordError, match="not fixed-framed at byte 0"):
        splitter.feed(b"this is not a frame")
    splitter = RecordSplitter("fixed")
    splitter.feed(encode_fixed_frame(b"ok") + encode_fixed_frame(b"cut")[:9])
    with pytest.raises(RecordError, match="ends within a fixed frame at byte 10"):
        splitter.finish()
    lines = RecordSplitter("lines")
    assert lines.feed(b"a\nb") == [b"a\n"]
    assert lines.finish() == b"b"  # A last line without newline is kept.
    assert lines.key(b"key\r\n", False) == b"key"
    assert lines.key(base64.b64encode(b"\x00\xff") + b"\n", True) == b"\x00\xff"
    with pytest.raises(RecordError, match="not base64"):
        lines.key(b"!!!\n", True)


@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20), _cuts)
def test_json_output_is_cut_at_line_ends(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines) + b"partial"
    aligner = MessageAligner("application/x-ndjson")
    out = []
    for piece in pieces(data, cuts):
        block = aligner.feed(piece)
        assert not block or block.endswith(b"\n")
        out.append(block)
    out.append(aligner.finish())
    assert b"".join(out) == data


@given(
    st.lists(
        st.lists(st.sampled_from(["a", '"', ",", "\n", "x y"]), min_size=1, max_size=3), max_size=10
    ),
    _cuts,
)
def test_csv_output_is_cut_at_record_ends(rows: list[list[str]], cuts: list[int]) -> None:
    from pygazette.message.csv_framing import format_record

    records = [format_record(r).encode() for r in rows]
    data = b"".join(records)
    ends = {0}
    pos = 0
    for r in records:
        pos += len(r)
        ends.add(pos)
    aligner = MessageAligner("text/csv")
    written = 0
    for piece in pieces(data, cuts):
        written += len(aligner.feed(piece))
        assert written in ends  # Never within a record.
    assert written + len(aligner.finish()) == len(data)


def test_fixed_output_and_unknown_types() -> None:
    frames = encode_fixed_frame(b"one") + encode_fixed_frame(b"two")
    aligner = MessageAligner("application/x-protobuf-fixed")
    assert aligner.feed(frames[:14]) == frames[:11]
    assert aligner.feed(frames[14:]) == frames[11:]
    # Not frames: passed through (bar a tail that could begin a frame, until the end).
    assert aligner.feed(b"junk" * 3) + aligner.finish() == b"junk" * 3
    raw = MessageAligner("application/octet-stream")
    assert not raw.aligned and raw.feed(b"as is") == b"as is"
