"""Segments and segment sets: validation, reduction, insertion, intersection (Gazette's cases)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pygazette.consumer.recoverylog import Segment, SegmentError, SegmentSet
from pygazette.consumer.recoverylog.segments import _NotReducible, _reduce
from pygazette.protocol.errors import ValidationError

A = "log/A"
B = "log/B"


def S(  # Reads like Gazette's Segment{} fixtures.
    author: int,
    first: int,
    last: int,
    first_offset: int,
    last_offset: int = 0,
    checksum: int = 0,
    log: str = A,
) -> Segment:
    return Segment(author, first, first_offset, checksum, last, last_offset, log)


def model() -> SegmentSet:
    return SegmentSet(
        [
            S(0xA, 5, 10, 500, 1001),
            S(0xB, 11, 11, 1100, 1101),
            S(0xB, 13, 15, 1300, 1501),
        ]
    )


def permute_and_add(to: SegmentSet, items: list[Segment], seed: int) -> SegmentSet:
    rng = random.Random(seed)
    items = list(items)
    rng.shuffle(items)
    for item in items:
        to.add(item)
    return to


def test_segment_validation() -> None:
    good = S(0xFEFE, 10, 10, 0, 1, 0xABAB)
    good.validate()
    dataclasses.replace(good, last_offset=0).validate()
    for change, err in [
        ({"author": 0}, "Author is zero"),
        ({"first_seq_no": 0}, "FirstSeqNo <= 0"),
        ({"first_seq_no": -1}, "FirstSeqNo <= 0"),
        ({"first_offset": -1}, "FirstOffset < 0"),
        ({"last_seq_no": 9}, "LastSeqNo < segment.FirstSeqNo"),
        ({"first_offset": 100, "last_offset": 99}, "LastOffset <= segment.FirstOffset"),
        ({"log": ""}, "Log: invalid length"),
    ]:
        with pytest.raises(ValidationError, match=err):
            dataclasses.replace(good, **change).validate()  # type: ignore[arg-type]


REDUCTIONS: list[tuple[Segment, Segment, Segment | str]] = [
    # Overlap.
    (S(1, 2, 7, 200, 700, 0x22), S(1, 4, 9, 400, 901, 0x44), S(1, 2, 9, 200, 901, 0x22)),
    (S(1, 2, 7, 200, 701, 0x22), S(1, 4, 9, 100, 901, 0x44), "expected monotonic FirstOffset"),
    (S(1, 2, 7, 200, 701, 0x22), S(1, 4, 9, 400, 700, 0x44), "expected monotonic LastOffset"),
    (
        S(1, 2, 7, 200, 0, 0x22),
        S(1, 4, 9, 400, 901, 0x44),
        "expected preceding Segment to also include LastOffset",
    ),
    (S(1, 2, 7, 200, 701, 0x22), S(2, 4, 9, 400, 901, 0x44), "expected Segment Author equality"),
    (
        S(1, 2, 7, 200, 701, 0x22),
        S(1, 4, 9, 400, 901, 0x44, log=B),
        "expected Segment Log equality",
    ),
    # Covered.
    (S(1, 2, 7, 200, 701, 0x22), S(1, 3, 6, 300, 0, 0x33), S(1, 2, 7, 200, 701, 0x22)),
    # Disjoint.
    (S(1, 2, 4, 200, 401, 0x22), S(1, 6, 7, 600, 0, 0x66), "not reducible"),
    # Equal-right (a known LastOffset is preferred).
    (S(1, 2, 7, 200, 701, 0x22), S(1, 4, 7, 400, 0, 0x44), S(1, 2, 7, 200, 701, 0x22)),
    (S(1, 2, 7, 200, 701, 0x22), S(1, 4, 7, 400, 702, 0x44), "expected monotonic LastOffset"),
    # Equal-left (the larger FirstOffset is preferred).
    (S(1, 2, 7, 200, 701, 0x22), S(1, 2, 9, 210, 901, 0x22), S(1, 2, 9, 210, 901, 0x22)),
    (S(1, 2, 7, 200, 701, 0x22), S(1, 2, 9, 210, 901, 0xBAD), "expected FirstChecksum equality"),
    # Identity.
    (S(1, 2, 7, 190, 701, 0x22), S(1, 2, 7, 200, 0, 0x22), S(1, 2, 7, 200, 701, 0x22)),
    # Adjacent.
    (S(1, 2, 4, 200, 401, 0x22), S(1, 5, 7, 500, 701, 0x55), S(1, 2, 7, 200, 701, 0x22)),
    (S(1, 2, 4, 200, 401, 0x22), S(2, 5, 7, 500, 701, 0x55), "not reducible"),
    (S(1, 2, 4, 200, 401, 0x22), S(1, 5, 7, 500, 701, 0x55, log=B), "not reducible"),
    (
        S(1, 2, 4, 200, 0, 0x22),
        S(1, 5, 7, 500, 0, 0x55, log=B),
        "Segment cannot use a different log where preceding Segment.LastOffset is zero",
    ),
]


@pytest.mark.parametrize(("a", "b", "expect"), REDUCTIONS)
def test_segment_reduction(a: Segment, b: Segment, expect: Segment | str) -> None:
    for x, y in ((a, b), (b, a)):  # Reduction is symmetric.
        if isinstance(expect, Segment):
            assert _reduce(x, y) == expect
        elif expect == "not reducible":
            with pytest.raises(_NotReducible):
                _reduce(x, y)
        else:
            with pytest.raises(SegmentError, match=expect):
                _reduce(x, y)


@pytest.mark.parametrize("seed", range(5))
def test_set_identity(seed: int) -> None:
    assert permute_and_add(SegmentSet(), list(model()), seed) == model()


@pytest.mark.parametrize("seed", range(5))
def test_set_non_overlapping_insertion(seed: int) -> None:
    got = permute_and_add(
        model(),
        [
            S(0xF, 1, 4, 100, 401),
            S(0xF, 12, 12, 1200, 1201),
            S(0xF, 16, 18, 1600, 1801),
            S(0xF, 19, 20, 20, 21, log=B),
        ],
        seed,
    )
    assert got == [
        S(0xF, 1, 4, 100, 401),
        S(0xA, 5, 10, 500, 1001),
        S(0xB, 11, 11, 1100, 1101),
        S(0xF, 12, 12, 1200, 1201),
        S(0xB, 13, 15, 1300, 1501),
        S(0xF, 16, 18, 1600, 1801),
        S(0xF, 19, 20, 20, 21, log=B),
    ]


@pytest.mark.parametrize("seed", range(5))
def test_set_overlap(seed: int) -> None:
    got = permute_and_add(
        model(),
        [S(0xA, 1, 4, 100, 401), S(0xB, 12, 12, 1200, 1201), S(0xB, 16, 18, 1600)],
        seed,
    )
    assert got == [S(0xA, 1, 10, 100, 1001), S(0xB, 11, 18, 1100)]


@pytest.mark.parametrize("seed", range(5))
def test_set_covered(seed: int) -> None:
    got = permute_and_add(
        model(),
        [
            S(0xA, 5, 9, 500),
            S(0xA, 6, 10, 600),
            S(0xB, 11, 11, 1100),
            S(0xB, 13, 14, 1300),
            S(0xB, 14, 15, 1400),
        ],
        seed,
    )
    assert got == model()


@pytest.mark.parametrize("seed", range(5))
def test_set_point_extensions(seed: int) -> None:
    got = permute_and_add(
        model(),
        [
            S(0xB, 16, 16, 1600, 1601),
            S(0xB, 17, 17, 1700, 1701),
            S(0xB, 18, 18, 1800, 1801),
            S(0xC, 19, 19, 1900),
            S(0xC, 20, 20, 2000),
        ],
        seed,
    )
    assert got == [
        S(0xA, 5, 10, 500, 1001),
        S(0xB, 11, 11, 1100, 1101),
        S(0xB, 13, 18, 1300, 1801),
        S(0xC, 19, 20, 1900),
    ]


@pytest.mark.parametrize(
    ("segment", "err"),
    [
        (S(0xC, 4, 5, 400, 501), "expected Segment Author equality"),
        (S(0xA, 10, 11, 1000, 1101), "expected Segment Author equality"),
        (S(0xB, 10, 11, 1000, 1101), "expected Segment Author equality"),
        (S(0xC, 15, 15, 1500, 1501), "expected Segment Author equality"),
        (S(0xA, 4, 5, 400, 501, log="wrong"), "expected Segment Log equality"),
        (S(0xB, 12, 12, 1200), "expected preceding Segment to also include LastOffset"),
        (S(0xB, 12, 12, 1050, 1200), "expected monotonic FirstOffset"),
        (S(0xA, 3, 3, 300, 1050), "expected monotonic LastOffset"),
    ],
)
def test_set_consistency_checks(segment: Segment, err: str) -> None:
    m = model()
    with pytest.raises(SegmentError, match=err):
        m.add(segment)
    assert m == model()  # Unchanged.


@pytest.mark.parametrize(
    ("first", "last", "lo", "hi"),
    [
        (0, 100000, 0, 3),
        (0, 500, 0, 0),
        (0, 501, 0, 1),
        (1000, 1001, 0, 1),
        (1000, 1100, 0, 1),
        (1000, 1101, 0, 2),
        (1000, 1300, 0, 2),
        (1000, 1301, 0, 3),
        (1000, 100000, 0, 3),
        (1001, 1001, 1, 1),
        (1001, 1100, 1, 1),
        (1001, 1101, 1, 2),
        (1100, 1101, 1, 2),
        (1101, 1101, 2, 2),
        (1101, 1300, 2, 2),
        (1101, 1301, 2, 3),
        (1300, 1301, 2, 3),
        (1300, 100000, 2, 3),
        (1500, 100000, 2, 3),
        (1501, 100000, 3, 3),
        (10000, 100000, 3, 3),
    ],
)
def test_intersection(first: int, last: int, lo: int, hi: int) -> None:
    m = model()
    assert list(m.intersect(A, first, last)) == list(m)[lo:hi]


def test_intersection_checks() -> None:
    with pytest.raises(ValueError):
        model().intersect(A, 10, 5)
    with pytest.raises(ValueError):
        model().intersect(B, 0, 5)


def test_hints_of_many_files_parse_in_linear_time() -> None:
    """Hints add each file's segments to one set in turn: 80,000 files (disjoint segments of
    alternating authors) take about half a CPU second, where an add that listed every
    segment's key (quadratic in the files) took about 30."""
    import time

    from pygazette.consumer.recoverylog import FSM
    from pygazette.protocol.pb import recoverylog_pb2 as rpb

    hints = rpb.FSMHints(log=A)
    for i in range(80_000):
        seq = 1 + 2 * i
        hints.live_nodes.add(
            fnode=seq,
            segments=[
                rpb.Segment(
                    author=1 + i % 2,
                    first_seq_no=seq,
                    last_seq_no=seq,
                    first_offset=10 * i,
                    last_offset=10 * i + 10,
                )
            ],
        )
    began = time.process_time()
    fsm = FSM.from_hints(hints)
    assert time.process_time() - began < 5.0
    assert len(fsm.hinted_segments) == 80_000
