"""A loopback TCP proxy for fault tests: it can lose responses, or cut a server off.

It forwards connections to a target port. `blackhole()` makes it drop every byte the target
sends back (requests still go through), as a network losing responses would; `reset()` then
cuts every open connection, so clients see a transport failure and reconnect. `cut()` resets
every connection and refuses new ones until `restore()`, so the target looks down without
losing its state. `stall_open()` drops what the target sends back on the connections open
now only (new ones forward normally), as a connection silently lost in the network would be.
It runs on its own event loop thread, usable from any test.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tests.support.ports import start_on_free_port


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0  # Listening on a free one (another if it was taken), below.
        self._blackhole = False
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._stalled: set[asyncio.StreamWriter] = set()  # Client sides of stalled ones.
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self.port = start_on_free_port(lambda port: self._call(self._start(port)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return self.url

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(30)

    async def _start(self, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return port

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._cut:
            abort_connection(client_w)
            return
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, target_w))

        await relay(
            client_r,
            client_w,
            target_r,
            target_w,
            lambda: self._blackhole or client_w in self._stalled,
        )
        self._writers.difference_update((client_w, target_w))
        self._stalled.discard(client_w)

    def blackhole(self) -> None:
        """Drop everything the target sends back, from now on (until `reset`)."""
        self._blackhole = True

    def stall_open(self) -> None:
        """Drop what the target sends back on the connections open now (not on new ones)."""

        async def stall() -> None:
            self._stalled.update(self._writers)

        self._call(stall())

    def reset(self) -> None:
        """Cut every open connection, and forward normally again."""

        self._call(self._abort_all(cut=False))

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until `restore`."""
        self._call(self._abort_all(cut=True))

    def restore(self) -> None:
        """Accept and forward connections again."""
        self._cut = False

    async def _abort_all(self, *, cut: bool) -> None:
        self._cut = cut
        for w in list(self._writers):
            abort_connection(w)
        self._writers.clear()
        self._blackhole = False

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def relay(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    target_r: asyncio.StreamReader,
    target_w: asyncio.StreamWriter,
    drop_responses: Callable[[], bool] = lambda: False,
) -> None:
    """Copy bytes both ways until either side closes (what the target sends back is dropped
    while `drop_responses()`); each side is closed when its source ends."""

    async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, responses: bool) -> None:
        try:
            while data := await r.read(1 << 16):
                if responses and drop_responses():
                    continue
                w.write(data)
                await w.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                w.close()

    await asyncio.gather(
        pump(client_r, target_w, False), pump(target_r, client_w, True), return_exceptions=True
    )


def abort_connection(w: asyncio.StreamWriter) -> None:
    """Close with a reset, as a failed network or a dead server would."""
    with contextlib.suppress(OSError):
        transport = w.transport
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:
            w.close()
