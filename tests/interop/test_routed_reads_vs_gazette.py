"""pygazette's RoutedJournalClient against a cluster of each system: reads and appends go to
their journal's primary once a response named it (an append's too), and survive that
primary being killed (the route is forgotten, the RPC goes back through the client's own
broker, and follows the journal to its new primary)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import pytest

from pygazette.client import RetryReader, append, apply_journals, is_unavailable
from pygazette.client.list_apply import get_journal
from pygazette.client.routed_client import RoutedJournalClient
from pygazette.client.suspension import suspend_journal
from pygazette.protocol.errors import BrokerError, Suspended
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from tests.support.broker_cluster import SYSTEMS, BrokerCluster
from tests.support.gazette_process import EtcdServer, GazetteBinaries

J = "routed/journal"
WAIT_SECONDS = 60.0


async def route_of(client: RoutedJournalClient, want: int) -> pb.Route:
    """The journal's route once it has a primary and `want` members."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        req = pb.ListRequest(selector=parse_selector(f"name={J}"))
        listing = [r async for r in client.rpc_list(req)]
        route = listing[0].journals[0].route
        if route.primary >= 0 and len(route.members) == want:
            return route
        assert time.monotonic() < deadline, listing
        await asyncio.sleep(0.05)


async def append_retrying(client: RoutedJournalClient, data: bytes) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            await append(client, J, data)
            return
        except (BrokerError, grpc.aio.AioRpcError) as exc:
            # The client's broker proxies to the killed primary until the journal moves.
            assert not isinstance(exc, grpc.aio.AioRpcError) or is_unavailable(exc), exc
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)


async def read_at_least(rr: RetryReader, n: int) -> bytes:
    got = b""
    while len(got) < n:
        got += await asyncio.wait_for(rr.read(), WAIT_SECONDS)
    return got


async def _suspended(client: RoutedJournalClient) -> bool:
    with contextlib.suppress(BrokerError):  # Until the journal is assigned.
        return await suspend_journal(client, J, force=True)
    return False


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_routed_read_follows_its_journal_past_a_killed_primary(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path, system: str
) -> None:
    cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/routed", brokers=3)
    cluster.start()

    async def run() -> None:
        spec = pb.JournalSpec(name=J, replication=2)
        spec.fragment.length = 1 << 20
        spec.fragment.compression_codec = pb.NONE
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 1
        # A client of the one broker the journal is not assigned to (known once assigned).
        async with contextlib.AsyncExitStack() as stack:
            first = await stack.enter_async_context(RoutedJournalClient(cluster.endpoints[0]))
            await apply_journals(first, [pb.ApplyRequest.Change(upsert=spec)])
            route = await route_of(first, 2)
            ids = [f"{system}-{i}" for i in range(3)]
            members = {ids.index(m.suffix) for m in route.members}
            (outside,) = set(range(3)) - members
            primary = ids.index(route.members[route.primary].suffix)
            client = await stack.enter_async_context(
                RoutedJournalClient(cluster.endpoints[outside])
            )
            await append_retrying(client, b"o")
            # The first append went through the client's own broker, whose answer named the
            # primary: the next append, and reads, go to the primary itself.
            assert client.routed_appends == 0
            await append_retrying(client, b"ne\n")
            assert client.routed_appends == 1

            rr = RetryReader(client, J, block=True)
            assert await read_at_least(rr, 4) == b"one\n"
            second = RetryReader(client, J, block=True)
            assert await read_at_least(second, 4) == b"one\n"
            assert client.routed_reads == 2
            await second.aclose()

            pending = asyncio.create_task(rr.read())
            await asyncio.to_thread(cluster.brokers[primary].kill)
            await append_retrying(client, b"two\n")
            assert await asyncio.wait_for(pending, WAIT_SECONDS) == b"two\n"
            await rr.aclose()

            # A new read finds the journal where it went. (A broker that joined its route
            # since may serve it before it holds the content: Gazette's answers
            # OFFSET_NOT_YET_AVAILABLE until the content's fragment is persisted and listed.)
            third = RetryReader(client, J, block=True, end_offset=8)
            got = b""
            while chunk := await asyncio.wait_for(third.read(), WAIT_SECONDS):
                got += chunk
            assert got == b"one\ntwo\n"
            await third.aclose()

    try:
        asyncio.run(run())
    finally:
        cluster.kill()


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_routed_do_not_proxy_read_sent_to_a_broker_without_a_replica_goes_to_one(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path, system: str
) -> None:
    """A do_not_proxy read sent to a broker holding no replica is answered NOT_JOURNAL_BROKER
    with the journal's route in its header; the RetryReader's next attempt goes to the
    primary that route names (as Gazette's routed client updates its route from the header)."""
    cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/routed", brokers=2)
    cluster.start()

    async def run() -> None:
        spec = pb.JournalSpec(name=J, replication=1)
        spec.fragment.length = 1 << 20
        spec.fragment.compression_codec = pb.NONE
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 1
        async with contextlib.AsyncExitStack() as stack:
            first = await stack.enter_async_context(RoutedJournalClient(cluster.endpoints[0]))
            await apply_journals(first, [pb.ApplyRequest.Change(upsert=spec)])
            route = await route_of(first, 1)
            ids = [f"{system}-{i}" for i in range(2)]
            (outside,) = {0, 1} - {ids.index(route.members[0].suffix)}
            client = await stack.enter_async_context(
                RoutedJournalClient(cluster.endpoints[outside])
            )
            await append_retrying(first, b"one\n")  # (`client` learns no route from it.)
            rr = RetryReader(client, J, do_not_proxy=True, end_offset=4)
            assert await asyncio.wait_for(rr.read(), 10) == b"one\n"
            assert client.routed_reads == 1
            await rr.aclose()

    try:
        asyncio.run(run())
    finally:
        cluster.kill()


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_blocking_read_of_a_suspended_journal_waits_for_its_resumption(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path, system: str
) -> None:
    """A fully suspended journal answers reads SUSPENDED. A non-blocking RetryReader raises
    it; a blocking one keeps asking (pygazette's choice: Gazette's RetryReader surfaces it)
    and returns what the append resuming the journal wrote."""
    cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/routed", brokers=1)
    cluster.start()

    async def run() -> None:
        spec = pb.JournalSpec(name=J, replication=1)
        spec.fragment.length = 1 << 20
        spec.fragment.compression_codec = pb.NONE
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 1
        async with RoutedJournalClient(cluster.endpoints[0]) as client:
            await apply_journals(client, [pb.ApplyRequest.Change(upsert=spec)])
            await route_of(client, 1)
            # An empty journal suspends fully (one with content, partially first).
            deadline = time.monotonic() + WAIT_SECONDS
            while not await _suspended(client):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            while (await get_journal(client, J)).suspend.level != pb.JournalSpec.Suspend.FULL:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)

            with pytest.raises(Suspended):
                await RetryReader(client, J).read()
            rr = RetryReader(client, J, block=True)
            pending = asyncio.create_task(rr.read())
            done, _ = await asyncio.wait({pending}, timeout=1.0)
            assert not done
            await append_retrying(client, b"two\n")
            assert await asyncio.wait_for(pending, WAIT_SECONDS) == b"two\n"
            assert rr.offset == 4
            await rr.aclose()

    try:
        asyncio.run(run())
    finally:
        cluster.kill()
