"""Flush-interval rolls of a single-node broker's journals, from one shared task per event
loop: a journal has no task or timer of its own, however many a broker serves.

A replica whose open spool may need rolling at a time (its next flush boundary, or now:
its codec changed) sets that time here (`set`); one task keeps the times in a heap and, as
each comes, asks the replica (`flush_check`), which starts its roll (a task that lives as
long as the roll) or names the next time to look. A replica without an open spool, or with
no flush interval, has no time here. In cluster mode the pulser's sweep rolls the spools of
journals with traffic instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from typing import Protocol

from pygazette.broker.per_loop import PerLoop

log = logging.getLogger(__name__)


class Flushed(Protocol):
    """A replica as the flush timer sees it (`replica.Replica`)."""

    def flush_check(self, now: float) -> float | None:
        """Start rolling the open spool if it is due at `now` (wall clock); the time of the
        next look, or None (none needed, or the roll sets it once done)."""
        ...


class FlushTimer:
    def __init__(self) -> None:
        # Replicas with a time on the heap, by key: (generation of that time, replica).
        self._entries: dict[int, tuple[int, Flushed]] = {}
        # (wall-clock time, generation, key): generations are unique, so a time that was
        # replaced, or of a replica removed since, matches no entry.
        self._heap: list[tuple[float, int, int]] = []
        self._gens = itertools.count(1)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def of_running_loop() -> FlushTimer:
        """The flush timer of the running event loop (made on first use)."""
        return _PER_LOOP.get()

    @property
    def scheduled(self) -> int:
        """Replicas with a time set."""
        return len(self._entries)

    def set(self, replica: Flushed, when: float | None) -> None:
        """Look at `replica` at `when` (wall clock; None: not at all), instead of any time
        set before."""
        key = id(replica)
        if when is None:
            self.remove(replica)
            return
        gen = next(self._gens)
        self._entries[key] = (gen, replica)
        heapq.heappush(self._heap, (when, gen, key))
        if self._heap[0][1] == gen:
            self._wakeup.set()  # Sooner than the scheduler waits for.
        if len(self._heap) > 2 * len(self._entries) + 64:
            self._heap = [t for t in self._heap if self._current(t[1], t[2])]
            heapq.heapify(self._heap)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="flush-timer")

    def remove(self, replica: Flushed) -> None:
        entry = self._entries.get(id(replica))
        if entry is not None and entry[1] is replica:
            del self._entries[id(replica)]

    def _current(self, gen: int, key: int) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry[0] == gen

    async def _run(self) -> None:
        while True:
            self._fire(time.time())
            self._wakeup.clear()
            delay = self._heap[0][0] - time.time() if self._heap else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if delay is None else max(0.0, delay)):
                    await self._wakeup.wait()

    def _fire(self, now: float) -> None:
        """Look at the replicas whose time has come (a call of its own: the waiting task
        holds none of them)."""
        while self._heap and self._heap[0][0] <= now:
            _, gen, key = heapq.heappop(self._heap)
            if not self._current(gen, key):
                continue
            replica = self._entries.pop(key)[1]
            try:
                when = replica.flush_check(now)
            except Exception:
                log.exception("flush check failed")
                continue
            self.set(replica, when)


_PER_LOOP: PerLoop[FlushTimer] = PerLoop(FlushTimer)
