"""The chaos suite's network parts: the partitioning proxy and the balancer."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest

from tests.support.balancer import TcpBalancer
from tests.support.partition_proxy import PartitionProxy

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def tagged_server(tag: bytes) -> AsyncIterator[int]:
    """A server answering each line with `tag` + the line; yields its port."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while line := await r.readline():
                w.write(tag + line)
                await w.drain()
        w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def ask(port: int, line: bytes = b"ping\n") -> bytes:
    """One round trip through a new connection: the answer, or b"" if cut off."""
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return b""
    try:
        w.write(line)
        await w.drain()
        return await asyncio.wait_for(r.readline(), 5)
    except OSError:
        return b""
    finally:
        w.close()


async def test_partition_proxy_refuses_only_denied_processes() -> None:
    async with tagged_server(b"a:") as port:
        proxy = PartitionProxy(port, lambda: {"me": os.getpid()})
        try:
            assert await ask(proxy.port) == b"a:ping\n"
            # An open connection of a process that becomes denied is reset.
            r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
            w.write(b"one\n")
            assert await r.readline() == b"a:one\n"
            proxy.deny({"me"})
            with contextlib.suppress(OSError):
                w.write(b"two\n")
                await w.drain()
            assert await asyncio.wait_for(_read_or_reset(r), 5) == b""
            w.close()
            assert await ask(proxy.port) == b""  # And new ones are refused.
            assert proxy.refused >= 1
            # Processes the proxy doesn't know about still go through.
            other = PartitionProxy(port, lambda: {"someone-else": 1})
            try:
                other.deny({"someone-else"})
                assert await ask(other.port) == b"a:ping\n"
            finally:
                other.close()
            proxy.allow({"me"})
            assert await ask(proxy.port) == b"a:ping\n"
        finally:
            proxy.close()


async def _read_or_reset(r: asyncio.StreamReader) -> bytes:
    try:
        return await r.readline()
    except OSError:
        return b""


async def test_balancer_skips_servers_down_or_gone() -> None:
    async with tagged_server(b"a:") as port_a, tagged_server(b"b:") as port_b:
        lb = TcpBalancer([port_a, port_b])
        try:
            answers = {await ask(lb.port) for _ in range(4)}
            assert answers == {b"a:ping\n", b"b:ping\n"}  # Round robin.
            lb.mark(port_a, up=False)
            assert {await ask(lb.port) for _ in range(4)} == {b"b:ping\n"}
            lb.mark(port_a, up=True)
        finally:
            lb.close()
    async with tagged_server(b"c:") as port_c:
        closed = port_c
    async with tagged_server(b"d:") as port_d:
        lb = TcpBalancer([closed, port_d])  # Nothing listens on `closed` any more.
        try:
            assert {await ask(lb.port) for _ in range(4)} == {b"d:ping\n"}
        finally:
            lb.close()
