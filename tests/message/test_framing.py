"""Framings and the Unpacker: Gazette's byte formats (vectors from its own code), and
round-trip properties with exact offsets however the stream is cut into reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pygazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    CSVFraming,
    Envelope,
    FixedFraming,
    Framing,
    JSONFraming,
    MessageDecodeError,
    PartialMessage,
    UnknownContentType,
    Unpacker,
    UUIDFormatter,
    encode_fixed_frame,
    fixed_framing,
    framing_for,
    new_producer_id,
)
from pygazette.message.csv_framing import format_record
from pygazette.message.fixed_framing import FIXED_FRAME_HEADER, FIXED_FRAME_WORD
from pygazette.message.uuid import TICK
from pygazette.protocol.pb import protocol_pb2 as pb

VECTORS = Path(__file__).parent / "data" / "gazette_vectors.txt"


def vector_lines(kind: str) -> list[str]:
    return [
        line[len(kind) + 1 :]
        for line in VECTORS.read_text().splitlines()
        if line.startswith(kind + " ")
    ]


def unpack(
    framing: Framing, data: bytes, cuts: list[int] = (), offset: int = 0
) -> list[Envelope | BaseException]:
    """Unpack `data` fed in pieces cut at `cuts`, then finish."""
    unpacker = Unpacker(framing, "j", offset)
    out: list[Envelope | BaseException] = []
    prev = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        unpacker.feed(data[prev:cut], out)
        prev = cut
    partial = unpacker.finish()
    if partial is not None:
        out.append(partial)
    return out


# Gazette's formats -------------------------------------------------------------------------


def test_fixed_frames_match_gazette() -> None:
    for line in vector_lines("fixed"):
        payload_hex, _, framed_hex = line.partition(" ")
        payload, framed = bytes.fromhex(payload_hex), bytes.fromhex(framed_hex)
        assert encode_fixed_frame(payload) == framed
        assert FixedFraming().marshal(payload) == framed
        (env,) = unpack(FixedFraming(), framed)
        assert isinstance(env, Envelope)
        assert (env.message, env.begin, env.end) == (payload, 0, len(framed))


def test_csv_records_match_gazette() -> None:
    records = [
        ["u", "plain", "1"],
        ["u", "with,comma", 'with "quote"'],
        ["u", "multi\nline", ""],
        ["u", " lead", "trail "],
        ["u", ""],
        ["u", "\r\n"],
    ]
    lines = vector_lines("csv")
    assert len(lines) == len(records)
    for record, line in zip(records, lines, strict=True):
        go = json.loads(line)  # Go's %q of these is valid JSON.
        assert format_record(record) == go
        assert CSVFraming().marshal(record) == go.encode()
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    stamped = [[text, *r[1:]] for r in records]
    data = b"".join(CSVFraming().marshal(r) for r in stamped)
    got = unpack(CSVFraming(), data)
    # The last record's CR LF field is read back as Go's reader does it: as LF.
    assert [e.message for e in got if isinstance(e, Envelope)] == [*stamped[:5], [text, "\n"]]


def test_registry_by_content_type() -> None:
    assert isinstance(framing_for("application/x-ndjson"), JSONFraming)
    assert isinstance(framing_for("text/csv"), CSVFraming)
    assert isinstance(framing_for("application/x-protobuf-fixed"), FixedFraming)
    with pytest.raises(UnknownContentType, match="no message framing for content-type text/x"):
        framing_for("text/x")
    with pytest.raises(UnknownContentType, match="no content-type label"):
        framing_for("")


# JSON --------------------------------------------------------------------------------------


def test_json_stamps_uuids_in_clock_order() -> None:
    producer = new_producer_id()
    fmt = UUIDFormatter(producer)
    framing = JSONFraming()
    msgs = [{"n": i} for i in range(5)]
    data = framing.marshal_sequence(msgs, fmt, 1000 * TICK, CONTINUE_TXN)
    envs = unpack(framing, data)
    assert [e.message["n"] for e in envs if isinstance(e, Envelope)] == list(range(5))
    for i, env in enumerate(envs):
        assert isinstance(env, Envelope)
        assert (env.producer, env.clock, env.flags) == (producer, (1000 + i) * TICK, CONTINUE_TXN)
    # The messages themselves were stamped, as Gazette's Publisher does.
    assert msgs[0]["uuid"] == fmt.format(1000 * TICK, CONTINUE_TXN)


def test_json_marshals_one_message_as_a_sequence_of_them_does() -> None:
    fmt = UUIDFormatter(new_producer_id())
    framing = JSONFraming()
    clock = (1 << 36) * TICK - TICK  # The last clock of a segment, and the first of the next.
    one = framing.marshal_sequence([{"n": 0}], fmt, clock, CONTINUE_TXN)
    two = framing.marshal_sequence([{"n": 0}, {"n": 1}], fmt, clock, CONTINUE_TXN)
    assert two.startswith(one) and one.endswith(b"\n") and one.count(b"\n") == 1
    assert type(one) is bytes


def test_json_reads_gazette_style_uuid_field_and_messages_without_uuids() -> None:
    fmt = UUIDFormatter(bytes.fromhex("010203040506"))
    text = fmt.format(5 * TICK, ACK_TXN)
    data = b'{"UUID":"%s","x":1}\n{"x":2}\n[1,2]\n' % text.encode()
    a, b, c = unpack(JSONFraming(), data)
    assert isinstance(a, Envelope) and (a.clock, a.flags) == (5 * TICK, ACK_TXN)
    assert isinstance(b, Envelope) and b.clock == 0 and b.message == {"x": 2}
    assert isinstance(c, Envelope) and c.message == [1, 2]


def test_json_matches_the_uuid_field_regardless_of_case_as_go_does() -> None:
    fmt = UUIDFormatter(bytes.fromhex("010203040506"))
    one, two = fmt.format(5 * TICK, ACK_TXN), fmt.format(9 * TICK, ACK_TXN)
    data = (
        b'{"Uuid":"%s","x":1}\n' % one.encode()
        + b'{"uUID":"%s","UUID":"%s"}\n' % (one.encode(), two.encode())  # The last wins.
        + b'{"uuid":"%s","UUID":"%s"}\n' % (one.encode(), two.encode())  # Exact first.
    )
    a, b, c = unpack(JSONFraming(), data)
    assert isinstance(a, Envelope) and a.clock == 5 * TICK
    assert isinstance(b, Envelope) and b.clock == 9 * TICK
    assert isinstance(c, Envelope) and c.clock == 5 * TICK
    (d,) = unpack(JSONFraming("MsgID"), b'{"msgid":"%s"}\n' % two.encode())
    assert isinstance(d, Envelope) and d.clock == 9 * TICK


def test_json_errors_keep_offsets_and_unpacking_continues() -> None:
    data = b'{"a":1}\nnot json\n{"uuid":"bad"}\n{"uuid":7}\n{"b":2}\n{"c":'
    out = unpack(JSONFraming(), data)
    assert [type(x).__name__ for x in out] == [
        "Envelope",
        "MessageDecodeError",
        "MessageDecodeError",
        "MessageDecodeError",
        "Envelope",
        "PartialMessage",
    ]
    bad = out[1]
    assert isinstance(bad, MessageDecodeError) and (bad.begin, bad.end) == (8, 17)
    assert "invalid UUID" in str(out[2])
    last = out[-1]
    assert isinstance(last, PartialMessage) and (last.begin, last.end) == (len(data) - 5, len(data))


def test_json_strings_go_reads_with_replacement_characters_are_read_so() -> None:
    """Go's encoding/json reads invalid UTF-8 and lone UTF-16 surrogate escapes within
    strings as U+FFFD (JavaScript writes "\\ud83d" for a string cut within a surrogate
    pair); orjson refuses them, so each was a MessageDecodeError here: a consumer shard
    failed for good on a message Gazette's consumers read."""
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    lines = [
        b'{"uuid":"%s","a":"x\xffy"}' % text.encode(),
        b'{"uuid":"%s","a":"\\ud83d!","\\udc00":["\\ud83d\\ude00\\ud800"]}' % text.encode(),
        b'{"a":NaN}',  # Go refuses these, as before.
        b'{"a":1e400}',
        b'{"a":"\xff"',
    ]
    data = b"\n".join(lines) + b"\n"
    for framing in (JSONFraming(), JSONFraming(decode=lambda v: v)):
        out = unpack(framing, data, cuts=[5, 40])
        assert [x.message if isinstance(x, Envelope) else type(x).__name__ for x in out] == [
            {"uuid": text, "a": "x\ufffdy"},
            {"uuid": text, "a": "\ufffd!", "\ufffd": ["\U0001f600\ufffd"]},
            "MessageDecodeError",
            "MessageDecodeError",
            "MessageDecodeError",
        ]
        assert [(x.begin, x.end) for x in out] == [
            (sum(len(w) + 1 for w in lines[:i]), sum(len(w) + 1 for w in lines[: i + 1]))
            for i in range(len(lines))
        ]
        assert all(isinstance(x, Envelope) and x.producer != bytes(6) for x in out[:2])


def test_a_decode_function_failing_on_a_frame_is_an_error_of_that_frame() -> None:
    """A `decode` that raises (a record of another shape) fails its frame alone, as a
    MessageDecodeError with its offsets: the exception escaped `Unpacker.feed`, and the
    frames after it in the same read were skipped without a word (the next read restarted
    the unpacker past them)."""
    data = b'{"n":1}\n{"m":2}\n{"n":3}\n'
    out = unpack(JSONFraming(decode=lambda v: v["n"] * 2), data)
    assert [type(x).__name__ for x in out] == ["Envelope", "MessageDecodeError", "Envelope"]
    assert [x.message for x in out if isinstance(x, Envelope)] == [2, 6]
    bad = out[1]
    assert isinstance(bad, MessageDecodeError) and (bad.begin, bad.end) == (8, 16)
    assert "KeyError" in bad.detail


def test_json_encoding_failure_is_a_clear_error() -> None:
    with pytest.raises(MessageDecodeError, match="cannot encode"):
        JSONFraming().marshal({"x": object()})


# A line that is not valid CSV by Go's encoding/csv, yet opens no quoted field there: a quote
# inside an unquoted field (ErrBareQuote), or text after a quoted field's closing quote
# (ErrQuote). Go's reader fails that one record and reads on at the next line.
_bad_csv_lines = st.sampled_from([b'u,a"b', b'u,"ab"c', b'"x"y,z', b'u,a"b"c"d', b'u,"a""b"c'])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=8), max_size=3),
            _bad_csv_lines,
        ),
        max_size=8,
    ),
    st.lists(st.integers(0, 10**6), max_size=6),
)
@example([b'u,a"b', ["ok"], ["fine"]], [])
def test_a_bad_csv_record_does_not_swallow_the_records_after_it(
    items: list, cuts: list[int]
) -> None:
    """A CSV record with a stray quote is one bad record, as in Go's reader: the records
    after it are read (they were taken into it, as if in a quoted field, up to the next line
    of an odd number of quotes: lost in its error, or held for ever by a blocking reader)."""
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    data = b""
    expect: list[tuple[int, int, list[str] | None]] = []
    for item in items:
        if isinstance(item, bytes):
            frame, msg = item + b"\n", None
        else:
            msg = [text, *[f.replace("\r", "") for f in item]]
            frame = CSVFraming().marshal(msg)
        expect.append((len(data), len(data) + len(frame), msg))
        data += frame
    out = unpack(CSVFraming(), data, [c % (len(data) + 1) for c in cuts])
    assert not [e for e in out if isinstance(e, PartialMessage)]
    got = [(e.begin, e.end, e.message if isinstance(e, Envelope) else None) for e in out]
    for begin, end, msg in expect:
        if msg is not None:
            assert (begin, end, msg) in got
        else:  # The bad line alone: an error, as in Go's reader.
            assert (begin, end, None) in got


def test_a_quote_within_an_unquoted_csv_field_is_an_error_as_in_go() -> None:
    """Go's csv.Reader refuses a quote within an unquoted field ("bare \" in
    non-quoted-field"), so a Gazette consumer fails on such a record; Python's csv module
    reads the quote as text, even strict, and the record was delivered here. Vectors from
    Go's encoding/csv (Gazette's CSV framing reads with it): each bad line is an error of its
    own, and the record after them reads."""
    data = b'u,a"b\nu,5" screen,x\nu,a""a"\nu,"ok ""quoted""",b"\nu,ok\n'
    out = unpack(_NoUUIDCSV(), data)
    assert [(e.begin, e.end, e.message if isinstance(e, Envelope) else None) for e in out] == [
        (0, 6, None),
        (6, 20, None),
        (20, 28, None),
        (28, 49, None),
        (49, 54, ["u", "ok"]),
    ]
    assert all(isinstance(e, MessageDecodeError) for e in out[:4])


class _NoUUIDCSV(CSVFraming):
    """CSV records whose first field is not read as a UUID (any record then unpacks)."""

    def get_uuid(self, msg: object) -> None:
        return None


_csv_bytes = st.lists(
    st.sampled_from([b"a", b",", b'"', b'""', b"\n", b"\r", b"\r\n", b" ", b"\xc3\xa9"]),
    max_size=30,
).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(_csv_bytes)
def test_csv_records_read_as_gos_rules_read_them(line: bytes) -> None:
    """Whatever a record holds, the csv module's fast path reads it as `_go_fields` (Go's
    csv.Reader's rules: checked against it on thousands of random records) does."""
    from pygazette.message.csv_framing import _go_fields

    for payload in _NoUUIDCSV().split(line + b"\n")[0]:
        if _NoUUIDCSV().is_blank(payload):
            continue
        text = payload.decode()
        text = text[:-1] if text.endswith("\r") else text
        try:
            want: list[str] | None = _go_fields(text.replace("\r\n", "\n"))
        except MessageDecodeError:
            want = None
        try:
            got: list[str] | None = CSVFraming().unmarshal(payload)
        except MessageDecodeError:
            got = None
        assert got == want, payload


def test_a_csv_field_holding_a_bare_carriage_return_reads_as_in_go() -> None:
    """Go's reader takes a CR within an unquoted field as the field's text (only a CR
    before an LF is a line end); Python's csv module refused the record ("new-line
    character seen in unquoted field"), so a record Gazette reads failed every reader
    here (a consumer shard for good)."""
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    data = f'{text},a\rb,\rc\r\n{text},"x\r\ny",z\r\n'.encode()
    out = unpack(CSVFraming(), data)
    assert [e.message for e in out if isinstance(e, Envelope)] == [
        [text, "a\rb", "\rc"],
        [text, "x\ny", "z"],
    ]
    assert len(out) == 2
    for bad in ('u,a"\rb', 'u,"a"\rb', 'u,"a\r'):
        with pytest.raises(MessageDecodeError):
            CSVFraming().unmarshal(bad.encode())


def test_a_csv_field_longer_than_pythons_csv_field_limit_reads_as_in_go() -> None:
    """Go's csv.Reader has no field size limit; Python's csv module refuses fields over
    csv.field_size_limit() (128 KiB by default): a record a Go or pygazette publisher wrote
    with one was a MessageDecodeError to every reader here."""
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    big = "x" * (300 << 10)
    msgs = [[text, big, "a"], [text, 'q"' + big + ",\n", "b"], [text, big + "\r", "c"]]
    data = b"".join(CSVFraming().marshal(m) for m in msgs)
    out = unpack(CSVFraming(), data, cuts=[1000, len(data) // 2])
    assert [e.message if isinstance(e, Envelope) else str(e)[:80] for e in out] == msgs


def test_csv_records_that_are_not_utf8_read_as_in_go_and_write_back_unchanged() -> None:
    """Go's csv.Reader takes fields of any bytes (a CSV file in Latin-1 or cp1252); here such
    a record was a MessageDecodeError ('not UTF-8'), which failed a consumer shard for good
    on a journal Gazette's consumers read. Its bytes are read as surrogate escapes now, and
    marshal writes them back byte for byte."""
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    records = [
        f"{text},caf".encode() + b"\xe9,x\n",
        f'{text},"a'.encode() + b'\xff\nb",\xfe\r\n',
        f"{text},ok\n".encode(),
    ]
    out = unpack(CSVFraming(), b"".join(records), cuts=[50, 80])
    assert [e.message if isinstance(e, Envelope) else e for e in out] == [
        [text, "caf\udce9", "x"],
        [text, "a\udcff\nb", "\udcfe"],
        [text, "ok"],
    ]
    assert [CSVFraming().marshal(e.message) for e in out] == [
        records[0],
        records[1].replace(b"\r\n", b"\n"),
        records[2],
    ]
    with pytest.raises(MessageDecodeError, match="not valid Unicode"):
        CSVFraming().marshal([text, "\ud800"])


def test_a_long_csv_record_fed_in_pieces_is_joined_once() -> None:
    """Pieces without a newline complete no record: they are held as fed, not joined with
    the held bytes and split again at every piece (a record of n pieces copied n times
    over: 14 MB of records read 64 KiB at a time took 9 s)."""
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    record = CSVFraming().marshal([text, "x" * 20_000])
    pieces = [record[i : i + 100] for i in range(0, len(record), 100)]
    unpacker = Unpacker(CSVFraming(), "a/journal")
    out: list[Envelope | BaseException] = []
    for n, piece in enumerate(pieces[:-1], 1):
        unpacker.feed(piece, out)
        assert out == []
        assert len(unpacker._held) == n  # Held as fed, never joined meanwhile.
    unpacker.feed(pieces[-1], out)
    (env,) = out
    assert isinstance(env, Envelope) and env.message == [text, "x" * 20_000]
    assert (env.begin, env.end) == (0, len(record)) and unpacker.pending == 0


def test_a_long_quoted_csv_field_spanning_lines_fed_in_pieces_is_joined_once() -> None:
    """Within a quoted field, pieces of its text (newlines and doubled quotes included, a
    pair of them cut between two pieces too) complete no record: they are held as fed. They
    were joined and split again at every piece holding a newline: a record of 6 MiB of
    'a""b\\nc' read 64 KiB at a time took 9 s, an 8 MiB one of text lines 0.5 s."""
    text = UUIDFormatter(new_producer_id()).format(TICK, OUTSIDE_TXN)
    field = 'say "hi"\n' * 2000
    record = CSVFraming().marshal([text, field, "z"])
    head = record.index(b'"')  # The field's opening quote.
    closing = record.rindex(b'",z')  # Its closing quote.
    pieces = [record[: head + 1]]
    pieces += [record[i : min(i + 7, closing)] for i in range(head + 1, closing, 7)]
    pieces.append(record[closing:])
    unpacker = Unpacker(CSVFraming(), "a/journal")
    out: list[Envelope | BaseException] = []
    unpacker.feed(pieces[0], out)
    for n, piece in enumerate(pieces[1:-1], 2):
        unpacker.feed(piece, out)
        assert out == []
        assert len(unpacker._held) == n  # Held as fed, never joined meanwhile.
    unpacker.feed(pieces[-1], out)
    (env,) = out
    assert isinstance(env, Envelope) and env.message == [text, field, "z"]
    assert (env.begin, env.end) == (0, len(record)) and unpacker.pending == 0


# Fixed framing -----------------------------------------------------------------------------


def test_fixed_framing_of_protobuf_messages_with_uuids() -> None:
    # Any protobuf message with a string or bytes field holds the UUID.
    framing = FixedFraming(pb.Label, uuid_field="value")
    fmt = UUIDFormatter(new_producer_id())
    msgs = [pb.Label(name=f"m{i}") for i in range(3)]
    data = framing.marshal_sequence(msgs, fmt, 7 * TICK, OUTSIDE_TXN)
    out = unpack(framing, data, cuts=[3, 9, 20])
    assert [e.message.name for e in out if isinstance(e, Envelope)] == ["m0", "m1", "m2"]
    assert [e.clock for e in out if isinstance(e, Envelope)] == [7 * TICK, 8 * TICK, 9 * TICK]
    with pytest.raises(ValueError, match="no field"):
        FixedFraming(pb.Label, uuid_field="nope")
    with pytest.raises(ValueError, match="string or bytes"):
        FixedFraming(pb.Header.Etcd, uuid_field="revision")


def test_fixed_framing_desync_is_reported_and_skipped() -> None:
    good = encode_fixed_frame(b"one") + encode_fixed_frame(b"two")
    data = good[:11] + b"garbage!" + good[11:]
    out = unpack(FixedFraming(), data)
    assert isinstance(out[0], Envelope) and out[0].message == b"one"
    assert isinstance(out[1], MessageDecodeError) and "de-synchronization" in str(out[1])
    assert (out[1].begin, out[1].end) == (11, 19)
    assert isinstance(out[2], Envelope) and out[2].message == b"two"
    assert (out[2].begin, out[2].end) == (19, len(data))


def test_blank_lines_are_skipped_not_reported() -> None:
    """A JSON line of JSON white space, and an empty CSV line (LF or CRLF, as Go's
    encoding/csv skips), hold no message: readers skip them and the offsets stay exact."""
    data = b'{"a": 1}\n\n \t\r\n{"a": 2}\n\x0c\n'
    out = unpack(JSONFraming(), data)
    assert [(e.begin, e.end) for e in out] == [(0, 9), (14, 23), (23, 25)]
    assert [e.message for e in out[:2]] == [{"a": 1}, {"a": 2}]
    assert isinstance(out[2], MessageDecodeError)  # A form feed is not JSON white space.
    assert JSONFraming(decode=dict).is_blank(b" \r") and not JSONFraming().is_blank(b"\x0c")

    data = b"\n\r\n,b\n\n  \n"
    out = unpack(CSVFraming(), data)
    assert [(e.begin, e.end) for e in out] == [(3, 6), (7, 10)]
    assert isinstance(out[0], Envelope) and out[0].message == ["", "b"]
    assert isinstance(out[1], MessageDecodeError)  # White space is a field (not a UUID).


def test_fixed_frames_are_written_only_as_large_as_they_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A header announcing more than MAX_FRAME_LENGTH is a desync, so no larger frame is
    written."""
    monkeypatch.setattr(fixed_framing, "MAX_FRAME_LENGTH", 4)
    with pytest.raises(MessageDecodeError, match="larger than a frame may be"):
        encode_fixed_frame(b"12345")
    data = FIXED_FRAME_HEADER.pack(FIXED_FRAME_WORD, 5) + b"12345" + encode_fixed_frame(b"ok")
    out = unpack(FixedFraming(), data)
    assert isinstance(out[0], MessageDecodeError) and "implausible frame length 5" in str(out[0])
    assert (out[0].begin, out[0].end) == (0, 13)
    assert isinstance(out[1], Envelope) and out[1].message == b"ok"


# Properties --------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_json_msgs = st.lists(st.dictionaries(st.text(max_size=8), _json_values, max_size=4), max_size=12)
_csv_msgs = st.lists(
    st.lists(
        st.text(st.characters(blacklist_categories=["Cs"]), max_size=8), min_size=1, max_size=4
    ),
    max_size=12,
)
_proto_msgs = st.lists(st.binary(max_size=40), max_size=12)


def _check_round_trip(
    framing: Framing, msgs: list, flags: int, cuts: list[int], offset: int
) -> None:
    producer = new_producer_id()
    fmt = UUIDFormatter(producer)
    frames = []
    for i, msg in enumerate(msgs):
        if not isinstance(msg, bytes):
            framing.set_uuid(msg, fmt.format((i + 1) * TICK, flags))
        frames.append(framing.marshal(msg))
    data = b"".join(frames)
    out = unpack(framing, data, [c % (len(data) + 1) for c in cuts], offset)
    assert all(isinstance(e, Envelope) for e in out), out
    assert len(out) == len(msgs)
    pos = offset
    for i, (env, msg, frame) in enumerate(zip(out, msgs, frames, strict=True)):
        assert isinstance(env, Envelope)
        assert (env.begin, env.end) == (pos, pos + len(frame))
        pos += len(frame)
        if isinstance(msg, bytes):
            assert env.message == msg and env.clock == 0
        else:
            assert env.message == msg
            assert (env.producer, env.clock, env.flags) == (producer, (i + 1) * TICK, flags)


@settings(max_examples=150, deadline=None)
@given(
    _json_msgs,
    st.sampled_from([0, 1, 2]),
    st.lists(st.integers(0, 10**6), max_size=6),
    st.integers(0, 10**9),
)
def test_json_round_trip(msgs: list, flags: int, cuts: list[int], offset: int) -> None:
    _check_round_trip(JSONFraming(), msgs, flags, cuts, offset)


@settings(max_examples=150, deadline=None)
@given(
    _csv_msgs,
    st.sampled_from([0, 1, 2]),
    st.lists(st.integers(0, 10**6), max_size=6),
    st.integers(0, 10**9),
)
def test_csv_round_trip(msgs: list, flags: int, cuts: list[int], offset: int) -> None:
    # Go's reader (and ours) drop a CR before a record's final LF.
    msgs = [[f.replace("\r", "") for f in m] for m in msgs]
    _check_round_trip(CSVFraming(), msgs, flags, cuts, offset)


@settings(max_examples=150, deadline=None)
@given(_proto_msgs, st.lists(st.integers(0, 10**6), max_size=6), st.integers(0, 10**9))
def test_fixed_round_trip(msgs: list, cuts: list[int], offset: int) -> None:
    _check_round_trip(FixedFraming(), msgs, OUTSIDE_TXN, cuts, offset)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1), max_size=3),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 100),
    st.lists(st.integers(0, 10**6), max_size=6),
)
@example([{"UUID": 0}, {}], 1, [])  # A line whose UUID isn't a string: a whole bad line.
def test_a_message_cut_at_the_end_is_reported_not_lost(
    msgs: list, cut_back: int, cuts: list[int]
) -> None:
    data = b"".join(orjson.dumps(m) + b"\n" for m in msgs)
    cut = max(0, len(data) - cut_back)
    out = unpack(JSONFraming(), data[:cut], [c % (cut + 1) for c in cuts])
    # Whole lines come out as messages, or as decode errors where a line isn't one (e.g. a
    # "UUID" key whose value is not a string): either way, reported and not lost.
    whole = [
        e
        for e in out
        if isinstance(e, Envelope)
        or (isinstance(e, MessageDecodeError) and not isinstance(e, PartialMessage))
    ]
    ends = [e.end for e in whole]
    # Every whole message before the cut is there; the rest is one PartialMessage.
    assert all(data[e - 1 : e] == b"\n" for e in ends)
    rest = cut - (ends[-1] if ends else 0)
    partials = [e for e in out if isinstance(e, PartialMessage)]
    if rest:
        assert len(partials) == 1 and partials[0].end - partials[0].begin == rest
    else:
        assert not partials


def _outcome(out: list[Envelope | BaseException]) -> list[tuple[object, ...]]:
    return [
        (type(e).__name__, e.begin, e.end, e.message if isinstance(e, Envelope) else e.detail)
        for e in out
        if isinstance(e, (Envelope, MessageDecodeError))
    ]


_json_lines = st.lists(
    st.one_of(
        st.dictionaries(st.text(max_size=6), st.integers(-(2**63), 2**63 - 1), max_size=3).map(
            orjson.dumps
        ),
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),  # Not JSON, mostly.
        st.sampled_from([b"", b"  ", b"\r"]),  # Blank lines.
        st.integers(200, 5000).map(lambda n: orjson.dumps({"long": "x" * n})),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(_json_lines, st.lists(st.integers(1, 700), min_size=1, max_size=40), st.booleans())
def test_json_unpacking_does_not_depend_on_how_content_is_cut(
    lines: list[bytes], sizes: list[int], trailing: bool
) -> None:
    # However the content arrives (long messages across many pieces, pieces ending just
    # before, at or after a delimiter, one byte at a time), the messages, errors and
    # offsets are those of the content fed whole.
    data = b"".join(line + b"\n" for line in lines) + (b'{"cut": ' if trailing else b"")
    cuts, at = [], 0
    while at < len(data):
        at += sizes[len(cuts) % len(sizes)]
        cuts.append(min(at, len(data)))
    whole = unpack(JSONFraming(), data, [], offset=7)
    pieces = unpack(JSONFraming(), data, cuts, offset=7)
    assert _outcome(pieces) == _outcome(whole)
    assert (trailing and bool(data)) == any(isinstance(e, PartialMessage) for e in pieces)


_FIRST_LOOKUPS = """
import threading
from pygazette.message.framing import framing_for

barrier = threading.Barrier(8)
errors = []

def look():
    barrier.wait()
    try:
        framing_for("application/x-ndjson")
    except Exception as exc:
        errors.append(exc)

threads = [threading.Thread(target=look) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(errors))
"""


def test_first_lookups_on_many_threads_all_find_the_builtin_framings() -> None:
    # The built-in framings are imported on a first miss. The first thread marked them
    # imported before importing them, so the others, missing at the same moment, looked
    # again in a registry still without them: UnknownContentType for application/x-ndjson
    # (7 threads of 8, every run), publishes from threads failing at start. A fresh
    # interpreter each time: the registry is cold only once per process.
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_LOOKUPS], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "0", out.stderr


def test_fixed_content_ending_with_one_newline_ends_cleanly_as_in_gazette() -> None:
    """Gazette's UnpackFixedFrame takes one newline after the last frame for the end of the
    content (its TestFixedFramingDecodeTrailingNewLine); here it was a PartialMessage,
    raised at the end of every non-blocking read of such a journal. Anything else left over
    still is one, and a newline followed by more content is a de-synchronization, as in Go."""
    frame = encode_fixed_frame(b"test message content")
    out = unpack(FixedFraming(), frame + b"\n", cuts=[len(frame)])
    assert [(type(x).__name__, x.begin, x.end) for x in out] == [("Envelope", 0, len(frame))]
    for tail in (b"\n\n", b"x", b"\r\n"):
        out = unpack(FixedFraming(), frame + tail)
        assert [type(x).__name__ for x in out] == ["Envelope", "PartialMessage"]
    out = unpack(FixedFraming(), frame + b"\n" + frame)
    assert [type(x).__name__ for x in out] == ["Envelope", "MessageDecodeError", "Envelope"]
    assert [(x.begin, x.end) for x in out][1:] == [
        (len(frame), len(frame) + 1),
        (len(frame) + 1, 2 * len(frame) + 1),
    ]
    # JSON lines and CSV are unchanged: a newline is a blank line there.
    assert unpack(JSONFraming(), b"\n") == [] and unpack(CSVFraming(), b"\n") == []


def test_a_long_fixed_frame_fed_in_pieces_is_joined_once() -> None:
    """Its header tells its length: the pieces are held until all of it is here, not joined
    at every piece (which copies a frame of n pieces n times over)."""
    payload = bytes(range(256)) * 64
    frame = FIXED_FRAME_HEADER.pack(FIXED_FRAME_WORD, len(payload)) + payload
    pieces = [frame[i : i + 100] for i in range(0, len(frame), 100)]
    unpacker = Unpacker(FixedFraming(), "a/journal")
    out: list[Envelope | BaseException] = []
    for n, piece in enumerate(pieces[:-1], 1):
        unpacker.feed(piece, out)
        assert out == []
        assert len(unpacker._held) == n  # Held as fed, never joined meanwhile.
    unpacker.feed(pieces[-1], out)
    (env,) = out
    assert isinstance(env, Envelope) and env.message == payload
    assert (env.begin, env.end) == (0, len(frame)) and unpacker.pending == 0
