"""Route advertisements of many journals in one etcd transaction.

A primary writes a journal's route into its assignments once its replicas synchronised on
that route (`append_fsm`, step 4): that is what tells the allocator the journal is
consistent. After an apply of thousands of journals, a transaction per journal means a
keyspace revision per journal, each of which every broker's watch then processes. Here the
writes are batched instead ("group commit"): a pulse's advertisement (which nothing waits
for) waits up to LINGER_SECONDS for others to join it, one an append waits for doesn't (it
sends the batch at once), and while one transaction is in flight, those asked for meanwhile
queue up; the next transaction carries them all, up to MAX_TXN_OPS compares and puts (etcd
refuses a transaction of more than --max-txn-ops, 128 by default, of either). A primary's
pulses come a few at a time (each synchronises a pipeline first), so without the wait most
transactions would carry one or two.

Each advertisement keeps its own guard: its puts apply only if its assignments still have
the mod revisions it saw. A batch's transaction carries every guard of the batch; should
one fail (that journal's assignments changed meanwhile), the transaction applies nothing,
and every advertisement of the batch is retried in a transaction of its own, so each
fails or succeeds as it would have alone. A batch never writes (or compares) a key twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pygazette.keyspace.keyspace import Compare, Keyspace, Put, TxnResult

log = logging.getLogger(__name__)

# Compares (and, separately, puts) a batched transaction carries at most.
MAX_TXN_OPS = 100
# How long a batch that isn't full waits for more advertisements before it is sent.
LINGER_SECONDS = 0.1

_Key = tuple[tuple[Compare, ...], tuple[Put, ...]]


@dataclass(slots=True)
class _Request:
    compares: tuple[Compare, ...]
    puts: tuple[Put, ...]
    done: asyncio.Future[TxnResult]
    urgent: bool

    def keys(self) -> set[str]:
        return {c.key for c in self.compares} | {p.key for p in self.puts}


class RouteAdvertiser:
    def __init__(
        self, keyspace: Keyspace, *, max_ops: int = MAX_TXN_OPS, linger: float = LINGER_SECONDS
    ) -> None:
        self.keyspace = keyspace
        self.max_ops = max_ops
        self.linger = linger
        self._queued: dict[_Key, _Request] = {}  # In request order.
        self._inflight: dict[_Key, _Request] = {}  # In the transaction being sent.
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # Ends the linger: an urgent advertisement, or a full batch.
        self._queued_puts = 0
        self._stopped = False
        # For tests and metrics.
        self.advertisements = 0  # Asked for (not counting those that shared a queued one).
        self.transactions = 0  # Transactions sent, fallbacks included.
        self.batches = 0  # Transactions of more than one advertisement.
        self.fallbacks = 0  # Batches whose transaction failed a compare.

    def submit(
        self, compares: Sequence[Compare], puts: Sequence[Put], *, urgent: bool = False
    ) -> asyncio.Future[TxnResult]:
        """Apply `puts` iff every compare holds, in a transaction shared with other
        advertisements: the future has its result (or fails with its error). The same
        advertisement asked for again while it is queued shares its future. An `urgent` one
        (someone waits for it) is sent without waiting for others to join it."""
        key: _Key = (tuple(compares), tuple(puts))
        req = self._queued.get(key) or self._inflight.get(key)
        if req is None:
            loop = asyncio.get_running_loop()
            req = _Request(key[0], key[1], loop.create_future(), urgent)
            if self._stopped:
                req.done.cancel()
                return req.done
            self._queued[key] = req
            self._queued_puts += len(req.puts)
            self.advertisements += 1
        if urgent or self._queued_puts >= self.max_ops:
            req.urgent = req.urgent or urgent
            self._wake.set()
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name="route-advertiser")
        return req.done

    async def advertise(self, compares: Sequence[Compare], puts: Sequence[Put]) -> TxnResult:
        """`submit`, urgent and awaited (the caller's cancellation leaves the advertisement
        be)."""
        return await asyncio.shield(self.submit(compares, puts, urgent=True))

    async def stop(self) -> None:
        self._stopped = True
        task, self._flusher = self._flusher, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for req in [*self._queued.values(), *self._inflight.values()]:
            req.done.cancel()
        self._queued.clear()
        self._inflight.clear()
        self._queued_puts = 0

    def _take(self) -> list[_Request]:
        """The next batch: queued advertisements in order, up to `max_ops` compares and
        puts, no key twice (one that doesn't fit waits for the next batch)."""
        batch: list[_Request] = []
        keys: set[str] = set()
        compares = puts = 0
        for key, req in list(self._queued.items()):
            if batch and (
                compares + len(req.compares) > self.max_ops
                or puts + len(req.puts) > self.max_ops
                or not keys.isdisjoint(req.keys())
            ):
                if compares >= self.max_ops or puts >= self.max_ops:
                    break
                continue
            del self._queued[key]
            self._queued_puts -= len(req.puts)
            self._inflight[key] = req
            batch.append(req)
            keys |= req.keys()
            compares += len(req.compares)
            puts += len(req.puts)
        return batch

    async def _flush(self) -> None:
        try:
            while self._queued:
                # Let more advertisements join the batch, unless it is full already, or
                # someone waits for it.
                if self._queued_puts < self.max_ops and not any(
                    r.urgent for r in self._queued.values()
                ):
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.linger)
                batch = self._take()
                try:
                    if len(batch) == 1:
                        await self._one(batch[0])
                    else:
                        await self._batch(batch)
                finally:
                    self._inflight.clear()
        finally:
            if self._flusher is asyncio.current_task():
                self._flusher = None
                if self._queued and not self._stopped:  # Asked for while we finished.
                    self._flusher = asyncio.create_task(self._flush(), name="route-advertiser")

    async def _one(self, req: _Request) -> None:
        self.transactions += 1
        try:
            result = await self.keyspace.txn(req.compares, req.puts)
        except asyncio.CancelledError:
            req.done.cancel()
            raise
        except Exception as exc:
            _settle(req, exc)
            return
        _settle(req, result)

    async def _batch(self, batch: list[_Request]) -> None:
        self.transactions += 1
        self.batches += 1
        try:
            result = await self.keyspace.txn(
                [c for req in batch for c in req.compares], [p for req in batch for p in req.puts]
            )
        except asyncio.CancelledError:
            for req in batch:
                req.done.cancel()
            raise
        except Exception as exc:
            for req in batch:
                _settle(req, exc)
            return
        if result.succeeded:
            for req in batch:
                _settle(req, result)
            return
        # Some advertisement's assignments changed: each on its own, so the others land.
        self.fallbacks += 1
        log.debug("batched route advertisement failed a compare", extra={"size": len(batch)})
        try:
            await asyncio.gather(*(self._one(req) for req in batch))
        except asyncio.CancelledError:
            for req in batch:
                req.done.cancel()
            raise


def _settle(req: _Request, outcome: TxnResult | Exception) -> None:
    if req.done.done():
        return
    if isinstance(outcome, Exception):
        req.done.set_exception(outcome)
    else:
        req.done.set_result(outcome)
