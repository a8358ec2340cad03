"""ObservedState's incremental updates equal a from-scratch extract, whatever the changes."""

from __future__ import annotations

import asyncio
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.allocator.allocator import ObservedState
from pygazette.allocator.state import AllocatorState
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, KeyChanges, Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder

LOCAL = LAYOUT.member_key("a", "m0")
MEMBERS = [LAYOUT.member_key(z, f"m{i}") for z in ("a", "b") for i in range(3)]
ITEMS = [LAYOUT.item_key(f"item-{i}") for i in range(5)]
ASSIGNMENTS = [
    LAYOUT.assign_prefix + f"item-{i}#{z}#m{m}#{slot}"
    for i in range(6)  # item-5 never exists: its assignments are dead.
    for z in ("a", "b")
    for m in range(3)
    for slot in range(3)
]

_member_value = st.sampled_from([b"0", b"2", b"5", b"5,exiting", b"1,exiting"])
_item_value = st.sampled_from([b"0", b"1", b"2", b"3", b"bad"])
_op = st.one_of(
    st.tuples(st.sampled_from(MEMBERS), _member_value),
    st.tuples(st.sampled_from(ITEMS), _item_value),
    st.tuples(st.sampled_from(ASSIGNMENTS), st.sampled_from([b"", b"x"])),
    st.tuples(st.sampled_from(MEMBERS + ITEMS + ASSIGNMENTS), st.none()),
)


def view(s: AllocatorState) -> dict[str, object]:
    return {
        "revision": s.revision,
        "members": [(m.zone, m.suffix, m.kv, m.item_limit, m.exiting) for m in s.members],
        "member_index": s.member_index,
        "items": [(i.id, i.kv, i.replication) for i in s.items],
        "item_index": s.item_index,
        "assignments": [a.kv for a in s.assignments],
        "by_item": {k: [a.kv for a in g] for k, g in s.by_item.items()},
        "local_member": s.local_member,
        "local_items": [
            (li.item.id, li.index, [a.kv for a in li.assignments]) for li in s.local_items
        ],
        "zones": s.zones,
        "item_slots": s.item_slots,
        "member_slots": s.member_slots,
        "network_hash": s.network_hash,
        "member_total": s.member_total,
        "member_primary": s.member_primary,
        "shed_capacity": s.shed_capacity,
        "leader": s.is_leader(),
        "should_exit": s.should_exit(),
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_op, min_size=1, max_size=6), min_size=1, max_size=12))
def test_incremental_state_equals_extract(batches: list[list[tuple[str, bytes | None]]]) -> None:
    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        await ks.txn([], [Put(LOCAL, b"5")])
        observed = ObservedState(ks, LAYOUT, TextDecoder(), LOCAL)
        feed = observed.touched_items()
        assert feed.take() is None  # Everything, at first.
        for batch in batches:
            before = observed.current
            snapshot = view(before)
            ops: list[Put | Delete] = []
            for key, value in dict(batch).items():  # One op per key and transaction.
                ops.append(Delete(key) if value is None else Put(key, value))
            await ks.txn([], ops)
            assert view(before) == snapshot, "a published state changed"
            scratch = AllocatorState.extract(ks, LAYOUT, TextDecoder(), LOCAL)
            assert view(observed.current) == view(scratch)
            touched = feed.take()
            assert touched is not None
            changed = {
                k[len(LAYOUT.items_prefix) :]
                if k.startswith(LAYOUT.items_prefix)
                else k[len(LAYOUT.assign_prefix) :].split("#")[0]
                for k, _v in batch
                if not k.startswith(LAYOUT.members_prefix)
            }
            assert touched == changed

    asyncio.run(run())


def test_a_missed_change_re_extracts() -> None:
    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        await ks.txn([], [Put(LOCAL, b"5")])
        observed = ObservedState(ks, LAYOUT, TextDecoder(), LOCAL)
        listener = ks._listeners[0]
        ks._listeners[0] = lambda _changes: None  # Misses the next change.
        await ks.txn([], [Put(ITEMS[0], b"1")])
        ks._listeners[0] = listener
        await ks.txn([], [Put(ITEMS[1], b"2")])
        scratch = AllocatorState.extract(ks, LAYOUT, TextDecoder(), LOCAL)
        assert view(observed.current) == view(scratch)
        assert observed.current.item_slots == 3

    asyncio.run(run())


def test_a_change_costs_what_it_touched_not_the_keyspace() -> None:
    """A change to one item's assignments builds the next state from the last one, sharing
    every other item's entries (persistent maps), and leaves the last state as it was. Kept
    states then cost memory for what changed: with a dict copied per change, each state
    held its own copy of the whole keyspace's maps (~35 bytes an item each)."""

    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        items = [f"shared-{i:05d}" for i in range(5000)]
        await ks.txn([], [Put(LOCAL, b"50000")])
        for start in range(0, len(items), 500):
            batch = items[start : start + 500]
            await ks.txn([], [Put(LAYOUT.item_key(i), b"1") for i in batch])
            await ks.txn([], [Put(LAYOUT.assign_prefix + f"{i}#a#m0#0", b"") for i in batch])
        observed = ObservedState(ks, LAYOUT, TextDecoder(), LOCAL)
        first = observed.current
        kept = []
        tracemalloc.start()
        try:
            for i in items[:50]:
                await ks.txn([], [Put(LAYOUT.assign_prefix + f"{i}#a#m0#0", b"route")])
                kept.append(observed.current)
            allocated, _peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # Each of the 50 states may hold what its change touched, not 5,000 items' entries.
        assert allocated / len(kept) < 40_000, allocated / len(kept)
        assert [a.kv.value for a in first.by_item[items[0]]] == [b""]
        assert [a.kv.value for a in kept[-1].by_item[items[0]]] == [b"route"]
        assert kept[-1].by_item[items[-1]] is first.by_item[items[-1]]
        assert view(kept[-1]) == view(AllocatorState.extract(ks, LAYOUT, TextDecoder(), LOCAL))

    asyncio.run(run())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.lists(_op, min_size=1, max_size=4), min_size=1, max_size=4),
        min_size=1,
        max_size=8,
    )
)
def test_coalesced_changes_equal_extract(
    groups: list[list[list[tuple[str, bytes | None]]]],
) -> None:
    """As an etcd watch response delivers them: the changes of several revisions in one
    KeyChanges, each key once with its last value (a key created and deleted among them is a
    delete of a key the state never had; one deleted and created again, a put with a new
    create revision)."""

    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        await ks.txn([], [Put(LOCAL, b"5")])
        observed = ObservedState(ks, LAYOUT, TextDecoder(), LOCAL)
        listeners, ks._listeners = ks._listeners, []  # Notified by hand, coalesced.
        for group in groups:
            prior = ks.revision
            before = {kv.key: kv for kv in ks.range(LAYOUT.root)}
            touched: set[str] = set()
            for batch in group:
                ops: list[Put | Delete] = []
                for key, value in dict(batch).items():
                    ops.append(Delete(key) if value is None else Put(key, value))
                    touched.add(key)
                await ks.txn([], ops)
            after = {kv.key: kv for kv in ks.range(LAYOUT.root)}
            puts = [after[k] for k in sorted(touched) if k in after and after[k] != before.get(k)]
            deletes = [k for k in sorted(touched) if k not in after]
            changes = KeyChanges(prior, ks.revision, puts, deletes)
            for listener in listeners:
                listener(changes)
            assert observed.current.revision == ks.revision
            scratch = AllocatorState.extract(ks, LAYOUT, TextDecoder(), LOCAL)
            assert view(observed.current) == view(scratch)

    asyncio.run(run())
