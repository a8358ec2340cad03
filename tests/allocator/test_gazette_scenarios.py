"""Gazette's allocator scenarios (allocator/scenarios_test.go), run by pygazette's allocator
loop: the leader converges until idle, then every assignment not yet "consistent" is marked
so (a replica that synchronised), until nothing is left to mark. Where Gazette's outcome is
forced by its rules (removals wait for consistency, a primary is promoted only from kept
replicas, dead assignments go), the keys must be exactly Gazette's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.allocator.state import Assignment, Item
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Compare, Delete, Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder


class _Decoder(TextDecoder):
    """Gazette's test decoder: an assignment is consistent iff its value says so."""

    def is_consistent(self, item: Item, assignment: Assignment, all_: Sequence[Assignment]) -> bool:
        return assignment.kv.value == b"consistent"


def _key(short: str) -> str:
    kind, _, rest = short.partition("/")
    prefix = {"items": LAYOUT.items_prefix, "members": LAYOUT.members_prefix}
    return prefix.get(kind, LAYOUT.assign_prefix) + rest


async def _insert(ks: EmbeddedKeyspace, *pairs: str) -> None:
    for key, value in zip(pairs[::2], pairs[1::2], strict=True):
        result = await ks.txn([Compare(_key(key), 0)], [Put(_key(key), value.encode())])
        assert result.succeeded, key


async def _update(ks: EmbeddedKeyspace, *pairs: str) -> None:
    ops = [Put(_key(k), v.encode()) for k, v in zip(pairs[::2], pairs[1::2], strict=True)]
    await ks.txn([], ops)


def _keys(ks: EmbeddedKeyspace) -> list[str]:
    return [kv.key[len(LAYOUT.assign_prefix) :] for kv in ks.range(LAYOUT.assign_prefix)]


async def _serve_until_idle(ks: EmbeddedKeyspace, when: str = "") -> None:
    """Gazette's serveUntilIdle: lead as the oldest member until idle with nothing (valued
    `when`) left to mark consistent."""
    leader = min(ks.range(LAYOUT.members_prefix), key=lambda kv: (kv.create_revision, kv.key))
    observed = ObservedState(ks, LAYOUT, _Decoder(), leader.key)
    idle = asyncio.Event()

    def on_round(_state: object, is_idle: bool) -> None:
        if is_idle:
            idle.set()

    task = asyncio.create_task(Allocator(ks, observed, on_round=on_round).run())
    try:
        while True:
            await asyncio.wait_for(idle.wait(), 10)
            idle.clear()
            marks = [
                Put(kv.key, b"consistent")
                for kv in ks.range(LAYOUT.assign_prefix)
                if kv.value.decode() == when
            ]
            if not marks:
                return
            await ks.txn([], marks)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        ks._listeners.remove(observed._observe)


_THREE_ITEMS = ("items/item-1", "1", "items/item-2", "2", "items/item-3", "3")


async def test_replace_when_not_consistent() -> None:
    ks = EmbeddedKeyspace(None)
    await _insert(
        ks,
        *_THREE_ITEMS,
        "members/zone-a#member-A", "2",
        "members/zone-b#member-B", "4",
        "members/zone-a#member-old", "0",
        "members/zone-a#member-new", "3",
        "assign/item-1#zone-a#member-A#0", "",
        "assign/item-2#zone-a#member-old#0", "",
        "assign/item-2#zone-b#member-B#1", "",
        "assign/item-3#zone-a#member-A#0", "",
        "assign/item-3#zone-a#member-old#1", "",
        "assign/item-3#zone-b#member-B#2", "",
    )  # fmt: skip
    # Nothing becomes consistent: member-new is added, member-old may not be removed.
    await _serve_until_idle(ks, "no match")
    assert _keys(ks) == [
        "item-1#zone-a#member-A#0",
        "item-2#zone-a#member-new#2",
        "item-2#zone-a#member-old#0",
        "item-2#zone-b#member-B#1",
        "item-3#zone-a#member-A#0",
        "item-3#zone-a#member-new#3",
        "item-3#zone-a#member-old#1",
        "item-3#zone-b#member-B#2",
    ]
    # Once consistent, member-old goes and slots are packed.
    await _serve_until_idle(ks)
    assert _keys(ks) == [
        "item-1#zone-a#member-A#0",
        "item-2#zone-a#member-new#1",
        "item-2#zone-b#member-B#0",
        "item-3#zone-a#member-A#0",
        "item-3#zone-a#member-new#2",
        "item-3#zone-b#member-B#1",
    ]


async def test_replace_when_consistent() -> None:
    ks = EmbeddedKeyspace(None)
    await _insert(
        ks,
        *_THREE_ITEMS,
        "members/zone-a#member-A", "2",
        "members/zone-b#member-B", "4",
        "members/zone-a#member-old", "0",
        "members/zone-a#member-new", "3",
        "assign/item-1#zone-a#member-A#0", "consistent",
        "assign/item-2#zone-a#member-old#0", "consistent",
        "assign/item-2#zone-b#member-B#1", "consistent",
        "assign/item-3#zone-a#member-old#0", "consistent",
        "assign/item-3#zone-a#member-A#1", "consistent",
        "assign/item-3#zone-b#member-B#2", "consistent",
    )  # fmt: skip
    await _serve_until_idle(ks, "no match")
    # member-old (a primary of both) stays until member-new's replicas are consistent.
    assert _keys(ks) == [
        "item-1#zone-a#member-A#0",
        "item-2#zone-a#member-new#2",
        "item-2#zone-a#member-old#0",
        "item-2#zone-b#member-B#1",
        "item-3#zone-a#member-A#1",
        "item-3#zone-a#member-new#3",
        "item-3#zone-a#member-old#0",
        "item-3#zone-b#member-B#2",
    ]
    await _serve_until_idle(ks)
    # Then it goes; member-new is promoted to item-3's primary (one primary per member).
    assert _keys(ks) == [
        "item-1#zone-a#member-A#0",
        "item-2#zone-a#member-new#1",
        "item-2#zone-b#member-B#0",
        "item-3#zone-a#member-A#1",
        "item-3#zone-a#member-new#0",
        "item-3#zone-b#member-B#2",
    ]


async def test_update_desired_replication() -> None:
    ks = EmbeddedKeyspace(None)
    await _insert(
        ks,
        *_THREE_ITEMS,
        "members/zone-a#member-A1", "2",
        "members/zone-a#member-A2", "2",
        "members/zone-b#member-B", "4",
        "assign/item-1#zone-b#member-B#0", "consistent",
        "assign/item-2#zone-a#member-A1#0", "consistent",
        "assign/item-2#zone-b#member-B#1", "consistent",
        "assign/item-3#zone-a#member-A1#0", "consistent",
        "assign/item-3#zone-a#member-A2#1", "consistent",
        "assign/item-3#zone-b#member-B#2", "consistent",
    )  # fmt: skip
    await _serve_until_idle(ks)
    await _update(ks, "items/item-1", "3", "items/item-3", "1")
    await _serve_until_idle(ks, "no match")
    assert _keys(ks) == [
        "item-1#zone-a#member-A1#2",
        "item-1#zone-a#member-A2#1",
        "item-1#zone-b#member-B#0",
        "item-2#zone-a#member-A1#0",
        "item-2#zone-b#member-B#1",
        "item-3#zone-a#member-A2#0",
    ]


async def test_scale_down_to_insufficient_member_slots() -> None:
    ks = EmbeddedKeyspace(None)
    fixture = [
        "item-1#zone-a#member-A3#0",
        "item-2#zone-a#member-A2#0",
        "item-2#zone-a#member-A3#1",
        "item-3#zone-a#member-A1#1",
        "item-3#zone-a#member-A2#2",
        "item-3#zone-a#member-A3#0",
    ]
    await _insert(
        ks,
        *_THREE_ITEMS,
        "members/zone-a#member-A1", "1",
        "members/zone-a#member-A2", "2",
        "members/zone-a#member-A3", "3",
        *(x for key in fixture for x in ("assign/" + key, "consistent")),
    )  # fmt: skip
    await _serve_until_idle(ks, "no match")
    await _update(ks, "members/zone-a#member-A3", "2")
    # Any removal would leave an item below its replication in consistent replicas.
    await _serve_until_idle(ks)
    assert _keys(ks) == fixture


async def test_recovery_on_lease_and_zone_eviction() -> None:
    ks = EmbeddedKeyspace(None)
    await _insert(
        ks,
        *_THREE_ITEMS,
        "members/zone-a#member-A1", "4",
        "members/zone-a#member-A2", "2",
        "members/zone-a#member-A3", "1",
        "members/zone-b#member-B1", "4",
        "assign/item-1#zone-a#member-A1#0", "consistent",
        "assign/item-2#zone-a#member-A2#1", "consistent",
        "assign/item-2#zone-b#member-B1#0", "consistent",
        "assign/item-3#zone-a#member-A1#2", "consistent",
        "assign/item-3#zone-a#member-A3#0", "consistent",
        "assign/item-3#zone-b#member-B1#1", "consistent",
    )  # fmt: skip
    await _serve_until_idle(ks)
    # member-B1's lease expires: its key and assignments go (its whole zone with them).
    for key in (
        "members/zone-b#member-B1",
        "assign/item-2#zone-b#member-B1#0",
        "assign/item-3#zone-b#member-B1#1",
    ):
        await ks.txn([], [Delete(_key(key))])
    await _serve_until_idle(ks)
    assert _keys(ks) == [
        "item-1#zone-a#member-A1#0",
        "item-2#zone-a#member-A1#1",
        "item-2#zone-a#member-A2#0",
        "item-3#zone-a#member-A1#1",
        "item-3#zone-a#member-A2#2",
        "item-3#zone-a#member-A3#0",
    ]


async def test_cleanup_of_assignments_without_member() -> None:
    ks = EmbeddedKeyspace(None)
    await _insert(
        ks,
        "items/item-1", "1",
        "items/item-2", "1",
        "members/zone-a#member-A", "2",
        "assign/item-1#zone-f#member-dead#0", "consistent",
        "assign/item-2#zone-f#member-dead#0", "consistent",
        "assign/item-1#zone-a#member-A#1", "consistent",
    )  # fmt: skip
    await _serve_until_idle(ks, "no match")
    assert _keys(ks) == [
        "item-1#zone-a#member-A#0",  # member-dead's removed, A promoted.
        "item-2#zone-a#member-A#1",
        "item-2#zone-f#member-dead#0",  # Its only consistent replica: it stays.
    ]
    await _serve_until_idle(ks)
    assert _keys(ks) == ["item-1#zone-a#member-A#0", "item-2#zone-a#member-A#0"]


async def test_shed_capacity_leader_exits() -> None:
    ks = EmbeddedKeyspace(None)
    await _insert(
        ks,
        "items/item-1", "1",
        "items/item-2", "1",
        "items/item-3", "1",
        "members/zone-a#member-A1", "4",
        "members/zone-a#member-A2", "4",
        "members/zone-b#member-B1", "4",
    )  # fmt: skip
    await _serve_until_idle(ks)
    await _update(ks, "members/zone-a#member-A1", "4,exiting")
    # The leader drains itself, and its allocator returns.
    observed = ObservedState(ks, LAYOUT, _Decoder(), _key("members/zone-a#member-A1"))

    marking: list[asyncio.Task[object]] = []

    def mark(_state: object, idle: bool) -> None:
        marks = [
            Put(kv.key, b"consistent") for kv in ks.range(LAYOUT.assign_prefix) if not kv.value
        ]
        if idle and marks:
            marking.append(asyncio.get_running_loop().create_task(ks.txn([], marks)))

    await asyncio.wait_for(Allocator(ks, observed, on_round=mark).run(), 10)
    await asyncio.gather(*marking)
    assert len(_keys(ks)) == 3
    assert not any("member-A1" in key for key in _keys(ks))
