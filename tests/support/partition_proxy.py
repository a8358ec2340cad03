"""A loopback TCP proxy in front of one server that partitions the network by process.

Every process on loopback connects from 127.0.0.1, so a proxy cannot tell peers apart by
address. This one asks the kernel instead: for each connection it accepts, it finds the
socket's inode in /proc/net/tcp{,6} and the process holding it (among the processes it is
told about, by name), and refuses the connection if that name is denied. `deny(names)` also
resets the open connections of those processes; `allow(names)` lets them connect again.
Connections from processes it doesn't know (clients, tools) always go through.

A cluster whose members advertise these proxies, one in front of each member, can then cut a
member off from its peers one way (its proxy denies the peers: they cannot reach it) or both
ways (the peers' proxies deny it too), while clients still reach everyone. It runs on its own
event loop thread, usable from any test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from tests.support.ports import start_on_free_port
from tests.support.tcp_proxy import abort_connection, relay

# name -> pid of the processes a proxy can recognize (read at each connection: pids change
# as processes restart).
Owners = Callable[[], Mapping[str, int]]


def socket_inode(local_port: int, remote_port: int) -> int | None:
    """The inode of the loopback TCP socket bound to `local_port` and connected to
    `remote_port` (the connecting side of a connection), from /proc/net/tcp{,6}."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote = fields[1], fields[2]
            if (
                int(local.rsplit(":", 1)[1], 16) == local_port
                and int(remote.rsplit(":", 1)[1], 16) == remote_port
            ):
                return int(fields[9])
    return None


def holds_socket(pid: int, inode: int) -> bool:
    """Whether process `pid` has the socket `inode` open."""
    want = f"socket:[{inode}]"
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"{fd_dir}/{fd}") == want:
                return True
    return False


def owner_of(peer_port: int, proxy_port: int, owners: Mapping[str, int]) -> str | None:
    """Which of `owners` opened the connection from `peer_port` to `proxy_port`, if any."""
    inode = socket_inode(peer_port, proxy_port)
    if not inode:
        return None
    for name, pid in owners.items():
        if holds_socket(pid, inode):
            return name
    return None


class PartitionProxy:
    def __init__(self, target_port: int, owners: Owners) -> None:
        self.target_port = target_port
        self.port = 0  # Listening on a free one (another if it was taken), below.
        self.owners = owners
        self.denied: frozenset[str] = frozenset()
        self.refused = 0  # Connections refused so far.
        # Open connections: (client writer, target writer, owner name or None).
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter, str | None]] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self.port = start_on_free_port(lambda port: self._call(self._start(port)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(30)

    async def _start(self, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return port

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        peer = client_w.get_extra_info("peername")
        owner: str | None = None
        if peer is not None:
            owner = await asyncio.to_thread(owner_of, int(peer[1]), self.port, self.owners())
        if owner is not None and owner in self.denied:
            self.refused += 1
            abort_connection(client_w)
            return
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            abort_connection(client_w)
            return
        conn = (client_w, target_w, owner)
        self._conns.add(conn)

        await relay(client_r, client_w, target_r, target_w)
        self._conns.discard(conn)

    def deny(self, names: set[str] | frozenset[str]) -> None:
        """Refuse connections of these processes from now on, and reset their open ones."""
        self._call(self._set_denied(self.denied | names))

    def allow(self, names: set[str] | frozenset[str]) -> None:
        """Let these processes connect again."""
        self._call(self._set_denied(self.denied - names))

    async def _set_denied(self, denied: frozenset[str]) -> None:
        self.denied = denied
        for conn in list(self._conns):
            if conn[2] is not None and conn[2] in denied:
                abort_connection(conn[0])
                abort_connection(conn[1])
                self._conns.discard(conn)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for client_w, target_w, _ in list(self._conns):
                abort_connection(client_w)
                abort_connection(target_w)

            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
