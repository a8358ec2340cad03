"""The leader's DesiredPlan re-solves only what a change affects, and moves little."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.allocator import solver
from pygazette.allocator.allocator import ObservedState
from pygazette.allocator.solver import DesiredPlan, solve_desired_assignments
from pygazette.allocator.state import AllocatorState
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder

LOCAL = LAYOUT.member_key("a", "m0")


async def _cluster(members: dict[str, int], items: int, r: int = 3) -> EmbeddedKeyspace:
    ks = EmbeddedKeyspace(None)
    for name, limit in members.items():
        zone, suffix = name.split("/")
        await ks.txn([], [Put(LAYOUT.member_key(zone, suffix), str(limit).encode())])
    ops = [Put(LAYOUT.item_key(f"item-{i:04d}"), str(r).encode()) for i in range(items)]
    for start in range(0, len(ops), 100):
        await ks.txn([], ops[start : start + 100])
    return ks


def _state(ks: EmbeddedKeyspace) -> AllocatorState:
    return AllocatorState.extract(ks, LAYOUT, TextDecoder(), LOCAL)


async def _assign(ks: EmbeddedKeyspace, plan: DesiredPlan) -> None:
    """Make current assignments equal the plan's (as converged rounds would)."""
    ops: list[Put | Delete] = [Delete(kv.key) for kv in ks.range(LAYOUT.assign_prefix)]
    slots: Counter[str] = Counter()
    for d in plan.assignments():
        key = LAYOUT.assign_prefix + f"{d.item}#{d.zone}#{d.suffix}#{slots[d.item]}"
        slots[d.item] += 1
        ops.append(Put(key, b""))
    for start in range(0, len(ops), 100):
        await ks.txn([], ops[start : start + 100])


def _placements(plan: DesiredPlan) -> set[tuple[str, str, str]]:
    return {(d.item, d.zone, d.suffix) for d in plan.assignments()}


MEMBERS = {f"{'ab'[i % 2]}/m{i}": 100 for i in range(10)}


async def test_full_plan_equals_the_one_shot_solve() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    assert plan.assignments() == solve_desired_assignments(_state(ks))
    load = Counter(f"{d.zone}/{d.suffix}" for d in plan.assignments())
    assert len(plan.assignments()) == 600 and not plan.short
    assert max(load.values()) - min(load.values()) <= 1
    assert all({d.zone for d in plan.by_item[i]} == {"a", "b"} for i in plan.by_item)


async def test_a_new_item_is_all_that_is_solved() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    await _assign(ks, plan)
    before = _placements(plan)
    assert plan.update(_state(ks), set()) == set()  # Nothing changed: nothing solved.
    solved = plan.solved_items
    await ks.txn([], [Put(LAYOUT.item_key("new"), b"2")])
    assert plan.update(_state(ks), {"new"}) == {"new"}
    assert plan.solved_items - solved == 1
    assert _placements(plan) - before == {(d.item, d.zone, d.suffix) for d in plan.by_item["new"]}
    assert len(plan.by_item["new"]) == 2
    # Its replication changes: it alone is re-solved.
    await ks.txn([], [Put(LAYOUT.item_key("new"), b"3")])
    assert plan.update(_state(ks), {"new"}) == {"new"} and len(plan.by_item["new"]) == 3
    # It goes away: its desired assignments go, nothing else is solved.
    solved = plan.solved_items
    await ks.txn([], [Delete(LAYOUT.item_key("new"))])
    assert plan.update(_state(ks), {"new"}) == {"new"}
    assert plan.solved_items == solved and _placements(plan) == before


async def test_a_member_joining_moves_only_its_fair_share() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    await _assign(ks, plan)
    before = _placements(plan)
    await ks.txn([], [Put(LAYOUT.member_key("b", "new"), b"100")])
    changed = plan.update(_state(ks), set())
    after = _placements(plan)
    moved_in = after - before
    # 600 slots over 11 members: the new one takes about its fair share (55), and little
    # else moves (a solver may trade an equal-cost move for balance).
    to_new = {x for x in moved_in if x[1:] == ("b", "new")}
    assert 50 <= len(to_new) <= 55
    assert len(moved_in) <= len(to_new) + 5
    assert len(before - after) == len(moved_in)
    assert changed == {i for i, _, _ in moved_in}
    assert plan.solved_items < 200 + 100  # Not everything again.
    load = Counter(f"{z}/{s}" for _, z, s in after)
    assert max(load.values()) <= 55  # None beyond its fair share.


async def test_a_member_leaving_moves_only_its_items() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    await _assign(ks, plan)
    before = _placements(plan)
    gone = {(i, z, s) for i, z, s in before if (z, s) == ("a", "m4")}
    await ks.txn([], [Delete(LAYOUT.member_key("a", "m4"))])
    solved = plan.solved_items
    changed = plan.update(_state(ks), set())
    after = _placements(plan)
    assert before - after == gone
    assert len(after - before) == len(gone)  # Each lost replica placed once elsewhere.
    assert changed == {i for i, _, _ in gone}
    assert plan.solved_items - solved == len(gone)
    assert not plan.short
    assert all({d.zone for d in plan.by_item[i]} == {"a", "b"} for i in plan.by_item)


async def test_many_networks_balance_like_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solver, "ITEMS_PER_NETWORK", 30)  # 200 items: 7 networks.
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    load = Counter(f"{d.zone}/{d.suffix}" for d in plan.assignments())
    assert len(plan.assignments()) == 600
    assert max(load.values()) - min(load.values()) <= 1  # 60 each.


async def test_room_freed_by_a_deleted_item_goes_to_a_short_item() -> None:
    """An item short of replicas gets the room another item leaves (deleted, or its
    replication lowered), as a full solve would give it, without a member change."""
    ks = await _cluster({"a/m0": 2}, 3, r=1)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    assert plan.short == {"item-0002"}
    await ks.txn([], [Delete(LAYOUT.item_key("item-0000"))])
    assert plan.update(_state(ks), {"item-0000"}) == {"item-0000", "item-0002"}
    assert not plan.short and len(plan.by_item["item-0002"]) == 1
    # Its replication lowered: the room goes to a short item too.
    await ks.txn([], [Put(LAYOUT.item_key("item-0003"), b"1")])
    plan.update(_state(ks), {"item-0003"})
    assert plan.short == {"item-0003"}
    await ks.txn([], [Put(LAYOUT.item_key("item-0001"), b"0")])
    plan.update(_state(ks), {"item-0001"})
    assert not plan.short and len(plan.by_item["item-0003"]) == 1


async def test_a_short_item_deleted_as_members_appear_is_forgotten() -> None:
    """An item short of every replica (no member had room) and deleted in the change that
    brings the first members is dropped from the plan: it was kept as short, and the next
    member change re-solved it (KeyError: the leader's allocator failed)."""
    ks = await _cluster({}, 1, r=1)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    assert plan.short == {"item-0000"}
    await ks.txn(
        [], [Put(LAYOUT.member_key("a", "m1"), b"1"), Delete(LAYOUT.item_key("item-0000"))]
    )
    plan.update(_state(ks), {"item-0000"})
    assert not plan.short and not plan.replication
    await ks.txn([], [Put(LAYOUT.member_key("a", "m1"), b"2")])
    assert plan.update(_state(ks), set()) == set()


async def test_a_kept_replica_moves_so_that_a_new_item_is_fully_replicated() -> None:
    """A new item that a full solve replicates fully is, even where that moves an
    unchanged item's replica: b/m3 (room for 1) holds item-0; item-1 (replication 2) needs
    b/m3 and b/m2, so item-0 moves to b/m2."""
    ks = await _cluster({"b/m3": 1}, 1, r=1)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    await ks.txn(
        [], [Put(LAYOUT.member_key("b", "m2"), b"2"), Put(LAYOUT.item_key("item-0001"), b"2")]
    )
    plan.update(_state(ks), {"item-0001"})
    assert not plan.short
    assert _placements(plan) == {
        ("item-0000", "b", "m2"),
        ("item-0001", "b", "m2"),
        ("item-0001", "b", "m3"),
    }


_MEMBER_NAMES = [("a", "m0"), ("a", "m1"), ("b", "m2"), ("b", "m3")]
_plan_op = st.one_of(
    st.tuples(st.just("member"), st.sampled_from(_MEMBER_NAMES), st.integers(0, 4)),
    st.tuples(st.just("item"), st.integers(0, 5), st.integers(0, 3)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_plan_op, min_size=1, max_size=3), min_size=1, max_size=10))
def test_incremental_plan_places_as_many_replicas_as_a_full_solve(
    batches: list[list[tuple[str, object, int]]],
) -> None:
    """After any sequence of changes, the plan updated change by change places as many
    replicas as a full solve of the same state (a maximum flow), within member limits and
    never two of an item on one member. Limit 0 deletes a member, replication 0 an item."""

    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        await ks.txn([], [Put(LOCAL, b"0")])
        observed = ObservedState(ks, LAYOUT, TextDecoder(), LOCAL)
        feed = observed.touched_items()
        plan = DesiredPlan()
        plan.update(observed.current, feed.take())
        for batch in batches:
            ops: dict[str, Put | Delete] = {}
            for kind, what, n in batch:
                if kind == "member":
                    zone, suffix = what  # type: ignore[misc]
                    key = LAYOUT.member_key(zone, suffix)
                else:
                    key = LAYOUT.item_key(f"item-{what}")
                ops[key] = Put(key, str(n).encode()) if n else Delete(key)
            await ks.txn([], list(ops.values()))
            state = observed.current
            plan.update(state, feed.take())
            full = solve_desired_assignments(state)
            assert len(plan.assignments()) == len(full)
            load = Counter((d.zone, d.suffix) for d in plan.assignments())
            for i, m in enumerate(state.members):
                assert load.pop((m.zone, m.suffix), 0) <= state.effective_limit(i)
            assert not load  # Nothing on a member that is gone.
            for item_id, group in plan.by_item.items():
                assert item_id in state.item_map
                assert len({(d.zone, d.suffix) for d in group}) == len(group)
                assert len(group) <= state.item_map[item_id].replication

    asyncio.run(run())


def _lone_with_room(state: AllocatorState, plan: list[solver.DesiredAssignment]) -> list[str]:
    """Items with replicas in one zone only while another zone has room."""
    load = Counter((d.zone, d.suffix) for d in plan)
    room: Counter[str] = Counter()
    for i, m in enumerate(state.members):
        room[m.zone] += max(0, state.effective_limit(i) - load[(m.zone, m.suffix)])
    zones: dict[str, set[str]] = {}
    for d in plan:
        zones.setdefault(d.item, set()).add(d.zone)
    return [
        item
        for item, zs in zones.items()
        if len(zs) == 1 and _placed(plan, item) > 1 and any(room[z] for z in room if z not in zs)
    ]


def _placed(plan: list[solver.DesiredAssignment], item: str) -> int:
    return sum(1 for d in plan if d.item == item)


async def test_replicas_spread_across_zones_where_a_sparse_network_could_not() -> None:
    """Zone b's members are small: the few members of b an item's sparse network reached
    filled up, and the item took two replicas in zone a while other members of b had room
    (i13 here). Such items are now re-solved with every member, as short ones were."""
    limits = {"a/a0": 102, "a/a1": 56, "a/a2": 27, "a/a3": 164}
    limits |= {f"b/b{i:02d}": c for i, c in enumerate([1, 1, 3, 1, 1, 2, 2, 3, 1, 2, 1, 1])}
    replication = [2, 3, 3, 3, 2, 3, 2, 3, 2, 2, 2, 2, 2, 3]
    ks = EmbeddedKeyspace(None)
    ops: list[Put | Delete] = []
    for name, limit in limits.items():
        zone, suffix = name.split("/")
        ops.append(Put(LAYOUT.member_key(zone, suffix), str(limit).encode()))
    ops += [Put(LAYOUT.item_key(f"i{i:02d}"), str(r).encode()) for i, r in enumerate(replication)]
    await ks.txn([], ops)
    state = _state(ks)
    plan = solve_desired_assignments(state)
    assert len(plan) == sum(replication)
    assert _lone_with_room(state, plan) == []


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(5, 200), min_size=1, max_size=4),
    st.lists(st.integers(1, 3), min_size=3, max_size=40),
    st.lists(st.sampled_from([2, 2, 3]), min_size=5, max_size=80),
)
def test_no_item_sits_in_one_zone_while_another_has_room(
    a_limits: list[int], b_limits: list[int], replication: list[int]
) -> None:
    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        ops: list[Put | Delete] = [
            Put(LAYOUT.member_key("a", f"a{i}"), str(n).encode()) for i, n in enumerate(a_limits)
        ]
        ops += [
            Put(LAYOUT.member_key("b", f"b{i:02d}"), str(n).encode())
            for i, n in enumerate(b_limits)
        ]
        ops += [
            Put(LAYOUT.item_key(f"i{i:02d}"), str(r).encode()) for i, r in enumerate(replication)
        ]
        await ks.txn([], ops)
        state = _state(ks)
        assert _lone_with_room(state, solve_desired_assignments(state)) == []

    asyncio.run(run())


async def test_an_item_in_one_zone_spreads_when_another_zone_gets_room() -> None:
    """item-1 had both replicas in zone b while zone a was full; then a member of zone a
    came, and a full solve (Gazette re-solves on every change of members) spreads item-1.
    The incremental plan kept it in zone b, for good: no member was beyond its share and no
    item short, so nothing was re-solved."""
    ks = EmbeddedKeyspace(None)
    await ks.txn([], [Put(LOCAL, b"0")])
    observed = ObservedState(ks, LAYOUT, TextDecoder(), LOCAL)
    feed = observed.touched_items()
    plan = DesiredPlan()
    plan.update(observed.current, feed.take())
    for ops in (
        [("a", "m1", 1), ("item-1", 2)],
        [("b", "m2", 1), ("b", "m3", 2), ("item-0", 2)],
        [("a", "m2", 1)],
    ):
        await ks.txn(
            [],
            [
                Put(LAYOUT.member_key(op[0], op[1]), str(op[2]).encode())
                if len(op) == 3
                else Put(LAYOUT.item_key(op[0]), str(op[1]).encode())
                for op in ops
            ],
        )
        plan.update(observed.current, feed.take())
    assert {d.zone for d in plan.by_item["item-1"]} == {"a", "b"}
    assert _lone_with_room(observed.current, plan.assignments()) == []


_ZONED_MEMBERS = [("a", "m0"), ("a", "m1"), ("b", "m2"), ("b", "m3"), ("b", "m4")]
_zoned_op = st.one_of(
    st.tuples(st.just("member"), st.sampled_from(_ZONED_MEMBERS), st.integers(0, 4)),
    st.tuples(st.just("item"), st.integers(0, 7), st.integers(0, 3)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_zoned_op, min_size=1, max_size=3), min_size=1, max_size=10))
def test_the_incremental_plan_leaves_no_item_in_one_zone_while_another_has_room(
    batches: list[list[tuple[str, object, int]]],
) -> None:
    async def run() -> None:
        ks = EmbeddedKeyspace(None)
        await ks.txn([], [Put(LOCAL, b"0")])
        observed = ObservedState(ks, LAYOUT, TextDecoder(), LOCAL)
        feed = observed.touched_items()
        plan = DesiredPlan()
        plan.update(observed.current, feed.take())
        for batch in batches:
            ops: dict[str, Put | Delete] = {}
            for kind, what, n in batch:
                if kind == "member":
                    key = LAYOUT.member_key(*what)  # type: ignore[misc]
                else:
                    key = LAYOUT.item_key(f"item-{what}")
                ops[key] = Put(key, str(n).encode()) if n else Delete(key)
            await ks.txn([], list(ops.values()))
            plan.update(observed.current, feed.take())
            assert _lone_with_room(observed.current, plan.assignments()) == []

    asyncio.run(run())
