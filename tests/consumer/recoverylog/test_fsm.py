"""The recovery-log FSM: sequencing, checksum chaining, rejected ops, hints.

Checksum fixtures are Gazette's (its FSM tests digest the decimal text of a running
counter as each op's "frame", which makes the expected checksums independent of encoding).
"""

from __future__ import annotations

import pytest

from pygazette.consumer.recoverylog import (
    FSM,
    Author,
    ChecksumMismatch,
    ExpectedHintedFnode,
    LinkExists,
    NoSuchLink,
    NotHintedAuthor,
    PropertyExists,
    Segment,
    WrongSeqNo,
    live_log_segments,
    validate_hints,
)
from pygazette.message.fixed_framing import encode_fixed_frame
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import recoverylog_pb2 as rpb

LOG = "examples/integration-tests/recovery-log"
NOT_TRACKED = "not-tracked"


def seg(
    author: int,
    first_seq_no: int,
    last_seq_no: int,
    first_offset: int,
    last_offset: int = 0,
    first_checksum: int = 0,
    log: str = "",
) -> rpb.Segment:
    return rpb.Segment(
        author=author,
        first_seq_no=first_seq_no,
        last_seq_no=last_seq_no,
        first_offset=first_offset,
        last_offset=last_offset,
        first_checksum=first_checksum,
        log=log,
    )


def hints(*nodes: tuple[int, list[rpb.Segment]], log: str = LOG, **props: str) -> rpb.FSMHints:
    out = rpb.FSMHints(log=log)
    for fnode, segments in nodes:
        out.live_nodes.add(fnode=fnode, segments=segments)
    for path, content in props.items():
        out.properties.add(path=path, content=content)
    return out


class Driver:
    """Applies ops as Gazette's FSM tests do: op N digests frame str(N), at offsets [N, N+1)."""

    def __init__(self, fsm: FSM) -> None:
        self.fsm = fsm
        self.offset = 0

    def apply(self, op: rpb.RecordedOp) -> str | type[Exception] | None:
        self.offset += 1
        op.first_offset, op.last_offset, op.log = self.offset, self.offset + 1, LOG
        try:
            tracked = self.fsm.apply(op, str(self.offset).encode())
        except Exception as exc:
            return type(exc)
        return None if tracked else NOT_TRACKED

    def create(self, seq: int, checksum: int, author: int, path: str) -> object:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=checksum,
                author=author,
                create=rpb.RecordedOp.Create(path=path),
            )
        )

    def link(self, seq: int, checksum: int, author: int, fnode: int, path: str) -> object:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=checksum,
                author=author,
                link=rpb.RecordedOp.Link(fnode=fnode, path=path),
            )
        )

    def unlink(self, seq: int, checksum: int, author: int, fnode: int, path: str) -> object:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=checksum,
                author=author,
                unlink=rpb.RecordedOp.Link(fnode=fnode, path=path),
            )
        )

    def write(self, seq: int, checksum: int, author: int, fnode: int) -> object:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=checksum,
                author=author,
                write=rpb.RecordedOp.Write(fnode=fnode),
            )
        )

    def prop(self, seq: int, checksum: int, author: int, path: str, content: str) -> object:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=checksum,
                author=author,
                property=rpb.Property(path=path, content=content),
            )
        )


def driver(h: rpb.FSMHints, next_seq_no: int | None = None, checksum: int = 0) -> Driver:
    fsm = FSM.from_hints(h)
    if next_seq_no is not None:
        fsm.next_seq_no, fsm.next_checksum = next_seq_no, checksum
    return Driver(fsm)


def segments_of(fsm: FSM, fnode: int) -> list[Segment]:
    return list(fsm.live_nodes[fnode].segments)


def S(  # Reads like Gazette's Segment{} fixtures.
    author: int,
    first_seq_no: int,
    first_offset: int,
    first_checksum: int,
    last_seq_no: int,
    last_offset: int,
    log: str = LOG,
) -> Segment:
    return Segment(
        author, first_seq_no, first_offset, first_checksum, last_seq_no, last_offset, log
    )


def test_author_and_fence() -> None:
    fence = Author(1234).fence()
    assert [(lb.name, lb.value) for lb in fence.labels] == [("author", "16i")]
    assert Author(0xFFFFFFFF).fence().labels[0].value == "3vvvvvv"
    assert Author(31).fence().labels[0].value == "v"
    assert Author(1234).fence_selector().include == fence
    for _ in range(100):
        assert 0 < Author.random() < 0xFFFFFFFF
    with pytest.raises(ValueError):
        Author(1 << 32)


def test_init_from_seq_no_zero() -> None:
    d = driver(hints())
    assert d.create(1, 0x00000000, 100, "/path/A") is None
    assert d.link(2, 0x90F599E3, 100, 1, "/path/B") is None
    assert d.fsm.next_checksum == 0x7355C460
    assert d.fsm.next_seq_no == 3
    assert d.fsm.last_log == LOG


def test_checksum_chains_over_frame_payloads() -> None:
    # The checksum is CRC-32C of marshaled ops (the frame without its header), chained.
    fsm = FSM.from_hints(hints())
    op = rpb.RecordedOp(seq_no=1, author=1234, create=rpb.RecordedOp.Create(path="/path/to/file"))
    payload = op.SerializeToString()
    assert len(encode_fixed_frame(payload)) == 32
    op.log = LOG
    assert fsm.apply(op, payload)
    assert fsm.next_checksum == 0x568E8E4E  # Gazette's recorder fixture for this op.

    # A duplicate of it (or any op with a stale sequence number or checksum) is rejected.
    with pytest.raises(WrongSeqNo):
        fsm.apply(op, payload)
    op.seq_no = 2
    with pytest.raises(ChecksumMismatch):
        fsm.apply(op, payload)
    assert (fsm.next_seq_no, fsm.next_checksum) == (2, 0x568E8E4E)


def test_flattening_live_log_segments() -> None:
    h = hints(
        (2, [seg(0x1, 2, 7, 200, 700, 0x22, "examples/integration-tests/recovery-log")]),
        (4, [seg(0x1, 4, 9, 400, 901, 0x44, "examples/integration-tests/recovery-log")]),
        (10, [seg(0x2, 10, 10, 1000, 1001, 0x10)]),
        log="other/log",
    )
    fnodes, segments = live_log_segments(h)
    assert fnodes == [2, 4, 10]
    assert list(segments) == [
        S(0x1, 2, 200, 0x22, 9, 901),
        S(0x2, 10, 1000, 0x10, 10, 1001, log="other/log"),
    ]

    h.live_nodes[2].segments[0].log = "whoops"
    with pytest.raises(ValidationError, match=r"expected hints\.Log other/log to equal"):
        live_log_segments(h)

    h.live_nodes.add(fnode=13, segments=[rpb.Segment(first_seq_no=14)])
    with pytest.raises(ValidationError, match="expected Fnode to match Segment FirstSeqNo"):
        live_log_segments(h)

    h.live_nodes[1].segments[0].author = 0x3
    with pytest.raises(ValueError, match="expected Segment Author equality"):
        live_log_segments(h)

    a, b = rpb.FnodeSegments(), rpb.FnodeSegments()
    a.CopyFrom(h.live_nodes[0])
    b.CopyFrom(h.live_nodes[1])
    h.live_nodes[0].CopyFrom(b)
    h.live_nodes[1].CopyFrom(a)
    with pytest.raises(ValidationError, match="expected monotonic Fnode ordering"):
        live_log_segments(h)


def test_initialization_from_hints() -> None:
    h = hints(
        (42, [seg(100, 42, 43, 1234, 0, 0xFEEDBEEF)]),
        **{"/IDENTITY": "foo-bar-baz"},
    )
    d = driver(h)
    assert d.fsm.hinted_segments[0].first_offset == 1234
    assert d.fsm.next_checksum == 0xFEEDBEEF
    assert d.fsm.next_seq_no == 42
    assert d.fsm.last_log == LOG
    assert d.fsm.properties == {"/IDENTITY": "foo-bar-baz"}

    d.offset = 1234
    assert d.create(41, 0xFEEDBEEF, 100, "/path/A") is WrongSeqNo
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.link(43, 0xC132D1D7, 100, 42, "/path/B") is None
    assert not d.fsm.has_remaining_hints()

    # Hints reproduce the input, with the offsets the FSM observed.
    h.live_nodes[0].segments[0].first_offset = 1236
    h.live_nodes[0].segments[0].last_offset = 1238
    assert d.fsm.build_hints(LOG) == h


def test_fnode_creation() -> None:
    d = driver(hints(**{"/property/path": "content"}), 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.create(43, 0x2D28E063, 100, "/another/path") is None
    assert d.create(44, 0xF11E2261, 100, "/path/A") is LinkExists
    assert d.create(44, 0xF11E2261, 100, "/property/path") is PropertyExists
    assert d.create(44, 0xF11E2261, 100, "/path/B") is None

    assert d.fsm.links == {"/path/A": 42, "/another/path": 43, "/path/B": 44}
    assert d.fsm.live_nodes[42].links == {"/path/A"}
    assert segments_of(d.fsm, 42) == [S(100, 42, 1, 0xFEEDBEEF, 42, 2)]
    assert segments_of(d.fsm, 43) == [S(100, 43, 2, 0x2D28E063, 43, 3)]
    assert segments_of(d.fsm, 44) == [S(100, 44, 5, 0xF11E2261, 44, 6)]


def test_fnode_creation_not_hinted() -> None:
    h = hints(
        (42, [seg(100, 42, 100, 1234, 0, 0xFEEDBEEF)]),
        (44, [seg(100, 44, 100, 1234, 0, 0xF11E2261)]),
    )
    d = driver(h, 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.create(43, 0x2D28E063, 100, "/another/path") == NOT_TRACKED
    assert d.create(44, 0xF11E2261, 100, "/final/path") is None

    assert d.fsm.links == {"/path/A": 42, "/final/path": 44}
    assert segments_of(d.fsm, 42) == [S(100, 42, 1, 0xFEEDBEEF, 42, 2)]
    assert segments_of(d.fsm, 44) == [S(100, 44, 3, 0xF11E2261, 44, 4)]


def test_hinted_fnode_not_created() -> None:
    h = hints(
        (42, [seg(100, 42, 100, 1234, 0, 0xFEEDBEEF)]),
        (44, [seg(100, 44, 100, 1234, 0, 0xF11E2261)]),
    )
    d = driver(h, 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.write(43, d.fsm.next_checksum, 100, 42) is None
    assert d.write(44, d.fsm.next_checksum, 100, 42) is ExpectedHintedFnode


def test_fnode_linking() -> None:
    d = driver(hints(log="empty/log"), 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/existing/path") is None
    assert d.create(43, 0x2D28E063, 100, "/source/path") is None
    assert d.link(44, 0xF11E2261, 100, 42, "/target/one") is None
    assert d.prop(45, 0xE292E757, 100, "/property/path", "content") is None

    assert d.link(46, 0x2009A120, 100, 43, "/existing/path") is LinkExists
    assert d.link(46, 0x2009A120, 100, 15, "/existing/path") is LinkExists
    assert d.link(46, 0x2009A120, 100, 44, "/property/path") is PropertyExists
    # A link of an unknown fnode sequences, but is not tracked.
    assert d.link(46, 0x2009A120, 100, 15, "/target/two") == NOT_TRACKED
    assert d.link(47, 0xC8DAC550, 200, 43, "/target/two") is None

    assert d.fsm.links == {
        "/existing/path": 42,
        "/source/path": 43,
        "/target/one": 42,
        "/target/two": 43,
    }
    assert d.fsm.live_nodes[42].links == {"/existing/path", "/target/one"}
    assert segments_of(d.fsm, 42) == [S(100, 42, 1, 0xFEEDBEEF, 44, 4)]
    assert segments_of(d.fsm, 43) == [
        S(100, 43, 2, 0x2D28E063, 43, 3),
        S(200, 47, 9, 0xC8DAC550, 47, 10),
    ]
    assert d.fsm.properties == {"/property/path": "content"}


def test_fnode_unlinking() -> None:
    d = driver(hints(log="empty/log"), 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.create(43, 0x2D28E063, 100, "/another/path") is None
    assert d.link(44, 0xF11E2261, 200, 43, "/link/one") is None
    assert len(d.fsm.links) == 3

    assert d.unlink(45, 0xE292E757, 200, 43, "/does/not/exist") is NoSuchLink
    assert d.unlink(45, 0xE292E757, 200, 42, "/another/path") is NoSuchLink
    assert d.unlink(45, 0xE292E757, 200, 15, "/some/path") == NOT_TRACKED
    assert d.unlink(46, 0xC132D1D7, 200, 43, "/another/path") is None

    assert d.fsm.links == {"/path/A": 42, "/link/one": 43}
    assert d.fsm.live_nodes[43].links == {"/link/one"}
    assert d.fsm.build_hints(LOG) == hints(
        (42, [seg(100, 42, 42, 1, 2, 0xFEEDBEEF)]),
        (43, [seg(100, 43, 43, 2, 3, 0x2D28E063), seg(200, 44, 46, 3, 8, 0xF11E2261)]),
    )

    assert d.unlink(47, 0xB18CC99A, 200, 43, "/link/one") is None
    assert d.fsm.links == {"/path/A": 42}
    assert d.fsm.build_hints(LOG) == hints((42, [seg(100, 42, 42, 1, 2, 0xFEEDBEEF)]))

    assert d.create(48, 0x11BC1AC9, 300, "/other/path") is None
    assert d.unlink(49, 0xA102803E, 300, 42, "/path/A") is None
    assert d.fsm.links == {"/other/path": 48}
    assert d.fsm.build_hints(LOG) == hints((48, [seg(300, 48, 48, 9, 10, 0x11BC1AC9)]))

    assert d.unlink(50, 0xA40DAEE4, 400, 48, "/other/path") is None
    assert d.fsm.links == {} and d.fsm.live_nodes == {}
    assert d.fsm.build_hints(LOG) == rpb.FSMHints(log=LOG)


def test_property_updates() -> None:
    d = driver(hints(**{"/a/property": "content"}), 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/a/path") is None
    assert d.prop(43, 0x2D28E063, 100, "/another/property", "other-content") is None
    assert d.fsm.properties == {"/a/property": "content", "/another/property": "other-content"}
    assert d.prop(44, 0xF11E2261, 100, "/a/path", "bad") is LinkExists
    assert d.prop(44, 0xF11E2261, 100, "/a/property", "update") is None
    assert d.fsm.properties == {"/a/property": "update", "/another/property": "other-content"}


def test_fnode_writes() -> None:
    d = driver(hints(), 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.write(43, 0x2D28E063, 100, 42) is None
    assert d.write(44, 0xF11E2261, 100, 42) is None
    assert d.write(45, 0xE292E757, 100, 15) == NOT_TRACKED
    assert d.write(46, 0x2009A120, 100, 42) is None
    assert d.fsm.build_hints(LOG) == hints((42, [seg(100, 42, 46, 1, 6, 0xFEEDBEEF)]))


def test_use_of_hinted_authors() -> None:
    h = hints(
        (42, [seg(100, 42, 42, 2, 3), seg(200, 44, 44, 5, 6), seg(300, 45, 45, 8, 9)]),
        (46, [seg(400, 46, 47, 11, 13)]),
    )
    d = driver(h)

    # A "bad" recorder (666) using valid sequence numbers and checksums is ignored.
    assert d.create(42, 0x0, 666, "/evil/path") is NotHintedAuthor
    assert d.create(42, 0x0, 100, "/good/path") is None
    assert d.write(43, d.fsm.next_checksum, 100, 42) is NotHintedAuthor
    assert d.write(43, d.fsm.next_checksum, 200, 15) is WrongSeqNo
    assert d.write(44, 0x0, 200, 42) is None  # The checksum was reset to the hinted one.
    assert d.write(45, d.fsm.next_checksum, 200, 42) is NotHintedAuthor
    assert d.write(45, d.fsm.next_checksum, 666, 42) is NotHintedAuthor
    assert d.write(45, 0x0, 300, 42) is None
    assert d.write(46, d.fsm.next_checksum, 300, 42) is NotHintedAuthor
    assert d.write(46, d.fsm.next_checksum, 666, 42) is NotHintedAuthor
    assert d.create(46, 0x0, 400, "/another/path") is None
    assert d.write(47, d.fsm.next_checksum, 400, 46) is None

    assert list(d.fsm.build_hints(LOG).live_nodes) == list(h.live_nodes)
    assert not d.fsm.has_remaining_hints()

    # With hints exhausted, any author may continue.
    assert d.unlink(48, d.fsm.next_checksum, 666, 42, "/good/path") is None
    assert d.write(49, d.fsm.next_checksum, 666, 46) is None
    assert d.fsm.build_hints(LOG) == hints(
        (46, [seg(400, 46, 47, 11, 13), seg(666, 49, 49, 14, 15, 0x1CAB6124)])
    )


def test_rejected_ops_leave_the_fsm_unchanged() -> None:
    d = driver(hints(), 42, 0xFEEDBEEF)
    assert d.create(42, 0xFEEDBEEF, 100, "/a") is None
    before = (d.fsm.next_seq_no, d.fsm.next_checksum, dict(d.fsm.links), d.fsm.build_hints(LOG))
    assert d.create(43, d.fsm.next_checksum, 100, "/a") is LinkExists
    assert d.unlink(43, d.fsm.next_checksum, 100, 42, "/b") is NoSuchLink
    assert d.create(44, d.fsm.next_checksum, 100, "/b") is WrongSeqNo
    assert d.create(43, 0x1234, 100, "/b") is ChecksumMismatch
    after = (d.fsm.next_seq_no, d.fsm.next_checksum, dict(d.fsm.links), d.fsm.build_hints(LOG))
    assert before == after


def test_hints_round_trip_through_a_new_fsm() -> None:
    d = driver(hints())
    assert d.create(1, 0, 7, "/a") is None
    assert d.create(2, d.fsm.next_checksum, 7, "/b") is None
    assert d.write(3, d.fsm.next_checksum, 7, 1) is None
    assert d.unlink(4, d.fsm.next_checksum, 7, 2, "/b") is None
    assert d.prop(5, d.fsm.next_checksum, 7, "/IDENTITY", "id") is None
    built = d.fsm.build_hints(LOG)
    validate_hints(built)
    assert rpb.FSMHints.FromString(built.SerializeToString()) == built

    # A new FSM from the hints expects fnode 1's segment first; replaying the same log
    # rebuilds the same hints.
    replay = FSM.from_hints(built)
    assert (replay.next_seq_no, replay.properties) == (1, {"/IDENTITY": "id"})
    r = Driver(replay)
    assert r.create(1, 0, 8, "/a") is NotHintedAuthor
    r.offset = 0  # Replay the same frames (and offsets) as the original.
    assert r.create(1, 0, 7, "/a") is None
    # Within the hinted segment, a file that was gone when the hints were built is not
    # tracked (its later ops are sequenced, but change nothing).
    assert r.create(2, replay.next_checksum, 7, "/b") == NOT_TRACKED
    assert r.write(3, replay.next_checksum, 7, 1) is None
    assert not replay.has_remaining_hints()
    assert r.unlink(4, replay.next_checksum, 7, 2, "/b") == NOT_TRACKED
    assert r.prop(5, replay.next_checksum, 7, "/IDENTITY", "id") is None
    assert replay.build_hints(LOG) == built
    assert replay.next_checksum == d.fsm.next_checksum


def test_validate_hints() -> None:
    validate_hints(hints((1, [seg(1, 1, 1, 0)])))
    with pytest.raises(ValidationError, match=r"duplicates FSMHints\.Log"):
        validate_hints(hints((1, [seg(1, 1, 1, 0, log=LOG)])))
    with pytest.raises(ValidationError, match="Segment: Author is zero"):
        validate_hints(hints((1, [seg(0, 1, 1, 0)])))
    with pytest.raises(ValidationError, match="hinted log not provided"):
        FSM.from_hints(rpb.FSMHints())


def test_hinted_properties_win_over_replayed_history() -> None:
    # Ops: create /b, property X=old, write /b, property X=new, create /a. Hints of that
    # state hold X=new, and segments [1, 3] and [5, 5]: replay jumps over op 4.
    d = driver(hints())
    assert d.create(1, 0, 7, "/b") is None
    assert d.prop(2, d.fsm.next_checksum, 7, "/X", "old") is None
    assert d.write(3, d.fsm.next_checksum, 7, 1) is None
    assert d.prop(4, d.fsm.next_checksum, 7, "/X", "new") is None
    assert d.create(5, d.fsm.next_checksum, 7, "/a") is None
    built = d.fsm.build_hints(LOG)
    assert [(p.path, p.content) for p in built.properties] == [("/X", "new")]

    replay = Driver(FSM.from_hints(built))
    assert replay.create(1, 0, 7, "/b") is None
    assert replay.prop(2, replay.fsm.next_checksum, 7, "/X", "old") is None
    assert replay.write(3, replay.fsm.next_checksum, 7, 1) is None
    assert replay.fsm.properties == {"/X": "new"}  # Not undone by the older op.
    replay.offset = 4
    assert replay.create(5, built.live_nodes[1].segments[0].first_checksum, 7, "/a") is None
    assert not replay.fsm.has_remaining_hints()
    assert replay.prop(6, replay.fsm.next_checksum, 7, "/X", "newer") is None
    assert replay.fsm.properties == {"/X": "newer"}  # Past the hints, ops apply again.
