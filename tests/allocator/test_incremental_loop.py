"""The leader's incremental loop reaches the same kind of allocation a full solve does:
every item fully replicated across zones, slots packed, limits kept, through members
joining, leaving and exiting, and items coming and going."""

from __future__ import annotations

import asyncio
from collections import Counter

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.allocator.state import AllocatorState
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder

LEADER = LAYOUT.member_key("a", "leader")


def _settled(ks: EmbeddedKeyspace, items: dict[str, int], limits: dict[str, int]) -> bool:
    groups: dict[str, list[tuple[str, str, int]]] = {}
    for kv in ks.range(LAYOUT.assign_prefix):
        a = LAYOUT.parse_assignment_key(kv.key)
        groups.setdefault(a.item, []).append((a.zone, a.suffix, a.slot))
    if set(groups) != {i for i, r in items.items() if r > 0}:
        return False
    load: Counter[str] = Counter()
    for item, group in groups.items():
        if len(group) != items[item] or sorted(s for _, _, s in group) != list(range(len(group))):
            return False
        if items[item] > 1 and len({z for z, _, _ in group}) < 2:
            return False
        load.update(f"{z}/{s}" for z, s, _ in group)
    return all(n <= limits.get(m, 0) for m, n in load.items())


async def test_incremental_loop_settles_through_membership_changes() -> None:
    ks = EmbeddedKeyspace(None)
    limits = {"a/leader": 1} | {f"{'ab'[i % 2]}/m{i}": 40 for i in range(6)}
    for name, limit in limits.items():
        zone, suffix = name.split("/")
        await ks.txn([], [Put(LAYOUT.member_key(zone, suffix), str(limit).encode())])
    items = {f"item-{i:03d}": 2 + i % 2 for i in range(60)}  # 150 slots.
    await ks.txn([], [Put(LAYOUT.item_key(i), str(r).encode()) for i, r in items.items()])
    observed = ObservedState(ks, LAYOUT, TextDecoder(), LEADER)
    states: list[AllocatorState] = []
    allocator = Allocator(ks, observed, on_round=lambda s, _idle: states.append(s))
    task = asyncio.create_task(allocator.run())

    async def settle(what: str) -> None:
        try:
            await ks.wait_until(lambda: _settled(ks, items, limits), 30)
        except TimeoutError:
            raise AssertionError(f"not settled after {what}") from None

    try:
        await settle("start")
        # A member joins: it gets items, and not everything moves.
        before = {kv.key.rsplit("#", 1)[0] for kv in ks.range(LAYOUT.assign_prefix)}
        limits["b/m6"] = 40
        await ks.txn([], [Put(LAYOUT.member_key("b", "m6"), b"40")])
        await ks.wait_until(
            lambda: any("#b#m6#" in kv.key for kv in ks.range(LAYOUT.assign_prefix)), 30
        )
        await settle("a join")
        after = {kv.key.rsplit("#", 1)[0] for kv in ks.range(LAYOUT.assign_prefix)}
        assert len(after - before) <= 30  # About the new member's share of 150 slots.
        # A member leaves (its key and assignments go, as when its lease expires).
        del limits["a/m0"]
        await ks.txn(
            [],
            [Delete(LAYOUT.member_key("a", "m0"))]
            + [Delete(kv.key) for kv in ks.range(LAYOUT.assign_prefix) if "#a#m0#" in kv.key],
        )
        await settle("a leave")
        # A member exits: it sheds its items.
        await ks.txn([], [Put(LAYOUT.member_key("b", "m1"), b"40,exiting")])
        await ks.wait_until(
            lambda: not any("#b#m1#" in kv.key for kv in ks.range(LAYOUT.assign_prefix)), 30
        )
        await settle("an exit")
        # Items change: one goes, one grows, one comes.
        del items["item-000"]
        items["item-001"] = 3
        items["new"] = 2
        await ks.txn(
            [],
            [
                Delete(LAYOUT.item_key("item-000")),
                Put(LAYOUT.item_key("item-001"), b"3"),
                Put(LAYOUT.item_key("new"), b"2"),
            ],
        )
        await settle("item changes")
        assert allocator.adds > 0 and allocator.removes > 0
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
