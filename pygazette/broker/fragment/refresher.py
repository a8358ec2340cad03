"""Store listings of every replica on an event loop, from a few shared tasks: a replica has
no task or timer of its own, however many a broker serves.

Each replica's fragment index is refreshed from its stores when it starts, every
`refresh_interval` after that (sooner, backing off, after a failed listing), and whenever
it asks (`now`: its assignments changed, a read needs what it hasn't listed). One scheduler
task keeps the due times in a heap; CONCURRENCY workers run the listings, the ones asked
for first. A replica that stops is forgotten at once: the heap holds no reference to it (its
due times there name it by key and generation, and are skipped), and is compacted once
superseded due times outnumber live ones, so a broker whose journals come and go (created,
deleted, moved) holds nothing of those gone, however long their refresh intervals.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import OrderedDict
from typing import Protocol

from pygazette.broker.per_loop import PerLoop

CONCURRENCY = 8


class Listed(Protocol):
    """A replica as the refresher sees it (`replica.Replica`)."""

    name: str

    async def refresh_once(self) -> float:
        """List the stores once; the seconds until the next listing."""
        ...


class _Entry:
    __slots__ = ("again", "gen", "replica", "running", "stopped")

    def __init__(self, replica: Listed) -> None:
        self.replica = replica
        self.gen = 0  # Its due time on the heap, if any, is the one of this generation.
        self.running = False
        self.again = False  # Asked for while its listing ran.
        self.stopped = False


class Refresher:
    def __init__(self, concurrency: int = CONCURRENCY) -> None:
        self._concurrency = concurrency
        self._entries: dict[int, _Entry] = {}
        # (due, generation, key in `_entries`): generations are unique across entries, so a
        # due time left by a superseded schedule or a removed replica matches no entry.
        self._heap: list[tuple[float, int, int]] = []
        self._gens = itertools.count(1)
        self._ready: OrderedDict[int, _Entry] = OrderedDict()
        self._work = asyncio.Event()
        self._reschedule = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.listings = 0

    @staticmethod
    def of_running_loop() -> Refresher:
        """The refresher of the running event loop (made on first use)."""
        return _PER_LOOP.get()

    def _start(self) -> None:
        if self._tasks and not all(t.done() for t in self._tasks):
            return
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"refresher-{i}")
            for i in range(self._concurrency)
        ]
        self._tasks.append(asyncio.create_task(self._scheduler(), name="refresher-schedule"))

    @property
    def replicas(self) -> int:
        return len(self._entries)

    def add(self, replica: Listed) -> None:
        """Start listing `replica`: now, then on its schedule."""
        self._start()
        entry = self._entries.get(id(replica))
        if entry is None or entry.replica is not replica:
            entry = self._entries[id(replica)] = _Entry(replica)
        entry.stopped = False
        self.now(replica)

    def remove(self, replica: Listed) -> None:
        entry = self._entries.pop(id(replica), None)
        if entry is not None and entry.replica is replica:
            entry.stopped = True
            self._ready.pop(id(replica), None)
            if len(self._heap) > 2 * len(self._entries) + 64:
                self._compact()

    def now(self, replica: Listed, *, first: bool = False) -> None:
        """List `replica` soon (`first`: before the others waiting)."""
        entry = self._entries.get(id(replica))
        if entry is None or entry.replica is not replica or entry.stopped:
            return
        if entry.running:
            entry.again = True
            return
        entry.gen = next(self._gens)  # Its scheduled listing is superseded.
        self._ready[id(replica)] = entry
        if first:
            self._ready.move_to_end(id(replica), last=False)
        self._work.set()

    def hurry(self, replica: Listed) -> None:
        """List `replica` before the others waiting, unless its listing is running."""
        entry = self._entries.get(id(replica))
        if entry is not None and entry.replica is replica and not entry.running:
            self.now(replica, first=True)

    def _schedule(self, entry: _Entry, delay: float) -> None:
        entry.gen = next(self._gens)
        due = time.monotonic() + delay
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (due, entry.gen, id(entry.replica)))
        if earliest is None or due < earliest:
            self._reschedule.set()
        if len(self._heap) > 2 * len(self._entries) + 64:
            self._compact()

    def _due(self, gen: int, key: int) -> _Entry | None:
        """The entry a due time on the heap is of, if it is still that entry's schedule."""
        entry = self._entries.get(key)
        return entry if entry is not None and entry.gen == gen else None

    def _compact(self) -> None:
        """Drop the heap's superseded due times (amortised: run once they are most of it)."""
        self._heap = [t for t in self._heap if self._due(t[1], t[2]) is not None]
        heapq.heapify(self._heap)

    @property
    def scheduled(self) -> int:
        """Due times on the heap, superseded ones included."""
        return len(self._heap)

    async def _worker(self) -> None:
        while True:
            while not self._ready:
                self._work.clear()
                await self._work.wait()
            # In a call of its own: a worker waiting for work holds no replica it listed.
            await self._list(self._ready.popitem(last=False)[1])

    async def _list(self, entry: _Entry) -> None:
        if entry.stopped:
            return
        entry.running = True
        try:
            self.listings += 1
            delay = await entry.replica.refresh_once()
        finally:
            entry.running = False
        if entry.stopped:
            return
        if entry.again:
            entry.again = False
            self.now(entry.replica)
        else:
            self._schedule(entry, delay)

    async def _scheduler(self) -> None:
        while True:
            now = time.monotonic()
            while self._heap and self._heap[0][0] <= now:
                _, gen, key = heapq.heappop(self._heap)
                entry = self._due(gen, key)
                if entry is not None and not entry.stopped and not entry.running:
                    self.now(entry.replica)
            self._reschedule.clear()
            wait = self._heap[0][0] - now if self._heap else None
            try:
                async with asyncio.timeout(wait):
                    await self._reschedule.wait()
            except TimeoutError:
                pass


_PER_LOOP: PerLoop[Refresher] = PerLoop(Refresher)
