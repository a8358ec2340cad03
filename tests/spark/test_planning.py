"""Read planning: fragment listings into pieces and partitions (unit and property tests)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.spark.framing import Framing
from pygazette.spark.journals import FragmentInfo, earliest_offset, offset_at_timestamp
from pygazette.spark.planning import DataLoss, GazettePartition, pack, plan, segments

J = "a/journal"


def frag(begin: int, end: int, *, url: str = "", mod_time: int = 0) -> FragmentInfo:
    spec = pb.Fragment(journal=J, begin=begin, end=end).SerializeToString()
    return FragmentInfo(J, begin, end, mod_time, url, spec)


def test_segments_follow_the_furthest_fragment_and_prefer_direct_reads() -> None:
    listing = [frag(0, 100), frag(0, 100, url="file:///x"), frag(50, 300), frag(300, 400)]
    segs, losses = segments(J, 10, 350, listing)
    assert losses == []
    assert [(s.begin, s.end) for s in segs] == [(10, 100), (100, 300), (300, 350)]
    assert segs[0].fragment is not None and segs[0].fragment.url == "file:///x"


def test_holes_before_a_fragment_are_data_loss_and_a_tail_is_read_through_a_broker() -> None:
    listing = [frag(100, 200), frag(300, 400)]
    segs, losses = segments(J, 0, 500, listing)
    assert losses == [DataLoss(J, 0, 100), DataLoss(J, 200, 300)]
    assert [(s.begin, s.end, s.fragment is None) for s in segs] == [
        (100, 200, False),
        (300, 400, False),
        (400, 500, True),
    ]
    assert "offsets [0, 100)" in str(losses[0])


def test_raw_segments_are_never_split_and_record_pieces_resync() -> None:
    listing = [frag(0, 1000)]
    parts, _ = plan({J: (0, 1000)}, {J: listing}, Framing.RAW, min_partitions=4, streaming=True)
    assert [[(p.own_begin, p.own_end) for p in part.pieces] for part in parts] == [[(0, 1000)]]

    parts, _ = plan({J: (0, 1000)}, {J: listing}, Framing.LINES, min_partitions=4, streaming=True)
    pieces = [p for part in parts for p in part.pieces]
    assert [(p.own_begin, p.own_end) for p in pieces] == [
        (0, 250),
        (250, 500),
        (500, 750),
        (750, 1000),
    ]
    assert [(p.scan_from, p.resync) for p in pieces] == [
        (0, False),
        (249, True),
        (499, True),
        (749, True),
    ]
    assert all(p.read_end == 1000 for p in pieces)

    parts, _ = plan({J: (0, 1000)}, {J: listing}, Framing.CSV, min_partitions=2, streaming=True)
    pieces = [p for part in parts for p in part.pieces]
    assert [(p.scan_from, p.resync) for p in pieces] == [(0, False), (0, False)]


def test_pack_keeps_order_and_size() -> None:
    listing = [frag(i * 10, i * 10 + 10) for i in range(10)]
    parts, _ = plan({J: (0, 100)}, {J: listing}, Framing.LINES, min_partitions=3, streaming=True)
    # Chunks cut by the range alone (of at most 34 bytes), split at fragment ends into pieces.
    assert [[(p.own_begin, p.own_end) for p in part.pieces] for part in parts] == [
        [(0, 10), (10, 20), (20, 30), (30, 33)],
        [(33, 40), (40, 50), (50, 60), (60, 66)],
        [(66, 70), (70, 80), (80, 90), (90, 100)],
    ]
    assert pack([], 10) == []


@st.composite
def listings(draw: st.DrawFn) -> tuple[list[FragmentInfo], int, int]:
    bounds = sorted(set(draw(st.lists(st.integers(0, 2000), min_size=2, max_size=12))))
    frags = [
        frag(a, b, url=draw(st.sampled_from(["", "file:///f"])))
        for a, b in itertools.pairwise(bounds)
        if draw(st.integers(0, 3))  # Now and then a hole: a removed fragment.
    ]
    begin = draw(st.integers(bounds[0], bounds[-1]))
    end = draw(st.integers(begin, bounds[-1] + 100))
    return frags, begin, end


@settings(deadline=None)
@given(
    listings(),
    st.sampled_from(list(Framing)),
    st.one_of(st.none(), st.integers(1, 9)),
    st.booleans(),
)
def test_pieces_own_every_offset_exactly_once(
    case: tuple[list[FragmentInfo], int, int],
    framing: Framing,
    min_partitions: int | None,
    streaming: bool,
) -> None:
    listing, begin, end = case
    ranges = {J: (begin, end)}
    parts, losses = plan(
        ranges, {J: listing}, framing, min_partitions=min_partitions, streaming=streaming
    )
    owned = sorted(
        [(p.own_begin, p.own_end) for part in parts for p in part.pieces]
        + [(loss.begin, loss.end) for loss in losses]
    )
    cursor = begin
    for lo, hi in owned:
        assert lo == cursor and hi > lo
        cursor = hi
    assert cursor == max(begin, end)
    for part in parts:
        for p in part.pieces:
            assert p.scan_from <= p.own_begin < p.own_end <= p.read_end
            if p.fragment is not None:
                assert p.fragment.begin <= p.scan_from and p.read_end <= p.fragment.end
    # Planning again gives the same partitions: replays of a micro-batch see the same plan.
    again, _ = plan(ranges, {J: listing}, framing, min_partitions=min_partitions, streaming=True)
    if streaming:
        assert [part.pieces for part in again] == [part.pieces for part in parts]


def test_earliest_and_timestamp_offsets() -> None:
    listing = [frag(0, 10, mod_time=100), frag(10, 20, mod_time=200), frag(20, 30)]
    assert earliest_offset(listing, 30) == 0
    assert earliest_offset([], 42) == 42
    assert offset_at_timestamp(listing, 30, 150_000) == 10
    assert offset_at_timestamp(listing, 30, 100_000) == 0
    assert offset_at_timestamp(listing, 30, 10**12) == 20  # The spool (mod time 0) is "now".
    assert offset_at_timestamp(listing[:2], 20, 10**12) == 20  # None: the head.


def _owned(parts: list[GazettePartition]) -> list[list[tuple[int, int]]]:
    """Each partition's owned offsets, as merged intervals."""
    out = []
    for part in parts:
        spans: list[tuple[int, int]] = []
        for p in sorted(part.pieces, key=lambda p: p.own_begin):
            if spans and spans[-1][1] == p.own_begin:
                spans[-1] = (spans[-1][0], p.own_end)
            else:
                spans.append((p.own_begin, p.own_end))
        out.append(spans)
    return out


def test_a_replanned_micro_batch_owns_its_offsets_per_partition_whatever_the_listing() -> None:
    # The sink's fence is per Spark partition: a micro-batch replayed after a restart must give
    # each partition the same records. Its listing has changed meanwhile (the spool it was
    # read from was persisted, in two fragments): the partitions must not follow it.
    ranges = {J: (0, 1000), "b/journal": (0, 300)}
    before = {J: [frag(0, 1000)], "b/journal": []}
    after = {J: [frag(0, 600, url="file:///x"), frag(600, 1000)], "b/journal": [frag(0, 300)]}
    for framing in (Framing.LINES, Framing.CSV):
        for min_partitions in (2, 3, 5):
            first, _ = plan(ranges, before, framing, min_partitions=min_partitions, streaming=True)
            again, _ = plan(ranges, after, framing, min_partitions=min_partitions, streaming=True)
            assert _owned(again) == _owned(first), (framing, min_partitions)
    # Raw rows end where fragments end, so a raw journal range is never split for a stream.
    first, _ = plan(ranges, before, Framing.RAW, min_partitions=4, streaming=True)
    again, _ = plan(ranges, after, Framing.RAW, min_partitions=4, streaming=True)
    assert _owned(again) == _owned(first)


def test_planning_walks_each_journal_s_segments_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A range is cut into chunks, and each chunk takes its pieces from the segments it
    # overlaps, found by walking chunks and segments together: looking at every segment for
    # every chunk made planning grow as their product (an 80 GiB journal of 4 MiB fragments,
    # 625 chunks x 20,000 segments: 1.8 s; a terabyte's, minutes).
    from pygazette.spark import planning

    handed: list[int] = []
    real = planning.chunk_pieces

    def counted(journal: str, lo: int, hi: int, segs: list[Any], framing: Framing) -> Any:
        handed.append(len(segs))
        return real(journal, lo, hi, segs, framing)

    monkeypatch.setattr(planning, "chunk_pieces", counted)
    listing = [frag(i * 100, (i + 1) * 100) for i in range(1000)]
    parts, losses = plan(
        {J: (0, 100_000)}, {J: listing}, Framing.JSON, min_partitions=50, streaming=False
    )
    assert losses == [] and len(parts) == 50 and len(handed) == 50
    assert sum(handed) <= 1000 + 50  # Each segment once, and one more per chunk boundary.
    assert [(p.own_begin, p.own_end) for part in parts for p in part.pieces] == [
        (i * 100, (i + 1) * 100) for i in range(1000)
    ]
