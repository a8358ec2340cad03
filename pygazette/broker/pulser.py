"""Pulses of the journals this broker is primary of, from a few shared tasks: no task, timer
or stream per journal.

A pulse is an empty append a primary runs on its own (Gazette's `pulseDaemon`): it opens
the replication pipeline, brings the replicas' spools in line and writes the route into the
journal's assignments, which is what tells the allocator the journal is consistent. Gazette
pulses each journal when its route changes and then every minute; at thousands of journals
that periodic pulse of every journal is most of what an idle cluster does. Here a journal is
pulsed:

- when its assignments change while this broker is its primary (`request`);
- again, RETRY_SECONDS later, when a pulse failed (e.g. a peer hasn't started its replica),
  or its write of the route into the assignments did (that write is not awaited: see
  `append_fsm.ClusterAppends._advertise_later`); a pulse that fails again waits twice as
  long each time, up to MAX_RETRY_SECONDS (Gazette's pulse interval), until it succeeds or
  the journal's assignments change: a journal that can't take appends until an operator
  acts (INDEX_HAS_GREATER_OFFSET: every broker of its last appends was lost) or whose
  store can't be listed costs a pulse a minute, not one a second;
- when its open spool holds content from an earlier flush interval (found by the sweep), so
  an idle journal's last appends still persist on time.

Pulses run CONCURRENCY at a time, by a fixed set of workers, from one queue. The sweep
(every SWEEP_SECONDS) also closes replication pipelines left idle for PIPELINE_IDLE_SECONDS,
which ends their Replicate streams on the peers: a journal without traffic holds no streams.

The sweep walks only the *active* journals: those that opened a replication pipeline (an
append or a pulse did: `opened`), until their pipeline closed and their open spool has
nothing left to flush. So its cost grows with the journals that had traffic, not with
every journal this broker leads.

With auto-suspension (`serve --auto-suspend`, Gazette's `--broker.auto-suspend`), a journal
that goes idle that way is asked to suspend itself once it has been idle for
AUTO_SUSPEND_IDLE_SECONDS (Gazette: fifteen one-minute pulses): an empty append with
SUSPEND_IF_FLUSHED, which suspends it only if its content is persisted and its newest
fragment is older than its flush interval (a day, without one). When it isn't yet, it is
asked again when it would be. One heap of due times, not a timer per journal; an append
takes the journal off it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from pygazette.broker.journal_runtime import JournalRuntime
from pygazette.broker.replicated_spool import due_to_roll
from pygazette.protocol.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)

CONCURRENCY = 8
RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0
SWEEP_SECONDS = 10.0
PIPELINE_IDLE_SECONDS = 60.0
AUTO_SUSPEND_IDLE_SECONDS = 15 * 60.0


class Pulsed(JournalRuntime, Protocol):
    """A journal as the pulser sees it (`replica.Replica`)."""

    spec: pb.JournalSpec


class Pulser:
    def __init__(
        self,
        pulse: Callable[[Pulsed], Awaitable[bool]],
        *,
        concurrency: int = CONCURRENCY,
        suspend: Callable[[Pulsed], Awaitable[float | None]] | None = None,
    ) -> None:
        # `pulse` returns whether the journal is done with (False: retry it).
        self._pulse = pulse
        # With auto-suspension: asks an idle journal to suspend itself; returns in how many
        # seconds to ask again (None: not again).
        self._suspend = suspend
        self._suspend_heap: list[tuple[float, int, str]] = []  # (due, seq, journal)
        self._idle: dict[str, tuple[int, Pulsed]] = {}  # Journals on the heap, by its seq.
        # Each journal's newest entry on the heap, (due, seq), until it is popped: a journal
        # going idle again at the same due time (its last answer's) takes it again.
        self._queued: dict[str, tuple[float, int]] = {}
        # Monotonic times before which asking a journal again is of no use (its last answer).
        self._not_before: dict[str, float] = {}
        self._suspend_seq = 0
        self.suspension_checks = 0  # Suspensions asked for (for tests and metrics).
        self._suspender: asyncio.Task[None] | None = None
        self._concurrency = concurrency
        self._active: dict[str, Pulsed] = {}  # Journals the sweep watches (see `opened`).
        self._pending: dict[str, Pulsed] = {}  # In request order.
        self._retry: dict[str, tuple[float, Pulsed]] = {}
        self._failures: dict[str, int] = {}  # Pulses failed in a row, by journal.
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.pulses = 0  # Pulses run (for tests and metrics).
        self.pipelines_closed = 0

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"pulser-{i}")
            for i in range(self._concurrency)
        ]
        self._tasks.append(asyncio.create_task(self._sweep_loop(), name="pulser-sweep"))

    async def stop(self) -> None:
        if self._suspender is not None:
            self._tasks.append(self._suspender)
            self._suspender = None
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._tasks = []

    def request(self, journal: Pulsed) -> None:
        """Pulse `journal` soon (once, however often it is asked before its turn): its
        assignments changed, so a pulse that kept failing may succeed now."""
        self._failures.pop(journal.name, None)
        self._enqueue(journal)

    def _enqueue(self, journal: Pulsed) -> None:
        self._retry.pop(journal.name, None)
        self._pending[journal.name] = journal
        self._ready.set()

    def retry(self, journal: Pulsed) -> None:
        """Pulse `journal` again RETRY_SECONDS from now (unless it is due sooner)."""
        if journal.name in self._pending or not journal.primary or journal.stopping:
            return
        self._retry.setdefault(journal.name, (time.monotonic() + RETRY_SECONDS, journal))

    def opened(self, journal: Pulsed) -> None:
        """`journal` opened a replication pipeline: sweeps watch it until it is idle again
        (its pipeline closed, nothing in its open spool left to flush)."""
        self._active[journal.name] = journal
        self._idle.pop(journal.name, None)  # In use: not to be suspended.

    def _went_idle(self, journal: Pulsed) -> None:
        """With auto-suspension: ask `journal` to suspend itself once it has been idle for
        AUTO_SUSPEND_IDLE_SECONDS (and not before its last answer said it could be), unless
        it is used again meanwhile."""
        if self._suspend is None:
            return
        name = journal.name
        now = time.monotonic()
        due = max(now + AUTO_SUSPEND_IDLE_SECONDS, self._not_before.get(name, 0.0))
        queued = self._queued.get(name)
        if queued is not None and queued[0] == due:
            # Used (and idle again) since it was queued for then: not queued once per use.
            seq = queued[1]
        else:
            self._suspend_seq += 1
            seq = self._suspend_seq
            heapq.heappush(self._suspend_heap, (due, seq, name))
            self._queued[name] = (due, seq)
        self._idle[name] = (seq, journal)

    def _due_suspensions(self, now: float) -> list[Pulsed]:
        due: list[Pulsed] = []
        heap = self._suspend_heap
        while heap and heap[0][0] <= now:
            _, seq, name = heapq.heappop(heap)
            if self._queued.get(name, (0.0, -1))[1] == seq:
                del self._queued[name]
            entry = self._idle.get(name)
            if entry is None or entry[0] != seq:
                continue  # Used again since, or scheduled anew.
            del self._idle[name]
            journal = entry[1]
            if journal.primary and not journal.stopping and name not in self._active:
                due.append(journal)
            elif not journal.primary or journal.stopping:
                self._not_before.pop(name, None)
        return due

    async def _suspend_idle(self, journals: list[Pulsed]) -> None:
        assert self._suspend is not None
        for journal in journals:
            if not journal.primary or journal.stopping:
                self._not_before.pop(journal.name, None)
                continue
            if journal.name in self._active:
                continue
            self.suspension_checks += 1
            try:
                again = await self._suspend(journal)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info(
                    "journal auto-suspension failed (will retry)",
                    extra={"journal": journal.name, "error": str(exc)},
                )
                again = AUTO_SUSPEND_IDLE_SECONDS
            if again is None:
                self._not_before.pop(journal.name, None)
                continue
            # Its check opened a pipeline (the journal is active until that closes, idle),
            # so it comes back through `_went_idle`: not before it could suspend.
            self._not_before[journal.name] = time.monotonic() + again
            if journal.name not in self._active:
                self._went_idle(journal)

    @property
    def queued(self) -> int:
        return len(self._pending) + len(self._retry)

    @property
    def active(self) -> frozenset[str]:
        """The journals sweeps watch now."""
        return frozenset(self._active)

    async def _worker(self) -> None:
        while True:
            while not self._pending:
                self._ready.clear()
                await self._ready.wait()
            # In a call of its own: a worker waiting for work holds no journal it pulsed
            # (a deleted journal's replica would stay referenced until its next pulse).
            await self._pulse_next()

    async def _pulse_next(self) -> None:
        name = next(iter(self._pending))
        journal = self._pending.pop(name)
        if not journal.primary or journal.stopping:
            self._failures.pop(name, None)
            return
        self.pulses += 1
        try:
            done = await self._pulse(journal)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info(
                "journal pulse failed (will retry)", extra={"journal": name, "error": str(exc)}
            )
            done = False
        if done or not journal.primary or journal.stopping:
            self._failures.pop(name, None)
            return
        failures = self._failures.get(name, 0)
        self._failures[name] = failures + 1
        delay = min(RETRY_SECONDS * 2 ** min(failures, 16), MAX_RETRY_SECONDS)
        self._retry.setdefault(name, (time.monotonic() + delay, journal))

    async def _sweep_loop(self) -> None:
        next_sweep = time.monotonic() + SWEEP_SECONDS
        while True:
            await asyncio.sleep(RETRY_SECONDS)
            now = time.monotonic()
            for name, (due, journal) in list(self._retry.items()):
                if due <= now:
                    del self._retry[name]
                    if name not in self._pending:
                        self._pending[name] = journal
                        self._ready.set()
            if now >= next_sweep:
                next_sweep = now + SWEEP_SECONDS
                try:
                    await self.sweep()
                except Exception as exc:
                    log.warning("pulse sweep failed", extra={"error": str(exc)})
            heap = self._suspend_heap
            if heap and heap[0][0] <= now and (self._suspender is None or self._suspender.done()):
                # Off the loop that retries pulses: a suspension may wait on the allocator.
                self._suspender = asyncio.create_task(
                    self._suspend_idle(self._due_suspensions(now)), name="pulser-suspend"
                )

    async def sweep(self) -> None:
        """Of the active journals: pulse those whose spool is due to roll, close pipelines
        left idle, and let go of those with neither a pipeline nor content to flush."""
        wall = time.time()
        idle: list[Pulsed] = []
        for name, journal in list(self._active.items()):
            if not journal.primary or journal.stopping:
                del self._active[name]  # Becoming primary again pulses it, which re-adds it.
                self._not_before.pop(name, None)  # Its last answer is of no more use.
                continue
            if flush_due(journal, wall):
                self._enqueue(journal)  # (A pulse failing meanwhile keeps backing off.)
            pln = journal.replication
            if pln is None:
                if not flush_pending(journal):
                    del self._active[name]
                    self._went_idle(journal)
            elif pln.idle_seconds() > PIPELINE_IDLE_SECONDS:
                idle.append(journal)
        for journal in idle:
            await self._close_idle(journal)

    async def _close_idle(self, journal: Pulsed) -> None:
        if journal.pipeline.locked():
            return  # An append (or pulse) is using it.
        async with journal.pipeline:
            pln = journal.replication
            if pln is None or pln.idle_seconds() <= PIPELINE_IDLE_SECONDS or journal.stopping:
                return
            with contextlib.suppress(Exception):
                await journal.close_replication()
            self.pipelines_closed += 1


def flush_pending(journal: Pulsed) -> bool:
    """Whether the journal's open spool holds content a flush interval will roll."""
    rs = journal.rspool
    return rs is not None and rs.end > rs.begin and journal.spec.fragment.flush_interval.seconds > 0


def flush_due(journal: Pulsed, now: float) -> bool:
    """Whether the journal's open spool holds content from an earlier flush interval (or
    more than its length): without building its fragment, as sweeps ask it of every active
    journal."""
    rs = journal.rspool
    spec = journal.spec.fragment
    if rs is None or spec.flush_interval.seconds <= 0 or rs.end <= rs.begin:
        return False
    return due_to_roll(rs.end - rs.begin, rs.first_append_time, spec, now)
