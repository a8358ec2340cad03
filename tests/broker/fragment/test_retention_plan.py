"""Retention plans: expired fragments go, unless they are the only copy readers still need."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.broker.fragment.cover_set import CoverSet
from pygazette.broker.fragment.retention import KEPT_GAP, KEPT_HEAD, plan_retention
from pygazette.protocol.pb import protocol_pb2 as pb

NOW = 1_000_000
HOUR = 3600


def frag(begin: int, end: int, age: float, store: str = "file:///") -> pb.Fragment:
    return pb.Fragment(
        journal="a/j", begin=begin, end=end, mod_time=int(NOW - age), backing_store=store
    )


def spans(frags: list[pb.Fragment]) -> list[tuple[int, int, str]]:
    return [(f.begin, f.end, f.backing_store) for f in frags]


def test_no_retention_keeps_everything() -> None:
    listing = [frag(0, 10, 100 * HOUR), frag(10, 20, 100 * HOUR)]
    assert plan_retention(listing, 0, NOW).remove == []
    assert plan_retention(listing, -5, NOW).remove == []


def test_expired_prefix_is_removed_and_the_rest_kept() -> None:
    listing = [frag(0, 10, 3 * HOUR), frag(10, 20, 2 * HOUR), frag(20, 30, 0.5 * HOUR)]
    plan = plan_retention(listing, HOUR, NOW)
    assert spans(plan.remove) == [(0, 10, "file:///"), (10, 20, "file:///")]
    assert plan.kept == []
    assert plan_retention(listing, HOUR, NOW + 0).remove == plan.remove
    # Exactly at the retention age counts as expired (as gazctl's age >= retention).
    assert spans(plan_retention([frag(0, 5, HOUR), frag(5, 9, 0)], HOUR, NOW).remove) == [
        (0, 5, "file:///")
    ]


def test_the_write_head_is_never_removed() -> None:
    listing = [frag(0, 10, 5 * HOUR), frag(10, 20, 5 * HOUR)]
    plan = plan_retention(listing, HOUR, NOW)
    assert spans(plan.remove) == [(0, 10, "file:///")]
    assert [(f.begin, reason) for f, reason in plan.kept] == [(10, KEPT_HEAD)]


def test_gaps_inside_retained_history_are_not_created() -> None:
    # [10, 20) was persisted long ago, but [0, 10) only recently (e.g. after an outage):
    # removing [10, 20) would leave readers of [0, 10) stuck before [20, 30).
    listing = [frag(0, 10, 0), frag(10, 20, 5 * HOUR), frag(20, 30, 0)]
    plan = plan_retention(listing, HOUR, NOW)
    assert plan.remove == []
    assert [(f.begin, reason) for f, reason in plan.kept] == [(10, KEPT_GAP)]


def test_duplicates_and_covered_copies_are_removed() -> None:
    listing = [
        frag(0, 100, 5 * HOUR, "file:///a/"),
        frag(0, 100, 5 * HOUR, "file:///b/"),  # The same fragment in a second store.
        frag(0, 50, 5 * HOUR, "file:///b/"),  # A smaller copy (gazctl would leave it).
        frag(100, 200, 0),
        frag(150, 200, 5 * HOUR),  # Covered by the young [100, 200).
    ]
    plan = plan_retention(listing, HOUR, NOW)
    assert spans(plan.remove) == [
        (0, 50, "file:///b/"),
        (0, 100, "file:///a/"),
        (0, 100, "file:///b/"),
        (150, 200, "file:///"),
    ]
    # And an expired gap fragment held twice keeps one copy.
    listing = [
        frag(0, 10, 0),
        frag(10, 20, 5 * HOUR, "s/1"),
        frag(10, 20, 5 * HOUR, "s/2"),
        frag(20, 30, 0),
    ]
    plan = plan_retention(listing, HOUR, NOW)
    assert len(plan.remove) == 1 and len(plan.kept) == 1


fragments_st = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 15), st.sampled_from([0, 0.5, 2, 5])),
    min_size=1,
    max_size=12,
).map(lambda ts: [frag(b, b + n, age * HOUR, f"s/{i % 2}") for i, (b, n, age) in enumerate(ts)])


@settings(max_examples=300, deadline=None)
@given(listing=fragments_st)
def test_properties(listing: list[pb.Fragment]) -> None:
    plan = plan_retention(listing, HOUR, NOW)
    removed = {id(f) for f in plan.remove}
    remaining = [f for f in listing if id(f) not in removed]
    # Only expired fragments are removed, and never the one holding the write head.
    assert all(NOW - f.mod_time >= HOUR for f in plan.remove)
    head_end = max(f.end for f in listing)
    assert any(f.end == head_end for f in remaining)
    # Every offset that a young fragment, or the head, holds is still held...
    kept = CoverSet(sorted(remaining, key=lambda f: (f.begin, -f.end)))
    for f in listing:
        if NOW - f.mod_time < HOUR or f.end == head_end:
            assert kept.covers(f.begin, f.end)
    # ...and the remaining content from the first retained offset on has no new gaps.
    start = min(f.begin for f in remaining)
    before = CoverSet(sorted(listing, key=lambda f: (f.begin, -f.end)))
    for off in range(start, head_end):
        if before.longest_overlapping(off)[1]:
            assert kept.longest_overlapping(off)[1], (off, spans(plan.remove))


def test_two_passes_planned_from_one_listing_leave_no_gap() -> None:
    # Two brokers serving the journal (or the timer and a `journals prune`) list it at once
    # and plan at slightly different times. At the earlier one the parts [100, 150) and
    # [150, 200) are young and the old [100, 200) is removed as covered by them; at the
    # later one the parts have expired too, and the plan must not keep the old fragment
    # instead, removing the parts that the earlier plan relied on.
    listing = [
        frag(0, 100, 0),
        frag(100, 200, 5 * HOUR),
        frag(100, 150, HOUR - 10),
        frag(150, 200, HOUR - 10),
        frag(200, 300, 0),
    ]
    early, late = plan_retention(listing, HOUR, NOW), plan_retention(listing, HOUR, NOW + 20)
    assert spans(early.remove) == [(100, 200, "file:///")]
    removed = {id(f) for f in early.remove + late.remove}
    remaining = CoverSet([f for f in listing if id(f) not in removed])
    assert remaining.covers(0, 300), spans(late.remove)


# Ages in half hours, so that passes half an hour apart see different fragments expire.
aged_fragments_st = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 15), st.integers(0, 6)),
    min_size=1,
    max_size=10,
).map(lambda ts: [frag(b, b + n, a * HOUR / 2, f"s/{i % 2}") for i, (b, n, a) in enumerate(ts)])


@settings(max_examples=2000, deadline=None)
@given(listing=aged_fragments_st, later=st.integers(1, 6))
def test_passes_at_different_times_over_one_listing_leave_no_gap(
    listing: list[pb.Fragment], later: int
) -> None:
    early = plan_retention(listing, HOUR, NOW)
    late = plan_retention(listing, HOUR, NOW + later * HOUR / 2)
    removed = {id(f) for f in early.remove + late.remove}
    remaining = [f for f in listing if id(f) not in removed]
    kept = CoverSet(sorted(remaining, key=lambda f: (f.begin, -f.end)))
    late_removed = {id(f) for f in late.remove}
    late_kept = [f for f in listing if id(f) not in late_removed]
    start = min(f.begin for f in late_kept)
    before = CoverSet(sorted(listing, key=lambda f: (f.begin, -f.end)))
    for off in range(start, max(f.end for f in listing)):
        if before.longest_overlapping(off)[1]:
            assert kept.longest_overlapping(off)[1], (off, spans(early.remove), spans(late.remove))
