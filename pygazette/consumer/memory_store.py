"""`MemoryStore`: a shard's state as a Python object in memory, for tests and simple apps.

The state is any deep-copyable Python object (a dict by default) that the application reads
and mutates through `store.state` in `consume_message` / `finalize_txn`:

    def new_store(self, shard, recorder):
        return MemoryStore({"counts": {}})

    def consume_message(self, shard, store, envelope, publisher):
        counts = store.state["counts"]
        counts[key] = counts.get(key, 0) + 1

`start_commit` takes a deep snapshot of (state, checkpoint) at once (so the next transaction
may mutate `state` while this one commits), and once every `wait_for` has resolved, makes
that snapshot the committed one. `restore_checkpoint` returns the last committed checkpoint
and resets `store.state` to (a copy of) the last committed state: always use `store.state`,
don't keep a reference to the object across a restore.

A MemoryStore is NOT durable: it lives and dies with its process (and its Python object).
A new process, or a new MemoryStore, starts from the initial state and an empty checkpoint.

This module also holds `CommitPipeline`, the commit sequencing every store of this package
shares: commits run one after another in call order, each after its `wait_for`; a failed
commit fails every later one until `restore_checkpoint` resets the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from pygazette.consumer.store import CommitFuture, Store, StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb

if TYPE_CHECKING:
    from pygazette.consumer.shard_api import Shard

__all__ = ["CommitPipeline", "EarlierCommitFailed", "MemoryStore"]


class EarlierCommitFailed(RuntimeError):
    """An earlier commit of this store failed, so this one can't commit (its state builds on
    the failed one). `restore_checkpoint` resets the store to its last durable commit."""


class CommitPipeline:
    """Sequences a store's commits (see the module docstring).

    `start(wait_for, apply)` returns a future at once (cancelling it doesn't stop the
    commit: only `cancel()` does, when the store is destroyed). The commit first waits for the
    previous commit (failing if it failed), then for every `wait_for` (failing with the
    first failure), then runs `apply()`, the store's own durable commit. The first failure
    is remembered in `failure`: every commit started later fails at once, until `reset()`.
    """

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None

    def failed_commit(self) -> CommitFuture:
        """A future already failed with the pipeline's failure (see `start`)."""
        fut: CommitFuture = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        fut.set_exception(self._later_failure())
        return fut

    def _later_failure(self) -> BaseException:
        failure = self.failure
        assert failure is not None
        if isinstance(failure, StoreFenced):
            exc: BaseException = StoreFenced(str(failure))
        else:
            exc = EarlierCommitFailed(f"an earlier commit failed: {failure!r}")
        exc.__cause__ = failure
        return exc

    def start(
        self,
        wait_for: Sequence[Awaitable[object]],
        apply: Callable[[], Awaitable[None]],
        *,
        finished: Callable[[], None] | None = None,
    ) -> CommitFuture:
        """Start a commit (see the class docstring); `finished()` is called once it is
        over, whatever its outcome (even if it never got to `apply`)."""
        if self.failure is not None:
            if finished is not None:
                finished()
            return self.failed_commit()
        prev = self._last
        waits = list(wait_for)

        async def run() -> None:
            if prev is not None:
                # asyncio.wait: a cancelled predecessor must not cancel this task.
                await asyncio.wait([prev])
                if prev.cancelled() or prev.exception() is not None:
                    self._done(prev)
                    raise self._later_failure()
            for dep in waits:
                await dep
            await apply()

        task: asyncio.Task[None] = asyncio.ensure_future(run())
        task.add_done_callback(self._done)
        if finished is not None:
            task.add_done_callback(lambda _t: finished())
        self._last = task
        # The caller gets a future of its own: cancelling it (as cancelling a task awaiting
        # it does) must not interrupt the commit halfway, nor the commits queued behind it.
        out: CommitFuture = asyncio.get_running_loop().create_future()
        out.add_done_callback(_retrieve)
        task.add_done_callback(lambda t: _relay(t, out))
        return out

    def _done(self, task: asyncio.Future[None]) -> None:
        if task.cancelled():
            failure: BaseException | None = asyncio.CancelledError("commit cancelled")
        else:
            failure = task.exception()  # Also marks the exception as retrieved.
        if failure is not None and self.failure is None:
            self.failure = failure

    async def drain(self) -> None:
        """Wait until the last started commit is done (ignoring its outcome)."""
        if self._last is not None and not self._last.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait([self._last])

    def in_flight(self) -> bool:
        return self._last is not None and not self._last.done()

    def reset(self) -> None:
        """Forget a failure (the store has rolled back to its last durable commit)."""
        self.failure = None
        self._last = None

    def cancel(self) -> None:
        """Cancel the commit in flight, if any (the store is being destroyed)."""
        if self._last is not None and not self._last.done():
            self._last.cancel()


def _relay(task: asyncio.Future[None], out: CommitFuture) -> None:
    if out.done():
        return
    if task.cancelled():
        out.cancel()
    elif (exc := task.exception()) is not None:
        out.set_exception(exc)
    else:
        out.set_result(None)


def _retrieve(fut: CommitFuture) -> None:
    """Mark a failure as seen: nobody may await the commit of a torn-down shard."""
    if not fut.cancelled():
        fut.exception()


def copy_checkpoint(cp: cpb.Checkpoint) -> cpb.Checkpoint:
    out = cpb.Checkpoint()
    out.CopyFrom(cp)
    return out


class MemoryStore(Store):
    """A store whose state is an in-memory Python object (see the module docstring)."""

    def __init__(self, state: Any = None) -> None:
        self.state: Any = {} if state is None else state
        self._committed_state: Any = copy.deepcopy(self.state)
        self._committed_cp = cpb.Checkpoint()
        self._pipeline = CommitPipeline()
        self._destroyed = False

    async def restore_checkpoint(self, shard: Shard) -> cpb.Checkpoint:
        self._check_usable()
        await self._pipeline.drain()
        self._pipeline.reset()
        self.state = copy.deepcopy(self._committed_state)
        return copy_checkpoint(self._committed_cp)

    def start_commit(
        self, shard: Shard, checkpoint: cpb.Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> CommitFuture:
        self._check_usable()
        if self._pipeline.failure is not None:
            return self._pipeline.failed_commit()
        state = copy.deepcopy(self.state)
        cp = copy_checkpoint(checkpoint)

        async def apply() -> None:
            self._committed_state = state
            self._committed_cp = cp

        return self._pipeline.start(wait_for, apply)

    @property
    def committed_state(self) -> Any:
        """A copy of the state of the last commit."""
        return copy.deepcopy(self._committed_state)

    def destroy(self) -> None:
        self._destroyed = True
        self._pipeline.cancel()

    def _check_usable(self) -> None:
        if self._destroyed:
            raise RuntimeError("MemoryStore was destroyed")
