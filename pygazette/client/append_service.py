"""`AppendService`: asynchronous appends, batched per journal, dispatched in FIFO order and
retried until they commit or fail for good.

For each journal the service keeps an ordered chain of `AsyncAppend`s. A writer takes the
journal's current append with `start_append` (which holds the journal exclusively), writes
content, and `release`s it: the content is queued, or rolled back if the writer hit an
error. One dispatch task per journal sends the chain's appends one after another; while an
Append RPC is in flight, everything written meanwhile collects in the next append of the
chain, so co-occurring small writes become one large RPC.

- Content is queued in `AppendBuffer`s: anonymous temporary files with a small in-memory
  front, so a broker outage is ridden out up to the capacity of the disk.
- An append may depend on other operations (`dependencies`, e.g. `pending_except(journal)`):
  its RPC starts only after they all succeeded. A failed dependency fails it.
- Transport failures and routing statuses are retried with backoff, forever. Terminal
  statuses (journal not found, not allowed, register mismatch, wrong append offset, ...)
  fail the append, everything queued behind it, and later appends to the journal: letting
  later content commit before the failed one would break the journal's order.
- A retry after a lost response can append content twice (the first attempt may have
  committed). The message layer removes such duplicates by their UUIDs.

`start_append`, `AsyncAppend.write/require/release` and `pending_except` may be called from
any thread; the service runs its RPCs on the event loop it was created on. Await an
`OpFuture` (or `AsyncAppend`) from that loop, or block on `result()` from another thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from pygazette.client.append_buffer import SPILL_SIZE, AppendBuffer, AppendBufferPool
from pygazette.client.appender import CHUNK_SIZE, Appender
from pygazette.client.errors import ClientError, ProtocolViolation
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import backoff
from pygazette.protocol.errors import (
    FragmentStoreUnhealthy,
    IndexHasGreaterOffset,
    JournalNotFound,
    NotAllowed,
    RegisterMismatch,
    ValidationError,
    WrongAppendOffset,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_journal_name

log = logging.getLogger(__name__)

# An append whose queued content exceeds this is closed; later writes chain a new one.
APPEND_CUTOFF = 64 << 20

# Broker statuses after which retrying the same append cannot succeed.
TERMINAL_ERRORS: tuple[type[BaseException], ...] = (
    JournalNotFound,
    NotAllowed,
    RegisterMismatch,
    WrongAppendOffset,
    IndexHasGreaterOffset,
    FragmentStoreUnhealthy,
    ValidationError,
    ProtocolViolation,
)
# gRPC codes that describe a request no retry can fix.
_TERMINAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


def is_terminal_append_error(exc: BaseException) -> bool:
    """Whether an append failing with `exc` must not be retried."""
    if isinstance(exc, TERMINAL_ERRORS):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _TERMINAL_CODES


class AppendServiceClosed(ClientError):
    """The AppendService was closed before the operation could complete.

    `may_have_committed` is set when the append was cancelled (close with `cancel`) after an
    RPC of it had sent its commit: the broker may have committed it all the same, as with
    any append whose answer was lost. Otherwise the append was not committed."""

    may_have_committed = False


class DependencyFailed(ClientError):
    """An operation this append depended on failed, so the append did not happen."""


class AppendServiceError(ClientError):
    """An earlier append to this journal failed for good; the journal takes no more appends
    through this service (see `AppendService.clear_error`)."""


class OpFuture:
    """An operation running in the background. Thread-safe.

    `await op` (on any event loop) waits for it and raises its error; `op.result(timeout)`
    does the same from a thread; `op.error(timeout)` returns the error instead.
    """

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> None:
        self._future.result(timeout)

    def error(self, timeout: float | None = None) -> BaseException | None:
        """Block until done; the operation's error, or None if it succeeded."""
        return self._future.exception(timeout)

    def add_done_callback(self, fn: Callable[[OpFuture], object]) -> None:
        """Call `fn(self)` once done (at once, if it is already), on the resolving thread."""
        self._future.add_done_callback(lambda _f: fn(self))

    def resolve(self, err: BaseException | None = None) -> None:
        """Mark the operation finished (with `err` if it failed). Only the first call counts."""
        if self._future.done():
            return
        try:
            if err is None:
                self._future.set_result(None)
            else:
                self._future.set_exception(err)
        except concurrent.futures.InvalidStateError:
            pass  # Resolved concurrently.

    async def wait(self) -> None:
        """Wait for the operation; raise its error. Cancelling the wait leaves the operation
        alone (others may wait for it, or depend on it)."""
        if not self._future.done():
            # Not asyncio.wrap_future: cancelling what it returns cancels the shared future,
            # which failed the operation for every waiter and dependent, done or not.
            loop = asyncio.get_running_loop()
            woken: asyncio.Future[None] = loop.create_future()

            def wake(_f: object) -> None:
                with contextlib.suppress(RuntimeError):  # The waiter's loop closed meanwhile.
                    loop.call_soon_threadsafe(_wake, woken)

            self._future.add_done_callback(wake)
            await woken
        self._future.result()

    def __await__(self) -> Any:
        return self.wait().__await__()


def finished_operation(err: BaseException | None = None) -> OpFuture:
    """An OpFuture that is already resolved."""
    op = OpFuture()
    op.resolve(err)
    return op


_NO_DEPENDENCIES: frozenset[OpFuture] = frozenset()


def _request_key(request: pb.AppendRequest) -> bytes | None:
    """A comparable form of an AppendRequest; None for one that names only a journal.

    Every other field counts (offset, registers, do_not_proxy, suspend...): only equal
    requests share an RPC, as Gazette compares whole requests.
    """
    if request == pb.AppendRequest(journal=request.journal):
        return None
    return request.SerializeToString(deterministic=True)


class _Chain:
    """The ordered appends of one journal, and the lock writers hold while writing."""

    __slots__ = (
        "cleared",
        "err",
        "finished",
        "journal",
        "lock",
        "owner",
        "queue",
        "tail",
        "waiter",
    )

    def __init__(self, journal: str, err: BaseException | None) -> None:
        self.journal = journal
        self.lock = threading.Lock()
        self.owner: int | None = None  # Thread holding `lock`.
        self.queue: deque[AsyncAppend] = deque()  # Unresolved appends, oldest first.
        self.tail: AsyncAppend | None = None  # The append that takes writes, if any.
        self.waiter: asyncio.Future[None] | None = None  # The dispatcher, waiting for `lock`.
        self.finished = False  # The dispatcher exited; a new chain replaces this one.
        self.err = err
        # `AppendService.clear_error` was called (under its `_mu`) while the dispatcher ran:
        # appends it has not failed yet go out, and the failure is not kept.
        self.cleared = False


class AsyncAppend(OpFuture):
    """An append managed by an AppendService, returned by `start_append`.

    The writer holds the journal exclusively until `release`: write content with `write`,
    record failures with `require`, then `release`. It may also be used as a context manager
    (`with service.start_append(j) as aa: aa.write(...)`), which releases on exit and rolls
    back on an exception. Once released, await it (or call `result()`) to learn whether it
    committed; `response` is then the broker's AppendResponse, which covers the whole batch
    the content was sent with.
    """

    __slots__ = (
        "_buf",
        "_chain",
        "_commit_sent",
        "_err",
        "_key",
        "_released",
        "_service",
        "checkpoint",
        "dependencies",
        "request",
        "response",
    )

    def __init__(
        self,
        service: AppendService,
        chain: _Chain,
        request: pb.AppendRequest,
        key: bytes | None,
        dependencies: frozenset[OpFuture],
    ) -> None:
        super().__init__()
        self._service = service
        self._chain = chain
        self.request = request
        self._key = key
        self.dependencies = dependencies
        self._buf: AppendBuffer | None = None
        # Size of the content released so far: what the RPC will send.
        self.checkpoint = 0
        self._err: BaseException | None = None
        self._released = False  # Some writer released without error.
        self.response: pb.AppendResponse | None = None
        self._commit_sent = False  # An RPC of it sent its commit: it may have committed.

    @property
    def journal(self) -> str:
        return self.request.journal

    def result(self, timeout: float | None = None) -> None:
        self._check_may_block()
        super().result(timeout)

    def error(self, timeout: float | None = None) -> BaseException | None:
        self._check_may_block()
        return super().error(timeout)

    def _check_may_block(self) -> None:
        if not self.done() and threading.get_ident() == self._service._loop_thread:
            raise RuntimeError(
                f"blocking on {self!r} from the AppendService's own event loop would never "
                "return: await it instead"
            )

    def _check_held(self) -> AppendBuffer:
        buf = self._buf
        if buf is None or self._chain.owner != threading.get_ident():
            raise RuntimeError(f"{self!r} is not held by this thread (call start_append first)")
        return buf

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue `data`. A failure to queue it (say, a full disk) is kept and raised by
        `release`, which then rolls back everything this writer wrote."""
        buf = self._check_held()
        if self._err is not None:
            return
        try:
            buf.write(data)
        except OSError as exc:
            self._err = exc

    def require(self, err: BaseException | None) -> AsyncAppend:
        """Keep `err` (if not None, and no error was kept yet): `release` will roll back."""
        if err is not None and self._err is None:
            self._err = err
        return self

    def release(self) -> None:
        """Queue what was written for the broker, or, if an error was kept, discard it and
        raise that error. Either way the journal is free for the next writer."""
        buf = self._check_held()
        err, self._err = self._err, None
        try:
            if err is None:
                self.checkpoint = buf.size
                self._released = True
            else:
                buf.truncate(self.checkpoint)
        finally:
            self._service._unlock(self._chain)
        if err is not None:
            raise err

    def __enter__(self) -> AsyncAppend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.require(exc)
            try:
                self.release()
            except BaseException as raised:
                if raised is not exc:
                    raise
            return
        self.release()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"AsyncAppend({self.journal!r}, {state}, {self.checkpoint} bytes)"


class AppendService:
    """Batches, dispatches and retries asynchronous appends (see the module docstring).

    Create it on a running event loop; close it with `await service.close()` (which waits
    for everything queued) or use it as an async context manager.
    """

    def __init__(
        self,
        client: JournalClient,
        *,
        buffer_dir: str | None = None,
        spill_size: int = SPILL_SIZE,
        chunk_size: int = CHUNK_SIZE,
        append_cutoff: int = APPEND_CUTOFF,
        backoff: Callable[[int], float] = backoff,
    ) -> None:
        self.client = client
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # A child forked from this process has a copy of the service but not its loop's
        # thread: what it queued would never be sent (`_hold` refuses it).
        self._pid = os.getpid()
        self.chunk_size = chunk_size
        self.append_cutoff = append_cutoff
        self._backoff = backoff
        self._pool = AppendBufferPool(buffer_dir, spill_size)
        self._mu = threading.Lock()  # Guards _chains, _errs, _tasks and _closed.
        self._chains: dict[str, _Chain] = {}
        self._errs: dict[str, BaseException] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0  # Chains whose dispatcher was spawned and has not exited.
        self._closed = False
        self._idle = asyncio.Event()  # Set when no dispatcher runs.
        self._idle.set()

    # Writing ------------------------------------------------------------------------------

    def start_append(
        self,
        request: str | pb.AppendRequest,
        dependencies: Iterable[OpFuture] | None = None,
    ) -> AsyncAppend:
        """The current AsyncAppend of the request's journal, held by the caller until it
        calls `release`.

        `request` is a journal name, or an AppendRequest whose options (expected offset,
        register checks and updates) apply to the whole batch: only writes with an equal
        request share an RPC. Writes are never reordered within a journal. `dependencies`
        must all succeed before this append's RPC starts.
        """
        _, aa = self._hold(request, dependencies)
        if aa._buf is None:
            aa._buf = self._pool.get()
        return aa

    def append(
        self,
        journal: str | pb.AppendRequest,
        data: bytes | bytearray | memoryview,
        dependencies: Iterable[OpFuture] | None = None,
    ) -> AsyncAppend:
        """Queue `data` as one atomic write (what `start_append`, `write` and `release`
        do, in one call). Raises OSError, queuing nothing, if the data cannot be queued."""
        chain, aa = self._hold(journal, dependencies)
        try:
            buf = aa._buf
            if buf is None:
                buf = aa._buf = self._pool.get()
            try:
                buf.write(data)
            except BaseException:
                buf.truncate(aa.checkpoint)
                raise
            aa.checkpoint = buf.size
            aa._released = True
        finally:
            self._unlock(chain)
        return aa

    def _hold(
        self, request: str | pb.AppendRequest, dependencies: Iterable[OpFuture] | None
    ) -> tuple[_Chain, AsyncAppend]:
        """Lock the journal's chain; return it and the append that takes the write."""
        req: pb.AppendRequest | None
        if isinstance(request, str):
            journal, req, key = request, None, None
        else:
            req = pb.AppendRequest()
            req.CopyFrom(request)
            req.ClearField("content")
            key = _request_key(req)
            journal = req.journal
        if os.getpid() != self._pid:
            raise AppendServiceClosed(
                f"append to {journal}: the AppendService belongs to process {self._pid}, "
                f"which this process forked from: open a client and service in the child"
            )
        deps = frozenset(dependencies) if dependencies else _NO_DEPENDENCIES
        me = threading.get_ident()

        new = False
        chain = None if self._closed else self._chains.get(journal)  # Fast path: no _mu.
        while True:
            if chain is None:
                with self._mu:
                    if self._closed:
                        raise AppendServiceClosed(
                            f"append to {journal}: the AppendService is closed"
                        )
                    chain = self._chains.get(journal)
                    if chain is None:
                        validate_journal_name(journal)
                        chain = _Chain(journal, self._errs.get(journal))
                        self._chains[journal] = chain
                        self._active += 1
                        self._idle.clear()
                        new = True
            if chain.owner == me:
                raise RuntimeError(
                    f"an AsyncAppend of {journal} is already held by this thread; "
                    "release it before starting another"
                )
            chain.lock.acquire()
            chain.owner = me
            if not chain.finished:
                break
            chain.owner = None
            chain.lock.release()  # Its dispatcher exited meanwhile; take the new chain.
            chain = None

        if new:
            self._spawn(chain)
        aa = chain.tail
        if (
            aa is None
            or aa.checkpoint > self.append_cutoff
            or aa._key != key
            or (key is not None and aa.request != req)
            or (deps and not deps <= aa.dependencies)
        ):
            if req is None:
                req = pb.AppendRequest(journal=journal)
            aa = AsyncAppend(self, chain, req, key, deps)
            chain.queue.append(aa)
            chain.tail = aa
        return chain, aa

    def pending_except(self, journal: str = "") -> set[OpFuture]:
        """Operations that complete once every append queued so far to journals other than
        `journal` is done (all journals, for ""); failed journals are included as failed
        operations. Pass it as `dependencies` to order an append after all those."""
        out: set[OpFuture] = set()
        with self._mu:
            for name, err in self._errs.items():
                if name != journal:
                    out.add(finished_operation(err))
            for name, chain in self._chains.items():
                if name != journal:
                    try:
                        out.add(chain.queue[-1])
                    except IndexError:
                        if chain.err is not None:
                            out.add(finished_operation(chain.err))
        return out

    def clear_error(self, journal: str) -> BaseException | None:
        """Forget a journal's terminal error so that it takes appends again; returns it.

        Appends queued after the failure that have not failed yet (the journal's dispatcher
        is still draining them) go out once it is cleared."""
        with self._mu:
            err = self._errs.pop(journal, None)
            chain = self._chains.get(journal)
            if chain is not None and not chain.finished and (chain.err or err) is not None:
                err = err or chain.err
                chain.cleared = True
            return err

    async def wait_all(self) -> None:
        """Wait for every append queued so far; raise the first failure among them."""
        errors: list[BaseException] = []
        for op in self.pending_except(""):
            try:
                await op
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def wait_all_sync(self, timeout: float | None = None) -> None:
        """`wait_all` for threads other than the service's loop."""
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("wait_all_sync would block the AppendService's own event loop")
        first: BaseException | None = None
        for op in self.pending_except(""):
            err = op.error(timeout)
            if err is not None and first is None:
                first = err
        if first is not None:
            raise first

    # Lifecycle ----------------------------------------------------------------------------

    async def close(self, *, cancel: bool = False) -> None:
        """Stop taking appends, wait for (or with `cancel`, abandon) the queued ones, and
        release the buffers. Abandoned appends fail with `AppendServiceClosed`."""
        with self._mu:
            self._closed = True
            tasks = list(self._tasks)
        if cancel:
            for task in tasks:
                task.cancel()
        await self._idle.wait()
        self._pool.close()

    async def __aenter__(self) -> AppendService:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close(cancel=exc is not None)

    # Dispatch -----------------------------------------------------------------------------

    def _spawn(self, chain: _Chain) -> None:
        if threading.get_ident() == self._loop_thread:
            self._start_task(chain)
        else:
            self.loop.call_soon_threadsafe(self._start_task, chain)

    def _start_task(self, chain: _Chain) -> None:
        task = self.loop.create_task(self._serve(chain), name=f"append-service:{chain.journal}")
        with self._mu:
            self._tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, chain))

    def _task_done(self, chain: _Chain, task: asyncio.Task[None]) -> None:
        if not chain.finished:
            # Cancelled (by close), or failed: fail whatever it had queued.
            closed = AppendServiceClosed(f"append to {chain.journal}: the AppendService was closed")
            if not task.cancelled():
                closed.__cause__ = task.exception()
            self._abandon(chain, closed)
        with self._mu:
            self._tasks.discard(task)
            self._active -= 1
            if self._active == 0:
                # Under _mu, as `_hold` (any thread) counts a new dispatcher in and clears it:
                # set after the lock, it could follow such a clear and say idle while one is due.
                self._idle.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("append dispatcher failed", exc_info=task.exception())

    def _unlock(self, chain: _Chain) -> None:
        chain.owner = None
        chain.lock.release()
        waiter = chain.waiter
        if waiter is not None:
            chain.waiter = None
            self.loop.call_soon_threadsafe(_wake, waiter)

    async def _lock(self, chain: _Chain) -> None:
        """Take the chain's lock without blocking the event loop."""
        me = threading.get_ident()
        if chain.lock.acquire(blocking=False):
            chain.owner = me
            return
        while True:
            waiter: asyncio.Future[None] = self.loop.create_future()
            chain.waiter = waiter
            if chain.lock.acquire(blocking=False):
                chain.waiter = None
                chain.owner = me
                return
            await waiter

    async def _serve(self, chain: _Chain) -> None:
        """Dispatch the chain's appends in order until none remain."""
        poison = chain.err  # A terminal failure: every later append of the journal fails.
        while True:
            await self._lock(chain)
            try:
                with self._mu:
                    if chain.cleared:  # clear_error: the journal takes appends again.
                        chain.cleared = False
                        poison = chain.err = None
                    if not chain.queue:
                        chain.finished = True
                        if self._chains.get(chain.journal) is chain:
                            del self._chains[chain.journal]
                        if poison is not None:
                            self._errs[chain.journal] = poison
                        return
                aa = chain.queue[0]
                if aa is chain.tail:
                    chain.tail = None  # Later writes go to a new append.
            finally:
                self._unlock(chain)

            buf, aa._buf = aa._buf, None
            err: BaseException | None = None
            if poison is None:
                for dep in aa.dependencies:
                    dep_err = await _outcome(dep)
                    if dep_err is not None:
                        err = DependencyFailed(
                            f"append to {chain.journal}: a dependency failed: {dep_err}"
                        )
                        err.__cause__ = dep_err
                        break
                if err is None and aa._released and buf is not None:
                    err = await self._dispatch(aa, buf)
                poison = chain.err = err
            else:
                err = AppendServiceError(
                    f"append to {chain.journal}: an earlier append failed: {poison}"
                )
                err.__cause__ = poison
            if buf is not None:
                self._pool.put(buf)
            chain.queue.popleft()
            aa.resolve(err)

    def _abandon(self, chain: _Chain, err: BaseException) -> None:
        with self._mu:
            chain.finished = True
            if self._chains.get(chain.journal) is chain:
                del self._chains[chain.journal]
        while chain.queue:
            aa = chain.queue.popleft()
            if aa._commit_sent and isinstance(err, AppendServiceClosed):
                in_doubt = AppendServiceClosed(
                    f"{err}, after the append's commit was sent: it may have committed"
                )
                in_doubt.may_have_committed = True
                in_doubt.__cause__ = err.__cause__
                aa.resolve(in_doubt)
            else:
                aa.resolve(err)

    async def _dispatch(self, aa: AsyncAppend, buf: AppendBuffer) -> BaseException | None:
        """Append the content until the broker commits it (None) or refuses it for good."""
        attempt = 0
        while True:
            appender = Appender(self.client, aa.request, chunk_size=self.chunk_size)
            try:
                await appender.start()
                for chunk in buf.chunks(aa.checkpoint, self.chunk_size):
                    await appender.write(chunk)
                aa.response = await appender.commit()
                return None
            except asyncio.CancelledError:
                aa._commit_sent |= appender.commit_sent
                await appender.abort()
                raise
            except Exception as exc:
                aa._commit_sent |= appender.commit_sent
                await appender.abort()
                if is_terminal_append_error(exc):
                    return exc
                level = logging.WARNING if attempt else logging.INFO
                log.log(
                    level,
                    "append failed (will retry)",
                    extra={
                        "journal": aa.journal,
                        "bytes": aa.checkpoint,
                        "attempt": attempt,
                        "err": str(exc) or type(exc).__name__,
                        "may_have_committed": appender.commit_sent,
                    },
                )
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    def __repr__(self) -> str:
        return f"AppendService({self.client.address!r}, journals={len(self._chains)})"


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _outcome(op: OpFuture) -> BaseException | None:
    try:
        await op
    except Exception as exc:
        return exc
    return None


def pending_journals(ops: Collection[OpFuture]) -> list[str]:
    """Journals of the AsyncAppends among `ops` (for logging and tests)."""
    return sorted({op.journal for op in ops if isinstance(op, AsyncAppend)})
