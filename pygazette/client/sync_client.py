"""Synchronous facade over the async client, for scripts, notebooks and threads.

`SyncJournalClient` owns a private event loop running on a background thread, and runs the
async implementation there: the facade only marshals calls and results, it holds no logic of
its own. Methods may be called from any thread except the facade's own loop thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pygazette.client.append_service import AppendService
from pygazette.client.appender import CHUNK_SIZE, AppendContent, Appender, BytesLike, append
from pygazette.client.fragments import list_all_fragments
from pygazette.client.journal_client import JournalClient, broker_address_from_env
from pygazette.client.list_apply import apply_journals_in_batches, get_journal, list_journals
from pygazette.client.retry_reader import read_journal
from pygazette.protocol.pb import protocol_pb2 as pb

T = TypeVar("T")

log = logging.getLogger(__name__)


class SyncClientClosed(RuntimeError):
    """The SyncJournalClient was closed (before or while the call ran)."""


class SyncClientForked(SyncClientClosed):
    """The SyncJournalClient was opened by the process this one was forked from: fork copies
    neither its loop's thread nor, safely, its gRPC channel, so a child opens its own."""


class _LoopThread:
    """An asyncio event loop running forever on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        # Set (under _lock) once `stop` began: nothing is scheduled on the loop after.
        self.closing = False
        self._lock = threading.Lock()
        # Results callers wait for (`run`): any still pending once the loop is closed (its
        # coroutine outlived the stop timeout) is cancelled, so no caller waits for ever.
        self._waited: set[Future[Any]] = set()
        # The process whose thread runs the loop: in a child forked from it, nothing does.
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def forked(self) -> bool:
        """True in a child forked from the process that started the loop."""
        return os.getpid() != self.pid

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (re-raising its exception)."""
        if self.forked:
            coro.close()
            raise SyncClientForked(
                f"SyncJournalClient was opened in process {self.pid}, and this process "
                f"({os.getpid()}) is a child forked from it: open a new client in the child"
            )
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncJournalClient called from its own event loop thread")
        with self._lock:
            if self.closing:
                coro.close()
                raise SyncClientClosed("SyncJournalClient is closed")
            future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._waited.add(future)
        try:
            return future.result(timeout)
        except CancelledError:
            if self.closing:  # `stop` cancelled it: the client was closed meanwhile.
                raise SyncClientClosed("SyncJournalClient was closed") from None
            raise
        except BaseException:
            future.cancel()  # Interrupted (KeyboardInterrupt, timeout): stop the coroutine too.
            raise
        finally:
            with self._lock:
                self._waited.discard(future)

    def stop(self, last: Coroutine[Any, Any, None] | None = None) -> None:
        """Cancel what still runs on the loop (callers waiting on it get RuntimeError), run
        `last`, then stop and close the loop. In a forked child, only marks it closed: the
        loop, its thread and what it holds are the parent's (`last` is not run)."""
        if self.forked:
            if last is not None:
                last.close()
            # Not under _lock: a thread of the parent may have held it at the fork, and the
            # child's copy then stays held for ever. Nothing is scheduled on the loop in a
            # child (`run` refuses first), so the flag needs no lock here.
            self.closing = True
            return
        if threading.current_thread() is self._thread:
            if last is not None:
                last.close()
            raise RuntimeError("SyncJournalClient closed from its own event loop thread")
        with self._lock:
            if self.closing:
                if last is not None:
                    last.close()
                return
            self.closing = True
        try:
            asyncio.run_coroutine_threadsafe(_shut_down(last), self.loop).result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()
            with self._lock:
                stranded, self._waited = list(self._waited), set()
            for future in stranded:
                # Failed rather than cancelled: a cancellation would be passed on to its
                # task, on the closed loop.
                with contextlib.suppress(RuntimeError, InvalidStateError):
                    if future.set_running_or_notify_cancel():
                        future.set_exception(SyncClientClosed("SyncJournalClient was closed"))


async def _shut_down(last: Coroutine[Any, Any, None] | None) -> None:
    """Cancel every other task of the running loop, wait (briefly) for them to end, then
    run `last`."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_SECONDS)
    await asyncio.get_running_loop().shutdown_asyncgens()  # E.g. reads stopped between chunks.
    if last is not None:
        await last


# How long closing a SyncJournalClient waits for its cancelled tasks to end.
_STOP_TIMEOUT_SECONDS = 5.0


async def _new_client(address: str, options: dict[str, Any]) -> JournalClient:
    return JournalClient(address, **options)


async def _new_append_service(client: JournalClient, options: dict[str, Any]) -> AppendService:
    return AppendService(client, **options)


async def _next(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()


async def _pull_in_thread(iterator: Iterator[BytesLike]) -> AsyncIterator[BytesLike]:
    """Draw from a blocking iterator on worker threads, keeping the event loop free."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, iterator, done)
        if item is done:
            return
        if not isinstance(item, (bytes, bytearray, memoryview)):
            raise TypeError(f"append content must be bytes, not {type(item).__name__}")
        yield item


def _adapt_content(content: AppendContent) -> AppendContent:
    if isinstance(content, (bytes, bytearray, memoryview, Sequence)):
        return content  # Replayable, and iterating it cannot block.
    if isinstance(content, Iterable):
        return _pull_in_thread(iter(content))
    return content


class SyncAppender:
    """Blocking counterpart of `Appender`: write, then commit (or abort)."""

    def __init__(self, owner: SyncJournalClient, appender: Appender) -> None:
        self._owner = owner
        self.appender = appender

    @property
    def response(self) -> pb.AppendResponse | None:
        return self.appender.response

    def write(self, data: BytesLike) -> None:
        self._owner._run(self.appender.write(data))

    def commit(self) -> pb.AppendResponse:
        return self._owner._run(self.appender.commit())

    def abort(self) -> None:
        self._owner._run(self.appender.abort())

    def __enter__(self) -> SyncAppender:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._owner._run(self.appender.__aexit__(exc_type, exc, tb))


class SyncJournalClient:
    """A blocking client of one broker (address defaults to $BROKER_ADDRESS, then
    http://localhost:8080). Use as a context manager, or call `close()`.

    A client still open when the interpreter exits is closed then, as an open file is
    flushed: its append services' queued appends are sent first (for up to
    `exit_flush_seconds`; those still unsent after it are logged as lost), rather than
    dropped silently with the loop's daemon thread."""

    # How long closing at interpreter exit waits for the append services' queued appends.
    exit_flush_seconds = 30.0

    def __init__(self, address: str | None = None, **client_options: Any) -> None:
        self.address = address or broker_address_from_env()
        self._loop = _LoopThread(f"pygazette-client-{self.address}")
        self._services: list[AppendService] = []
        try:
            self.client = self._loop.run(_new_client(self.address, client_options))
        except BaseException:
            self._loop.stop()
            raise
        # A child forked from this process inherits the atexit hook but not the loop's
        # thread (`_close_at_exit`).
        atexit.register(self._close_at_exit)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine of the async API (built on `self.client`) on the facade's loop and
        return its result."""
        return self._loop.run(coro, timeout)

    def iterate(self, agen: AsyncGenerator[T, None]) -> Iterator[T]:
        """Iterate an async generator of the async API on the facade's loop."""
        return self._iterate(agen)

    def append_service(self, **options: Any) -> AppendService:
        """An AppendService running on the facade's loop. Its `start_append`, `append`,
        `pending_except` and `AsyncAppend` methods work from any thread; wait with
        `op.result()` or `service.wait_all_sync()`, close with `close_append_service`."""
        service = self._run(_new_append_service(self.client, options))
        self._services.append(service)
        return service

    def close_append_service(self, service: AppendService, *, cancel: bool = False) -> None:
        """Wait for the service's queued appends (unless `cancel`) and close it."""
        self._run(service.close(cancel=cancel))
        with contextlib.suppress(ValueError):  # Another thread closed it at the same time.
            self._services.remove(service)

    # Journals -----------------------------------------------------------------------------

    def list_journals(self, selector: str | pb.LabelSelector = "") -> list[pb.ListResponse.Journal]:
        return self._run(list_journals(self.client, selector))

    def get_journal(self, name: str) -> pb.JournalSpec:
        return self._run(get_journal(self.client, name))

    def apply_journals(
        self,
        changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
        batch_size: int = 0,
    ) -> pb.ApplyResponse:
        return self._run(apply_journals_in_batches(self.client, changes, batch_size))

    def list_all_fragments(
        self,
        journal: str,
        *,
        begin_mod_time: int = 0,
        end_mod_time: int = 0,
        signature_ttl: float | None = None,
    ) -> list[pb.FragmentsResponse._Fragment]:
        return self._run(
            list_all_fragments(
                self.client,
                journal,
                begin_mod_time=begin_mod_time,
                end_mod_time=end_mod_time,
                signature_ttl=signature_ttl,
            )
        )

    # Content ------------------------------------------------------------------------------

    def append(
        self, journal: str, content: AppendContent = b"", **options: Any
    ) -> pb.AppendResponse:
        """Append atomically, with `append`'s safe retries. `content` is bytes or an iterable
        of bytes (a generator is drawn from on a worker thread)."""
        return self._run(append(self.client, journal, _adapt_content(content), **options))

    def appender(
        self,
        journal: str,
        *,
        offset: int = 0,
        check_registers: pb.LabelSelector | None = None,
        union_registers: pb.LabelSet | None = None,
        subtract_registers: pb.LabelSet | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> SyncAppender:
        """A streaming append: `with client.appender(j) as a: a.write(...)` commits on exit."""
        return SyncAppender(
            self,
            Appender(
                self.client,
                journal,
                offset=offset,
                check_registers=check_registers,
                union_registers=union_registers,
                subtract_registers=subtract_registers,
                chunk_size=chunk_size,
            ),
        )

    def read(
        self,
        journal: str,
        *,
        offset: int = 0,
        block: bool = False,
        end_offset: int = 0,
        do_not_proxy: bool = False,
        file_root: str | Path | None = None,
    ) -> Iterator[bytes]:
        """Chunks of the journal from `offset` (see `read_journal`): up to the write head when
        not blocking, up to `end_offset` when set. Close the iterator to stop early."""
        agen = read_journal(
            self.client,
            journal,
            offset=offset,
            block=block,
            end_offset=end_offset,
            do_not_proxy=do_not_proxy,
            file_root=file_root,
        )
        return self._iterate(agen)

    def _iterate(self, agen: AsyncGenerator[T, None]) -> Iterator[T]:
        try:
            while True:
                try:
                    chunk = self._run(_next(agen))
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            if not self._loop.closing:
                with contextlib.suppress(SyncClientClosed):  # Closed meanwhile: it ends too.
                    self._run(agen.aclose())

    # Lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close append services (after their queued appends), the channel, and the
        background loop. Idempotent. In a child forked from the process that opened the
        client, it only marks the child's copy closed: what the client holds and has queued
        is the parent's, and the parent's `close` sends and closes it."""
        atexit.unregister(self._close_at_exit)
        if self._loop.closing:
            return
        if self._loop.forked:
            self._loop.stop()
            return
        try:
            for service in list(self._services):
                self.close_append_service(service)
        finally:
            # Reads and other calls still running in other threads end (RuntimeError there)
            # before the channel closes and the loop stops: none is left waiting for ever.
            self._loop.stop(self.client.close())

    def _close_at_exit(self) -> None:
        """`close`, bounded by `exit_flush_seconds`: the interpreter is exiting with this
        client open (its loop runs on a daemon thread, which exit would stop mid-append).
        Not in a child forked from the process that opened it: fork doesn't copy the loop's
        thread, so nothing would run what is sent to the loop (the child's exit waited
        `exit_flush_seconds`, then for ever on the loop's stop); what is queued is the
        parent's to send."""
        if self._loop.closing or self._loop.forked:
            return
        deadline = time.monotonic() + self.exit_flush_seconds
        try:
            for service in list(self._services):
                remaining = max(0.0, deadline - time.monotonic())
                try:
                    self._loop.run(service.close(), remaining)
                except TimeoutError:
                    unsent = [op for op in service.pending_except("") if not op.done()]
                    log.warning(
                        "SyncJournalClient left open at exit: %d queued appends were not "
                        "committed within %.0f s and are lost (close the client, or wait for "
                        "the appends, before exiting)",
                        len(unsent),
                        self.exit_flush_seconds,
                    )
                except Exception as exc:  # A failed append: reported, the rest still closed.
                    log.warning("SyncJournalClient closing at exit: %s", exc)
        finally:
            self._loop.stop(self.client.close())

    def __enter__(self) -> SyncJournalClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SyncJournalClient({self.address!r})"
