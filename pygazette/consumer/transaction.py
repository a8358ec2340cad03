"""Consumer transactions of a primary shard: consume, finalize, commit, acknowledge.

A transaction begins with the first ready batch of source messages and consumes batches
until it may close: once `min_txn_duration` has passed, no batch is ready and the previous
transaction has fully committed (its store commit and its ACK appends); or at once when
`max_txn_duration` has passed, waiting for a batch or between two messages of one, as
Gazette's txnStep checks its timer before each message (the rest of the batch goes to the
next transaction, `source_reader.checkpoint_within`; it then stalls until the previous one
is done: a transaction never commits before its predecessor). Meanwhile the previous
transaction's commit runs, so consuming and committing overlap (pipelining).

Wait-for-ACK (Gazette's, unless the spec's `disable_wait_for_ack`): while a producer's
transaction that began (in a source journal) since the last commit still awaits its ACK,
the transaction stays open past `min_txn_duration`, up to `max_txn_duration`, so that the
acknowledged messages are consumed in it rather than in the next one. (With message cycles
between shards, a transaction could wait on its own outputs' ACK: disable it then.)

Closing: the application's `finalize_txn`; a Checkpoint of the source offsets and producer
states of the batches consumed, and of the publisher's ACK intents; then
`store.start_commit(checkpoint, wait_for=every pending append)`, so the checkpoint commits
only after the transaction's outputs (and the previous transaction's ACKs) are durable.
The ACKs are queued on the shard's AppendService to run only once the commit succeeded. A
crash before the commit leaves outputs unacknowledged (readers never see them) and inputs
unconsumed (the next primary re-reads them); a crash after it leaves ACK intents in the
checkpoint, which the next primary appends again first (`acknowledge_recovered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from pygazette.client.append_service import AppendService, AsyncAppend, OpFuture
from pygazette.consumer.application import Application, maybe_await
from pygazette.consumer.checkpoint import (
    build_checkpoint,
    checkpoint_ack_intents,
    checkpoint_sources,
)
from pygazette.consumer.metrics import TXN_SECONDS
from pygazette.consumer.progress import Progress
from pygazette.consumer.shard_api import Shard
from pygazette.consumer.source_reader import SourceBatch, SourceReaders, checkpoint_within
from pygazette.consumer.store import CommitFuture, Store, StoreFenced
from pygazette.message.envelope import ProducerState
from pygazette.message.publisher import Publisher
from pygazette.message.uuid import ACK_TXN
from pygazette.protocol.errors import JournalNotFound
from pygazette.protocol.pb import consumer_pb2 as cpb

log = logging.getLogger(__name__)

__all__ = ["LeaseLost", "Transactions"]


class LeaseLost(StoreFenced):
    """The consumer's lease may have expired: it must not commit (another may be primary)."""


class _Committed:
    """A transaction handed to the store: its commit, its ACK appends and what it read."""

    def __init__(
        self,
        commit: CommitFuture | None,
        acks: list[AsyncAppend],
        read_through: dict[str, int],
        messages: int = 0,
        nbytes: int = 0,
        service: AppendService | None = None,
    ) -> None:
        self.commit = commit
        self.acks = acks
        self.service = service  # Of recovered ACK intents (`commit` None): see `wait`.
        self.read_through = read_through
        self.messages = messages
        self.nbytes = nbytes
        self.completed = False  # Its progress has been published.
        self._waiter: asyncio.Task[dict[str, int]] | None = None

    def waiter(self) -> asyncio.Task[dict[str, int]]:
        """One task awaiting the commit and ACKs: waiting on it never cancels them."""
        if self._waiter is None:
            self._waiter = asyncio.ensure_future(self.wait())
            self._waiter.add_done_callback(
                lambda t: None if t.cancelled() else t.exception()  # Retrieved.
            )
        return self._waiter

    def done(self) -> bool:
        return (self.commit is None or self.commit.done()) and all(a.done() for a in self.acks)

    async def wait(self) -> dict[str, int]:
        """Wait for the commit and ACKs; raise the first failure; returns publish_at."""
        if self.commit is not None:
            await self.commit
        publish_at: dict[str, int] = {}
        for ack in self.acks:
            try:
                await ack
            except JournalNotFound:
                if self.commit is None:  # A recovered intent of a journal since deleted.
                    log.warning("dropping recovered ACK intent", extra={"journal": ack.journal})
                    if self.service is not None:
                        # The service keeps a journal's terminal failure and hands it to
                        # every later commit (as a pending append it waits for), which
                        # would fail them all: this one is dropped, as Gazette drops it.
                        self.service.clear_error(ack.journal)
                    continue
                raise
            if ack.response is not None:
                end = ack.response.commit.end
                if end > publish_at.get(ack.journal, -1):
                    publish_at[ack.journal] = end
        return publish_at


def _op_of(commit: CommitFuture, lease_check: Callable[[], bool]) -> OpFuture:
    """An OpFuture resolving with `commit` (ACK appends depend on it); a commit that
    resolves once the lease may have expired fails it, so a deposed primary's ACKs never
    go out."""
    op = OpFuture()

    def resolved(fut: CommitFuture) -> None:
        if fut.cancelled():
            op.resolve(asyncio.CancelledError())
        elif fut.exception() is not None:
            op.resolve(fut.exception())
        elif not lease_check():
            op.resolve(LeaseLost("consumer lease may have expired; not acknowledging"))
        else:
            op.resolve(None)

    commit.add_done_callback(resolved)
    return op


class Transactions:
    """Runs a primary shard's transactions until it stops or fails (see module doc)."""

    def __init__(
        self,
        shard: Shard,
        app: Application,
        store: Store,
        service: AppendService,
        publisher: Publisher,
        readers: SourceReaders,
        progress: Progress,
        *,
        lease_check: Callable[[], bool] = lambda: True,
    ) -> None:
        self.shard = shard
        self.app = app
        self.store = store
        self.service = service
        self.publisher = publisher
        self.readers = readers
        self.progress = progress
        self.lease_check = lease_check
        self._get: asyncio.Task[SourceBatch] | None = None
        # The rest of a batch whose transaction closed at max_txn_duration within it: the
        # next transaction begins with it.
        self._carry: SourceBatch | None = None
        self._ended: set[str] = set()
        self.offsets: dict[str, int] = {}
        self.states: dict[str, list[ProducerState]] = {}
        # Per source journal, as of the batches consumed: its sequencer's `begun` count, and
        # `newest_open`; and the `begun` counts as of the last commit (wait-for-ACK).
        self._begun: dict[str, int] = {}
        self._newest_open: dict[str, int] = {}
        self._begun_at_commit: dict[str, int] = {}

    # Recovery ----------------------------------------------------------------------------

    def acknowledge_recovered(self, cp: cpb.Checkpoint) -> _Committed:
        """Append the recovered checkpoint's ACK intents again (harmless if already there)."""
        acks = [
            self.service.append(intent.journal, intent.intent)
            for intent in checkpoint_ack_intents(cp)
        ]
        return _Committed(
            None, acks, {j: s.read_through for j, s in cp.sources.items()}, service=self.service
        )

    # The loop ----------------------------------------------------------------------------

    async def run(self, cp: cpb.Checkpoint) -> None:
        self.offsets, self.states = checkpoint_sources(cp)
        prev = self.acknowledge_recovered(cp)
        stopping = self.shard.stopping
        stop_wait = asyncio.ensure_future(stopping.wait())
        try:
            while True:
                batch = await self._next(prev, stop_wait, None)
                if batch is None:
                    if stopping.is_set():
                        break
                    # Only the previous transaction finished: record its progress.
                    await self._complete(prev)
                    continue
                if not batch.envelopes and batch.error is None and not batch.ended:
                    # Only a transaction begun upstream, or duplicates or rolled-back
                    # messages: nothing to begin one here with.
                    await self._consume(batch)
                    await self._read_through_idle(batch, prev)
                    continue
                committed = await self._transaction(batch, prev, stop_wait)
                if committed is None:
                    break
                prev = committed
        finally:
            stop_wait.cancel()
            if self._get is not None:
                self._get.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._get
                self._get = None
        # Stopping: let the last handed-off commit finish (it may fail if we were deposed).
        if prev is not None and not prev.done():
            await asyncio.wait([prev.waiter()], timeout=10.0)

    async def _next(
        self, prev: _Committed | None, stop_wait: asyncio.Future[Any], within: float | None
    ) -> SourceBatch | None:
        """The next batch; None on timeout, on stop, or when `prev` finished first (if it
        wasn't done already)."""
        if self._carry is not None:
            batch, self._carry = self._carry, None
            return batch
        if self._get is None:
            self._get = asyncio.ensure_future(self.readers.get())
        waits: set[asyncio.Future[Any]] = {self._get, stop_wait}
        if prev is not None and not prev.done():
            waits.add(prev.waiter())
        await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        if self._get.done():
            batch = self._get.result()
            self._get = None
            return batch
        return None

    def _ready(self) -> SourceBatch | None:
        """A batch that is ready now, without waiting."""
        if self._carry is not None:
            batch, self._carry = self._carry, None
            return batch
        if self._get is not None:
            if not self._get.done():
                return None
            batch = self._get.result()
            self._get = None
            return batch
        try:
            return self.readers.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def _complete(self, prev: _Committed) -> None:
        """Wait for `prev` fully, raising its failure, and publish its progress (once)."""
        if prev.completed:
            return
        publish_at = await asyncio.shield(prev.waiter())
        prev.completed = True
        await self.progress.advance(
            prev.read_through, publish_at, messages=prev.messages, nbytes=prev.nbytes
        )

    async def _read_through_idle(self, batch: SourceBatch, prev: _Committed) -> None:
        """Progress of a read which began no transaction here, as Gazette's txnRead reports
        it: with a transaction still committing, its progress (not its checkpoint) extends
        to the read; else the shard's progress does at once. Otherwise a Stat asking to read
        through a duplicate (a retried append's second copy, a recovered ACK appended again)
        would wait for the next message that begins a transaction, for ever on a quiet
        source. While a producer's transaction in the journal awaits its ACK (its messages
        are read, not consumed yet), only through the last duplicate or rolled-back message,
        as Gazette reports it."""
        journal = batch.journal
        offset = batch.dropped_through if batch.newest_open else batch.read_through
        if offset <= 0:
            return
        if not prev.completed:
            if offset > prev.read_through.get(journal, -1):
                prev.read_through[journal] = offset
        else:
            await self.progress.advance({journal: offset}, {})

    def _check(self, batch: SourceBatch) -> None:
        if batch.error is not None:
            raise batch.error
        if batch.ended:
            self._ended.add(batch.journal)

    async def _consume(
        self, batch: SourceBatch, deadline: float | None = None, *, first: bool = False
    ) -> tuple[int, int]:
        """Hand a batch's messages (not its ACKs) to the application. Once `deadline` has
        passed (max_txn_duration: Gazette's txnStep checks its timer before each message),
        it stops between two messages, if it can checkpoint there (`checkpoint_within`), and
        leaves the rest of the batch to the next transaction (`_carry`); the `first` batch of
        a transaction gives it one message at least."""
        shard, store, publisher = self.shard, self.store, self.publisher
        consume = self.app.consume_message
        messages = nbytes = 0
        clock = time.monotonic
        for i, env in enumerate(batch.envelopes):
            if deadline is not None and (i or not first) and clock() >= deadline:
                if self._close_within(batch, i):
                    return messages, nbytes
                deadline = None  # It cannot close here: the whole batch, then.
            nbytes += env.end - env.begin
            if env.flags == ACK_TXN:
                continue
            messages += 1
            # A plain function returns None: no coroutine per message then.
            result = consume(shard, store, env, publisher)
            if result is not None and inspect.isawaitable(result):
                await result
        if not batch.ended:
            self.offsets[batch.journal] = batch.read_through
            self.states[batch.journal] = batch.states
            self._begun[batch.journal] = batch.begun
            self._newest_open[batch.journal] = batch.newest_open
        return messages, nbytes

    def _close_within(self, batch: SourceBatch, index: int) -> bool:
        """Checkpoint `batch` as of its first `index` messages consumed and carry the rest to
        the next transaction; False if it cannot be checkpointed there."""
        if index == 0:
            self._carry = batch  # None of it consumed: the checkpoint stays as it is.
            return True
        within = checkpoint_within(batch, index)
        if within is None:
            return False
        self.offsets[batch.journal], self.states[batch.journal] = within
        # Its `begun` and `newest_open` (wait-for-ACK) apply once the rest is consumed.
        self._carry = dataclasses.replace(
            batch, envelopes=batch.envelopes[index:], preceding=batch.preceding + index
        )
        return True

    def _awaits_ack(self) -> bool:
        """Whether a producer's transaction begun since the last commit awaits its ACK
        (Gazette's sequencer.HasPending), and the spec has the transaction wait for it."""
        if self.shard.spec.disable_wait_for_ack:
            return False
        at_commit = self._begun_at_commit
        return any(
            newest > at_commit.get(journal, 0)
            for journal, newest in self._newest_open.items()
            if journal not in self._ended
        )

    async def _transaction(
        self, first: SourceBatch, prev: _Committed, stop_wait: asyncio.Future[Any]
    ) -> _Committed | None:
        self._check(first)
        begin_txn = getattr(self.app, "begin_txn", None)
        if begin_txn is not None:
            await maybe_await(begin_txn(self.shard, self.store))
        # Its durations run from here, as Gazette's (beganAt, once BeginTxn returned): a
        # begin_txn that waited (on a semaphore bounding concurrent transactions) must not
        # eat into them, else the transaction would close after its first batch.
        began = time.monotonic()
        # From here every outcome reaches finish_txn, as Gazette pairs BeginTxn with
        # FinishedTxn: an application holding a semaphore shared by its shards from one
        # to the other (as Gazette suggests) would otherwise keep it for ever.
        try:
            consumed = await self._consume_until_closed(first, began, prev, stop_wait)
        except BaseException as exc:
            await self._finish_failed(exc)
            raise
        if consumed is None:
            # Abandoned (the shard stops): nothing of it is committed.
            await self._finish_failed(asyncio.CancelledError("the shard stopped"))
            return None
        committed = await self._commit(*consumed)
        TXN_SECONDS.observe(time.monotonic() - began)
        return committed

    async def _consume_until_closed(
        self,
        first: SourceBatch,
        began: float,
        prev: _Committed,
        stop_wait: asyncio.Future[Any],
    ) -> tuple[int, int] | None:
        """Consume batches until the transaction may close (see the module docstring);
        returns the messages and bytes consumed, or None if the shard stops first."""
        spec = self.shard.spec
        min_dur = spec.min_txn_duration.ToTimedelta().total_seconds()
        max_dur = spec.max_txn_duration.ToTimedelta().total_seconds() or 1.0
        closing = began + max_dur
        messages, nbytes = await self._consume(first, closing, first=True)
        prev_done = False
        while self._carry is None:  # Else it closed at max_txn_duration, within a batch.
            if not prev_done and prev.done():
                await self._complete(prev)
                prev_done = True
            now = time.monotonic()
            if now >= began + max_dur:
                break
            if self.shard.stopping.is_set():
                return None
            if prev_done and now >= began + min_dur and not self._awaits_ack():
                # Only batches ready right now keep the transaction open.
                batch = self._ready()
                if batch is None:
                    break
            else:
                deadline = began + (min_dur if now < began + min_dur else max_dur)
                batch = await self._next(
                    None if prev_done else prev, stop_wait, max(0.0, deadline - now)
                )
                if batch is None:
                    continue
            self._check(batch)
            m, b = await self._consume(batch, closing)
            messages += m
            nbytes += b
        if not prev_done:
            await self._complete(prev)  # Stalled: the previous commit is slow.
        return messages, nbytes

    async def _finish_failed(self, error: BaseException) -> None:
        """Tell the application its transaction failed before it was handed to the store."""
        finish = getattr(self.app, "finish_txn", None)
        if finish is not None:
            with contextlib.suppress(Exception):
                await maybe_await(finish(self.shard, self.store, error))

    async def _commit(self, messages: int, nbytes: int) -> _Committed:
        app, shard, store, publisher = self.app, self.shard, self.store, self.publisher
        finish = getattr(app, "finish_txn", None)
        try:
            await maybe_await(app.finalize_txn(shard, store, publisher))
            states = [s for journal_states in self.states.values() for s in journal_states]
            intents = publisher.build_ack_intents()
            cp = build_checkpoint(self.offsets, states, intents)
            self._begun_at_commit = dict(self._begun)
            if not self.lease_check():
                raise LeaseLost("consumer lease may have expired; not committing")
            wait_for = list(self.service.pending_except(""))
            commit = store.start_commit(shard, cp, wait_for)
            ack_dep = _op_of(commit, self.lease_check)
            acks = [
                self.service.append(intent.journal, intent.intent, dependencies=[ack_dep])
                for intent in intents
            ]
        except BaseException as exc:
            await self._finish_failed(exc)
            raise
        if finish is not None:
            await maybe_await(finish(shard, store, None))
        return _Committed(commit, acks, dict(self.offsets), messages, nbytes)
