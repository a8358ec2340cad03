"""Cover sets: Gazette's overlap rules, checked against a brute-force model."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.broker.fragment.cover_set import CoverSet, cover_set_difference


@dataclass(frozen=True)
class F:
    begin: int
    end: int
    tag: int = 0


def spans(cs: CoverSet[F]) -> list[tuple[int, int]]:
    return [(f.begin, f.end) for f in cs]


def test_gazette_cases() -> None:
    cs: CoverSet[F] = CoverSet()
    assert cs.add(F(100, 200))
    assert cs.add(F(200, 300))
    assert not cs.add(F(150, 200))  # Covered.
    assert not cs.add(F(100, 100))  # Empty.
    assert cs.add(F(50, 250))  # Partial overlaps are kept.
    assert spans(cs) == [(50, 250), (200, 300)]  # [100, 200) was covered by [50, 250).
    assert cs.add(F(200, 300, tag=1))  # An equal span replaces (the later listing wins).
    assert [f.tag for f in cs] == [0, 1]
    assert cs.add(F(0, 400))  # Covers everything.
    assert spans(cs) == [(0, 400)]


def test_adding_past_the_end_replaces_every_fragment_it_covers() -> None:
    # Gazette's fast path would keep [0, 10) here.
    cs = CoverSet([F(0, 10), F(10, 20)])
    assert cs.add(F(0, 30))
    assert spans(cs) == [(0, 30)]


def test_longest_overlapping() -> None:
    cs = CoverSet([F(0, 100), F(50, 150), F(200, 300)])
    assert cs.longest_overlapping(60) == (1, True)  # Most content after the offset.
    assert cs.longest_overlapping(10) == (0, True)
    assert cs.longest_overlapping(160) == (2, False)  # The next fragment.
    assert cs.longest_overlapping(300) == (3, False)
    assert cs.covers(0, 150) and cs.covers(10, 20) and not cs.covers(100, 250)


spans_st = st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 30)).map(lambda t: F(t[0], t[0] + t[1])),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(frags=spans_st)
def test_invariants_against_a_model(frags: list[F]) -> None:
    cs: CoverSet[F] = CoverSet()
    for f in frags:
        cs.add(f)
    got = spans(cs)
    # Sorted, strictly increasing begins and ends: no fragment covers another.
    assert got == sorted(got)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(got))
    # Every offset any fragment held is still covered, by the longest-reaching fragment.
    for off in range(0, 100):
        holders = [f for f in frags if f.begin <= off < f.end]
        ind, found = cs.longest_overlapping(off)
        assert found == bool(holders)
        if holders:
            assert cs[ind].end == max(f.end for f in holders)
    # The difference with itself is empty; with an empty set, everything.
    assert cover_set_difference(cs.items(), cs) == []
    assert cover_set_difference(cs.items(), CoverSet()) == cs.items()
