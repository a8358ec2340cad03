"""The shared refresher (`broker.fragment.refresher`): what it holds of replicas gone."""

from __future__ import annotations

import asyncio
import gc
import weakref

from pygazette.broker.fragment.refresher import Refresher

LISTED_EVERY = 300.0


class _Replica:
    def __init__(self, name: str) -> None:
        self.name = name
        self.listings = 0

    async def refresh_once(self) -> float:
        self.listings += 1
        return LISTED_EVERY


async def _until(condition: object) -> None:
    for _ in range(10_000):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def _churn(refresher: Refresher, round_: int, n: int) -> list[weakref.ref[_Replica]]:
    """`n` replicas added, listed once (and so scheduled again), then removed."""
    replicas = [_Replica(f"churn/{round_}/{i}") for i in range(n)]
    for replica in replicas:
        refresher.add(replica)
    await _until(lambda: all(r.listings for r in replicas) and refresher.scheduled >= n)
    for replica in replicas:
        refresher.remove(replica)
    return [weakref.ref(r) for r in replicas]


async def test_replicas_removed_are_not_held_until_their_next_listing() -> None:
    # A broker whose journals come and go (created and deleted per run, or moved): the
    # heap of due times held each stopped replica (and its fragment index, spools and
    # spec) until its next listing was due, a refresh interval later (5 minutes by
    # default, up to a day), and held a due time of every listing in that window: in a
    # three-broker cluster, three rounds of 300 journals deleted and re-created left each
    # broker holding 800 replicas, 600 of them stopped, and 1,600 due times.
    refresher = Refresher()
    try:
        for round_ in range(3):
            gone = await _churn(refresher, round_, 200)
            gc.collect()
            assert [r for r in gone if r() is not None] == []
            assert refresher.replicas == 0
            assert refresher.scheduled <= 64
    finally:
        for task in refresher._tasks:
            task.cancel()
        await asyncio.gather(*refresher._tasks, return_exceptions=True)


async def test_a_replica_added_again_is_listed_on_its_own_schedule() -> None:
    # Due times of a removed replica never fire for a new one of the same journal (or one
    # that reuses its memory, and so its key): it is listed when added, then every interval.
    refresher = Refresher()
    try:
        first = _Replica("a/j")
        refresher.add(first)
        await _until(lambda: first.listings == 1 and refresher.scheduled == 1)
        refresher.remove(first)
        second = _Replica("a/j")
        refresher.add(second)
        await _until(lambda: second.listings == 1)
        refresher.now(second)
        await _until(lambda: second.listings == 2)
        assert first.listings == 1
        assert refresher.replicas == 1
    finally:
        for task in refresher._tasks:
            task.cancel()
        await asyncio.gather(*refresher._tasks, return_exceptions=True)
