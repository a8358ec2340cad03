"""The allocator's solver and convergence, on a real (embedded) keyspace.

Items and members here use a small text encoding of their own (the allocator is generic):
an item's value is its replication, a member's is its limit (and ",exiting"). Every
assignment counts as consistent, as if replicas synchronised instantly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from pygazette.allocator.converge import BatchedTxn, converge, unchanged
from pygazette.allocator.solver import solve_desired_assignments
from pygazette.allocator.state import AllocatorState, Assignment, Item
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, KeyValue, Put
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout

LAYOUT = KeyLayout()


class TextDecoder:
    def __init__(self, consistent: bool = True) -> None:
        self.consistent = consistent

    def item_replication(self, item_id: str, kv: KeyValue) -> int:
        try:
            return int(kv.value)
        except ValueError as exc:
            raise KeyDecodeError(str(exc)) from exc

    def member_limit(self, zone: str, suffix: str, kv: KeyValue) -> tuple[int, bool]:
        limit, _, flag = kv.value.decode().partition(",")
        return int(limit), flag == "exiting"

    def is_consistent(self, item: Item, assignment: Assignment, all_: Sequence[Assignment]) -> bool:
        return self.consistent


async def _put(ks: EmbeddedKeyspace, *pairs: tuple[str, str]) -> None:
    await ks.txn([], [Put(k, v.encode()) for k, v in pairs])


async def _members(ks: EmbeddedKeyspace, members: dict[str, int]) -> None:
    for name, limit in members.items():  # One transaction each: distinct create revisions.
        zone, suffix = name.split("/")
        await _put(ks, (LAYOUT.member_key(zone, suffix), str(limit)))


async def _items(ks: EmbeddedKeyspace, items: dict[str, int]) -> None:
    await _put(ks, *((LAYOUT.item_key(i), str(r)) for i, r in items.items()))


def _state(ks: EmbeddedKeyspace, local: str, decoder: TextDecoder | None = None) -> AllocatorState:
    zone, suffix = local.split("/")
    return AllocatorState.extract(
        ks, LAYOUT, decoder or TextDecoder(), LAYOUT.member_key(zone, suffix)
    )


async def _converge_until_idle(ks: EmbeddedKeyspace, local: str, rounds: int = 50) -> int:
    """Run leader rounds until one changes nothing; the number of rounds that did."""
    desired = solve_desired_assignments(_state(ks, local))
    last_hash = _state(ks, local).network_hash
    for n in range(rounds):
        state = _state(ks, local)
        if state.network_hash != last_hash:
            desired = solve_desired_assignments(state)
            last_hash = state.network_hash
        txn = BatchedTxn(ks, [unchanged(state.members[state.local_member].kv)])
        await converge(state, desired, txn)
        await txn.flush()
        if txn.revision == 0:
            return n
    raise AssertionError("allocation did not converge")


def _assignments(ks: EmbeddedKeyspace) -> dict[str, list[tuple[str, str, int]]]:
    out: dict[str, list[tuple[str, str, int]]] = {}
    for kv in ks.range(LAYOUT.assign_prefix):
        a = LAYOUT.parse_assignment_key(kv.key)
        out.setdefault(a.item, []).append((a.zone, a.suffix, a.slot))
    return out


def _check_invariants(ks: EmbeddedKeyspace, items: dict[str, int], members: dict[str, int]) -> None:
    assigned = _assignments(ks)
    load: Counter[str] = Counter()
    for item, group in assigned.items():
        slots = sorted(slot for _, _, slot in group)
        assert slots == list(range(len(group))), f"{item}: slots {slots} not packed"
        assert len({(z, s) for z, s, _ in group}) == len(group)
        for z, s, _ in group:
            load[f"{z}/{s}"] += 1
    for m, n in load.items():
        assert n <= members[m], f"{m} holds {n} > limit {members[m]}"


@pytest.fixture
def ks(tmp_path: Path) -> EmbeddedKeyspace:
    return EmbeddedKeyspace(tmp_path / "keyspace.json")


async def test_replicas_span_zones_and_balance(ks: EmbeddedKeyspace) -> None:
    members = {"a/m1": 100, "a/m2": 100, "b/m3": 100, "b/m4": 100}
    items = {f"item-{i:02d}": 3 for i in range(20)}
    await _members(ks, members)
    await _items(ks, items)
    await _converge_until_idle(ks, "a/m1")
    _check_invariants(ks, items, members)
    assigned = _assignments(ks)
    assert all(len(assigned[i]) == 3 for i in items)
    assert all({z for z, _, _ in assigned[i]} == {"a", "b"} for i in items)
    load = Counter(f"{z}/{s}" for g in assigned.values() for z, s, _ in g)
    assert max(load.values()) - min(load.values()) <= 1  # 60 slots over 4 members: 15 each.
    primaries = Counter(f"{z}/{s}" for g in assigned.values() for z, s, slot in g if slot == 0)
    assert sum(primaries.values()) == len(items)
    assert max(primaries.values()) <= 8


async def test_limits_and_insufficient_capacity(ks: EmbeddedKeyspace) -> None:
    members = {"a/m1": 2, "b/m2": 2}
    items = {"x": 2, "y": 2, "z": 2}
    await _members(ks, members)
    await _items(ks, items)
    await _converge_until_idle(ks, "a/m1")
    _check_invariants(ks, items, members)
    assert sum(len(g) for g in _assignments(ks).values()) == 4  # All the capacity there is.


async def test_one_zone_when_that_is_the_only_way(ks: EmbeddedKeyspace) -> None:
    members = {"a/m1": 10, "a/m2": 10, "a/m3": 10}
    await _members(ks, members)
    await _items(ks, {"x": 3})
    await _converge_until_idle(ks, "a/m1")
    assert len(_assignments(ks)["x"]) == 3


async def test_scale_out_moves_little_and_rebalances(ks: EmbeddedKeyspace) -> None:
    members = {"a/m1": 100, "b/m2": 100, "a/m3": 100}
    items = {f"item-{i:02d}": 3 for i in range(12)}
    await _members(ks, members)
    await _items(ks, items)
    await _converge_until_idle(ks, "a/m1")
    before = {(i, z, s) for i, g in _assignments(ks).items() for z, s, _ in g}

    members["b/m4"] = 100
    await _members(ks, {"b/m4": 100})
    await _converge_until_idle(ks, "a/m1")
    _check_invariants(ks, items, members)
    after = {(i, z, s) for i, g in _assignments(ks).items() for z, s, _ in g}
    load = Counter(f"{z}/{s}" for _, z, s in after)
    assert load["b/m4"] == 9  # Its fair share of 36 slots over 4 members.
    assert len(after - before) == 9  # Exactly the moves the new member needed, no more.

    # Scale back in: m4 leaves (its key expires); everything returns to the other three.
    await ks.txn([], [Delete(LAYOUT.member_key("b", "m4"))])
    await ks.txn(
        [], [Delete(kv.key) for kv in ks.range(LAYOUT.assign_prefix) if "#b#m4#" in kv.key]
    )
    await _converge_until_idle(ks, "a/m1")
    assert all(len(g) == 3 for g in _assignments(ks).values())


async def test_exiting_member_sheds_its_items(ks: EmbeddedKeyspace) -> None:
    members = {"a/m1": 10, "b/m2": 10, "a/m3": 10, "b/m4": 10}
    items = {"x": 3, "y": 3}
    await _members(ks, members)
    await _items(ks, items)
    await _converge_until_idle(ks, "a/m1")
    holder = next(f"{z}/{s}" for z, s, _ in _assignments(ks)["x"] if f"{z}/{s}" != "a/m1")
    zone, suffix = holder.split("/")
    await _put(ks, (LAYOUT.member_key(zone, suffix), "10,exiting"))
    await _converge_until_idle(ks, "a/m1")
    assert all(holder not in {f"{z}/{s}" for z, s, _ in g} for g in _assignments(ks).values())
    assert all(len(g) == 3 for g in _assignments(ks).values())
    state = _state(ks, holder)
    assert state.should_exit()


async def test_removals_wait_for_consistency(ks: EmbeddedKeyspace) -> None:
    members = {"a/m1": 10, "b/m2": 10, "a/m3": 10}
    await _members(ks, members)
    await _items(ks, {"x": 2})
    await _converge_until_idle(ks, "a/m1")
    # Replication drops to 1, but no replica is consistent: nothing may be removed.
    await _put(ks, (LAYOUT.item_key("x"), "1"))
    state = _state(ks, "a/m1", TextDecoder(consistent=False))
    txn = BatchedTxn(ks, [])
    await converge(state, solve_desired_assignments(state), txn)
    await txn.flush()
    assert len(_assignments(ks)["x"]) == 2
    # Once consistent, one goes.
    await _converge_until_idle(ks, "a/m1")
    assert len(_assignments(ks)["x"]) == 1


async def test_leader_is_the_oldest_member(ks: EmbeddedKeyspace) -> None:
    await _members(ks, {"b/m2": 1, "a/m1": 1})
    assert _state(ks, "b/m2").is_leader()
    assert not _state(ks, "a/m1").is_leader()
    await ks.txn([], [Delete(LAYOUT.member_key("b", "m2"))])
    assert _state(ks, "a/m1").is_leader()


async def test_dead_assignments_are_removed(ks: EmbeddedKeyspace) -> None:
    await _members(ks, {"a/m1": 10, "b/m2": 10})
    await _items(ks, {"x": 2})
    await _converge_until_idle(ks, "a/m1")
    await ks.txn([], [Delete(LAYOUT.item_key("x"))])
    await _converge_until_idle(ks, "a/m1")
    assert _assignments(ks) == {}


async def test_undecodable_keys_are_skipped(ks: EmbeddedKeyspace) -> None:
    await _members(ks, {"a/m1": 10})
    await _put(ks, (LAYOUT.item_key("bad"), "not-a-number"), (LAYOUT.items_prefix + "x#y", "1"))
    await _items(ks, {"good": 1})
    state = _state(ks, "a/m1")
    assert [i.id for i in state.items] == ["good"]
