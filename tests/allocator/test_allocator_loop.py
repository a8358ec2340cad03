"""The allocator's loop: it waits for changes it can see, and never spins on a stale state."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder, _items, _members


async def test_allocator_does_not_spin_when_its_observed_state_missed_a_change(
    tmp_path: Path,
) -> None:
    ks = EmbeddedKeyspace(tmp_path / "keyspace.json")
    await _members(ks, {"a/one": 10})
    await _items(ks, {"item-1": 1})
    observed = ObservedState(ks, LAYOUT, TextDecoder(), LAYOUT.member_key("a", "one"))
    allocator = Allocator(ks, observed)
    task = asyncio.create_task(allocator.run())
    try:
        await ks.wait_until(lambda: bool(ks.range(LAYOUT.assign_prefix)), 10)
        await asyncio.sleep(0.05)  # Let the leader go idle.
        # The observed state's listener fails once (it is logged and skipped), so the state
        # misses a change that needs no allocation work.
        listener = ks._listeners[0]
        failed: list[int] = []

        def flaky(revision: int) -> None:
            if not failed:
                failed.append(revision)
                raise RuntimeError("listener failed")
            listener(revision)

        ks._listeners[0] = flaky
        rounds = allocator.rounds
        await ks.txn([], [Put(LAYOUT.root + "/unrelated", b"x")])
        await asyncio.sleep(0.3)
        assert failed
        assert allocator.rounds - rounds < 5, "the allocator spins on a stale state"
        # And it still acts on later changes.
        await _items(ks, {"item-2": 1})
        await ks.wait_until(lambda: len(ks.range(LAYOUT.assign_prefix)) == 2, 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
