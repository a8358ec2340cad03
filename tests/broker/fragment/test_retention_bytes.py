"""Size-bounded retention plans (`pygazette.dev/retention-bytes`): the oldest content goes
first, the persisted history kept spans at most the bound, the head and gap rules hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.broker.fragment.cover_set import CoverSet
from pygazette.broker.fragment.retention import KEPT_GAP, KEPT_HEAD, plan_retention
from pygazette.protocol.pb import protocol_pb2 as pb

NOW = 1_000_000
HOUR = 3600


def frag(begin: int, end: int, age: float = 0, store: str = "file:///") -> pb.Fragment:
    return pb.Fragment(
        journal="a/j", begin=begin, end=end, mod_time=int(NOW - age), backing_store=store
    )


def spans(frags: list[pb.Fragment]) -> list[tuple[int, int]]:
    return [(f.begin, f.end) for f in frags]


def test_oldest_fragments_go_until_the_rest_fits() -> None:
    listing = [frag(0, 10), frag(10, 20), frag(20, 30), frag(30, 40)]
    assert spans(plan_retention(listing, 0, NOW, max_bytes=20).remove) == [(0, 10), (10, 20)]
    # A fragment reaching back past the bound goes whole: at most the bound is kept.
    assert spans(plan_retention(listing, 0, NOW, max_bytes=25).remove) == [(0, 10), (10, 20)]
    assert spans(plan_retention(listing, 0, NOW, max_bytes=40).remove) == []
    assert spans(plan_retention(listing, 0, NOW, max_bytes=0).remove) == []


def test_the_head_fragment_stays_even_when_larger_than_the_bound() -> None:
    listing = [frag(0, 10), frag(10, 100)]
    plan = plan_retention(listing, 0, NOW, max_bytes=5)
    assert spans(plan.remove) == [(0, 10)]
    assert [(f.begin, reason) for f, reason in plan.kept] == [(10, KEPT_HEAD)]


def test_age_and_size_both_expire() -> None:
    listing = [frag(0, 10, 0), frag(10, 20, 5 * HOUR), frag(20, 30, 0), frag(30, 40, 0)]
    # By size alone [0, 10) goes; [10, 20) expired by age, but it lies after retained content
    # [0, 10)... which is removed now, so [10, 20) is at the front and goes too.
    assert spans(plan_retention(listing, HOUR, NOW, max_bytes=30).remove) == [(0, 10), (10, 20)]
    # By age alone it would be a gap: kept.
    plan = plan_retention(listing, HOUR, NOW)
    assert plan.remove == [] and [(f.begin, r) for f, r in plan.kept] == [(10, KEPT_GAP)]


def test_duplicates_in_other_stores_do_not_count_twice() -> None:
    listing = [
        frag(0, 10, store="s/a"),
        frag(0, 10, store="s/b"),
        frag(10, 20, store="s/a"),
        frag(10, 20, store="s/b"),
    ]
    assert plan_retention(listing, 0, NOW, max_bytes=10).remove == [listing[0], listing[1]]
    assert plan_retention(listing, 0, NOW, max_bytes=20).remove == []


fragments_st = st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 15), st.sampled_from([0, 0.5, 2, 5])),
    min_size=1,
    max_size=12,
).map(lambda ts: [frag(b, b + n, age * HOUR, f"s/{i % 2}") for i, (b, n, age) in enumerate(ts)])


@settings(max_examples=300, deadline=None)
@given(
    listing=fragments_st,
    max_bytes=st.integers(1, 80),
    retention=st.sampled_from([0, HOUR]),
)
def test_properties(listing: list[pb.Fragment], max_bytes: int, retention: int) -> None:
    plan = plan_retention(listing, retention, NOW, max_bytes=max_bytes)
    removed = {id(f) for f in plan.remove}
    remaining = [f for f in listing if id(f) not in removed]
    head_end = max(f.end for f in listing)
    head = min((f for f in listing if f.end == head_end), key=lambda f: f.begin)
    # The fragment holding the write head is never removed.
    assert id(head) not in removed
    # Only fragments past the bound, or (with an age bound) old ones, are removed.
    for f in plan.remove:
        assert f.begin < head_end - max_bytes or (retention and NOW - f.mod_time >= retention)
    # Without an age bound, what remains spans at most the bound, unless the head alone is
    # larger, or a fragment past the bound was kept to fill a gap within it (overlapping
    # fragments of odd sizes, e.g. from several stores).
    if not retention and not any(reason == KEPT_GAP for _f, reason in plan.kept):
        start = min(f.begin for f in remaining)
        assert head_end - start <= max(max_bytes, head_end - head.begin)
    # Every offset within the bound that some fragment held is still held, and the
    # remaining content from the first retained offset on has no new gaps.
    kept = CoverSet(sorted(remaining, key=lambda f: (f.begin, -f.end)))
    before = CoverSet(sorted(listing, key=lambda f: (f.begin, -f.end)))
    start = min(f.begin for f in remaining)
    for off in range(start, head_end):
        if before.longest_overlapping(off)[1]:
            assert kept.longest_overlapping(off)[1], (off, spans(plan.remove))
