"""A loopback TCP load balancer for fault tests: one address in front of several servers.

Clients that know a single address (`--broker`, `--consumer`) reach a cluster through it, as
they would through a service's load balancer: each new connection goes to the next server,
round robin, skipping servers marked down (`mark(port, up=False)`, what a health check would
do for a frozen process) and servers that refuse the connection (a killed process). Open
connections are left alone. It runs on its own event loop thread, usable from any test.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from tests.support.ports import start_on_free_port
from tests.support.tcp_proxy import relay


class TcpBalancer:
    def __init__(self, target_ports: Sequence[int]) -> None:
        self.targets = list(target_ports)
        self.down: set[int] = set()
        self.port = 0  # Listening on a free one (another if it was taken), below.
        self._next = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self.port = start_on_free_port(lambda port: self._call(self._start(port)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def mark(self, port: int, *, up: bool) -> None:
        """Route new connections to `port` again (up) or not (down)."""
        if up:
            self.down.discard(port)
        else:
            self.down.add(port)

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(30)

    async def _start(self, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return port

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        n = len(self.targets)
        if n == 0:
            return None  # No targets yet (a harness sets them once its servers started).
        start = self._next
        self._next = (self._next + 1) % n
        order = [self.targets[(start + i) % n] for i in range(n)]
        # Servers marked down are tried last: better than refusing the client outright.
        order.sort(key=lambda port: port in self.down)
        for port in order:
            with contextlib.suppress(OSError):
                async with asyncio.timeout(2):
                    return await asyncio.open_connection("127.0.0.1", port)
        return None

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            target = await self._connect()
        except TimeoutError:
            target = None
        if target is None:
            client_w.close()
            return
        target_r, target_w = target
        self._writers.update((client_w, target_w))

        await relay(client_r, client_w, target_r, target_w)
        self._writers.difference_update((client_w, target_w))

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
