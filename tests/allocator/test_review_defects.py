"""Defects found reviewing the allocator against Gazette's (each test failed before its fix)."""

from __future__ import annotations

import asyncio

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import KeyChanges, KeyValue, Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder, _assignments, _items, _members


async def test_an_undecodable_item_does_not_stall_allocation() -> None:
    """An item whose spec no longer decodes is no item, but its key exists: its assignments
    are not dead, and removing them under the guard 'the item key is absent' failed every
    round, taking the round's transaction (and every item after it) with it."""
    ks = EmbeddedKeyspace(None)
    await _members(ks, {"a/m1": 10, "b/m2": 10})
    await _items(ks, {"a-item": 2})
    observed = ObservedState(ks, LAYOUT, TextDecoder(), LAYOUT.member_key("a", "m1"))
    allocator = Allocator(ks, observed)
    task = asyncio.create_task(allocator.run())
    try:
        await ks.wait_until(lambda: len(_assignments(ks).get("a-item", ())) == 2, 10)
        await ks.txn([], [Put(LAYOUT.item_key("a-item"), b"not-a-number")])
        await _items(ks, {"b-item": 2})
        await ks.wait_until(lambda: len(_assignments(ks).get("b-item", ())) == 2, 10)
        # The undecodable item's assignments are left as they are.
        assert len(_assignments(ks)["a-item"]) == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_foreign_assignment_key_does_not_crash_the_leader() -> None:
    """An assignment key whose item, zone or suffix holds a character at or below '#' (a
    space, say; written by hand or by another tool) can name no item or member of ours:
    it doesn't decode. It parsed, and the leader, removing it as dead, built the guard's item
    key, which raised ValueError: the allocator (and with it the member) failed, then the
    next leader the same way."""
    ks = EmbeddedKeyspace(None)
    await _members(ks, {"a/m1": 10})
    await _items(ks, {"x": 1})
    foreign = [LAYOUT.assign_prefix + k for k in ("bad item#a#m1#0", "y#a z#m1#0", "y#a#m!1#0")]
    await ks.txn([], [Put(k, b"") for k in foreign])
    observed = ObservedState(ks, LAYOUT, TextDecoder(), LAYOUT.member_key("a", "m1"))
    task = asyncio.create_task(Allocator(ks, observed).run())
    try:
        waiting = asyncio.ensure_future(
            ks.wait_until(lambda: bool(ks.range(LAYOUT.item_assignments_prefix("x"))), 10)
        )
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task.exception()
        await waiting
        assert all(ks.get(k) is not None for k in foreign)  # Left alone, as Gazette does.
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_leader_acts_after_a_reload_to_a_lower_revision() -> None:
    """A keyspace reloaded from a store behind it (etcd replaced or restored) goes back to a
    lower revision. The leader waited for its state to pass the revision after its last
    round's, which the store would reach only after as many changes again: it stalled."""
    ks = EmbeddedKeyspace(None)
    await _members(ks, {"a/m1": 10})
    await _items(ks, {"x": 1})
    for i in range(30):
        await ks.txn([], [Put(LAYOUT.root + f"/filler-{i}", b"")])
    observed = ObservedState(ks, LAYOUT, TextDecoder(), LAYOUT.member_key("a", "m1"))
    task = asyncio.create_task(Allocator(ks, observed).run())
    try:
        await ks.wait_until(lambda: bool(ks.range(LAYOUT.item_assignments_prefix("x"))), 10)
        # The store is replaced by one at a low revision holding the member alone.
        member = ks.get(LAYOUT.member_key("a", "m1"))
        assert member is not None
        prior = ks.revision
        ks._kvs = {member.key: KeyValue(member.key, member.value, 2, 2)}
        ks._revision = 2
        await ks._notify(KeyChanges(prior, 2, reset=True))
        await _items(ks, {"y": 1})
        waiting = asyncio.ensure_future(
            ks.wait_until(lambda: bool(ks.range(LAYOUT.item_assignments_prefix("y"))), 5)
        )
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task.exception()
        await waiting
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
