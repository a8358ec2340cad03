"""Running the async client from Spark's synchronous Python workers.

Each Python process (the driver's planner workers, executor workers) gets one asyncio loop on
a daemon thread, and one `JournalClient` per broker address on it, reused by every task the
process runs (Spark reuses Python workers). A forked child notices the fork and starts its
own loop: a loop and gRPC channels never cross a fork.

A broker is named by its address, or by a `BrokerTarget` (its address and the TLS material to
reach it with); either is picklable and travels to executors with the options.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pygazette.auth.configured import authorizer_from
from pygazette.auth.tls import ClientTLS
from pygazette.client.journal_client import JournalClient

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BrokerAuth:
    """How RPCs to a broker are authorized: pre-shared keys to sign tokens with, or a token
    (both empty: not at all). Strings, so they travel to executors with the options."""

    keys: str = field(default="", repr=False)
    token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class BrokerTarget:
    """A broker's address and the TLS material ("https://" addresses) to reach it with."""

    address: str
    tls: ClientTLS | None = None
    auth: BrokerAuth = field(default_factory=BrokerAuth)

    def __str__(self) -> str:
        return self.address


Broker = str | BrokerTarget


class _LoopThread:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.clients: dict[Broker, JournalClient] = {}
        self._thread = threading.Thread(target=self._run, name="pygazette-spark", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("pygazette.spark.runtime called from its own loop thread")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise


_lock = threading.Lock()
_runtime: _LoopThread | None = None


def _current() -> _LoopThread:
    global _runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = _LoopThread()
        return _runtime


async def _client(rt: _LoopThread, broker: Broker) -> JournalClient:
    client = rt.clients.get(broker)
    if client is None:
        if isinstance(broker, BrokerTarget):
            client = JournalClient(
                broker.address,
                tls=broker.tls,
                auth=authorizer_from(broker.auth.keys, broker.auth.token),
            )
        else:
            client = JournalClient(broker)
        rt.clients[broker] = client
    return client


def call(broker: Broker, fn: Callable[[JournalClient], Awaitable[T]]) -> T:
    """Run `fn(client)` on this process's loop, with the shared client of `broker`."""
    rt = _current()

    async def go() -> T:
        return await fn(await _client(rt, broker))

    return rt.run(go())


def iterate(
    broker: Broker, fn: Callable[[JournalClient], AsyncIterator[T]], *, read_ahead: int = 4
) -> Generator[T, None, None]:
    """Iterate `fn(client)`, an async iterator, from synchronous code.

    A task on the loop thread draws up to `read_ahead` items ahead of the caller, so I/O and
    decompression overlap the caller's work on its own thread. Errors of the iterator are
    raised to the caller in order. Closing the returned generator cancels the task (which
    closes `fn`'s iterator).
    """
    rt = _current()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=max(1, read_ahead))
    tasks: list[asyncio.Task[None]] = []

    async def produce() -> None:
        agen = fn(await _client(rt, broker))
        try:
            async for item in agen:
                await queue.put((_ITEM, item))
            await queue.put((_END, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await queue.put((_ERROR, exc))
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()

    async def start() -> None:
        tasks.append(asyncio.get_running_loop().create_task(produce()))

    async def stop() -> None:
        task = tasks[0]
        while not task.done():
            task.cancel()
            # A cancellation can be lost (Python 3.11's asyncio.wait_for returns the result of
            # an inner read that completed as it was cancelled): the iterator then goes on,
            # and its next put would wait for ever on the full queue nobody reads any more.
            # Empty the queue and cancel again until the task ends.
            while not queue.empty():
                queue.get_nowait()
            await asyncio.wait([task], timeout=0.05)
        await asyncio.gather(task, return_exceptions=True)

    rt.run(start())
    try:
        while True:
            kind, item = rt.run(queue.get())
            if kind == _END:
                return
            if kind == _ERROR:
                raise item
            yield item
    finally:
        rt.run(stop())


_ITEM, _END, _ERROR = 0, 1, 2
