"""The leader's rounds (DesiredPlan updated from the touched-items feed, then converge on the
pending items, as `Allocator.run` does) settle after any sequence of keyspace changes to
an allocation a full solve would reach: every item at least as replicated as a full solve makes it,
one primary, packed slots, no assignment of a gone item or member."""

from __future__ import annotations

import asyncio
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.allocator.allocator import ObservedState, TouchedItems
from pygazette.allocator.converge import BatchedTxn, converge, unchanged
from pygazette.allocator.solver import DesiredPlan, solve_desired_assignments
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder

LEADER = LAYOUT.member_key("a", "leader")
_MEMBERS = [("a", "m1"), ("a", "m2"), ("b", "m3"), ("b", "m4")]
_op = st.one_of(
    # Limit 0: the member leaves (its key and assignments go, as when its lease expires).
    st.tuples(st.just("member"), st.sampled_from(_MEMBERS), st.integers(0, 4), st.booleans()),
    # Replication 0: the item is deleted.
    st.tuples(st.just("item"), st.integers(0, 5), st.integers(0, 3), st.just(False)),
)


async def _rounds(
    ks: EmbeddedKeyspace,
    observed: ObservedState,
    plan: DesiredPlan,
    feed: TouchedItems,
    pending: set[str],
) -> int:
    """Leader rounds until one writes nothing; the number of rounds."""
    for n in range(60):
        state = observed.current
        touched = feed.take()
        changed = plan.update(state, touched)
        if touched is None:
            pending |= set(state.item_map) | set(state.by_item)
        else:
            pending |= touched
        pending |= changed
        work = state.for_convergence()
        txn = BatchedTxn(ks, [unchanged(work.members[work.local_member].kv)])
        stats = await converge(work, plan.by_item, txn, set(pending))
        await txn.flush()
        pending -= stats.settled
        if txn.revision == 0:
            return n
    raise AssertionError("the rounds did not settle (a livelock)")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_op, min_size=1, max_size=3), min_size=1, max_size=8))
def test_rounds_settle_to_a_full_allocation(
    batches: list[list[tuple[str, object, int, bool]]],
) -> None:
    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        await ks.txn([], [Put(LEADER, b"0")])
        observed = ObservedState(ks, LAYOUT, TextDecoder(), LEADER)
        feed = observed.touched_items()
        plan = DesiredPlan()
        pending: set[str] = set()
        for batch in batches:
            ops: dict[str, Put | Delete] = {}
            for kind, what, n, exiting in batch:
                if kind == "member":
                    zone, suffix = what  # type: ignore[misc]
                    key = LAYOUT.member_key(zone, suffix)
                    value = f"{n},exiting" if exiting else str(n)
                    if n == 0:
                        for kv in ks.range(LAYOUT.assign_prefix):
                            if f"#{zone}#{suffix}#" in kv.key:
                                ops[kv.key] = Delete(kv.key)
                else:
                    key, value = LAYOUT.item_key(f"item-{what}"), str(n)
                ops[key] = Put(key, value.encode()) if n else Delete(key)
            await ks.txn([], list(ops.values()))
            await _rounds(ks, observed, plan, feed, pending)
            state = observed.current
            full = solve_desired_assignments(state)
            groups: dict[str, list[tuple[str, str, int]]] = {}
            for kv in ks.range(LAYOUT.assign_prefix):
                a = LAYOUT.parse_assignment_key(kv.key)
                groups.setdefault(a.item, []).append((a.zone, a.suffix, a.slot))
            assert set(groups) <= set(state.item_map), "assignments of a gone item"
            # As many replicas as a full solve places, or more: a replica on a member
            # that sheds its capacity stays while its removal would leave its item below
            # its replication (Gazette's rule).
            assert sum(map(len, groups.values())) >= len(full), (groups, full)
            load: Counter[tuple[str, str]] = Counter()
            for item_id, group in groups.items():
                slots = sorted(s for _, _, s in group)
                assert slots == list(range(len(group))), (item_id, group)
                assert len({(z, s) for z, s, _ in group}) == len(group)
                assert len(group) <= state.item_map[item_id].replication
                load.update((z, s) for z, s, _ in group)
            for member in load:
                assert state.find_member(*member) is not None, f"assignments of {member}"
            # (A member whose limit was lowered may stay above it: an assignment is removed
            # only while its item keeps its replication elsewhere, as in Gazette.)

    asyncio.run(run())
