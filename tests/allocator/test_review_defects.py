"""Defects found reviewing the allocator against Gazette's (each test failed before its fix)."""

from __future__ import annotations

import asyncio

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Put
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
