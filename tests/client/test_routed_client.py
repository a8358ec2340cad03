"""RoutedJournalClient: reads go to the journal's primary once its route is known (from a
read's header or a listing), and back through the client's own broker when that fails."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from pygazette.client import Appender, JournalClient, Reader, append, routed_client
from pygazette.client.errors import ReaderCancelled
from pygazette.client.routed_client import (
    ENDPOINT_BACKOFF_SECONDS,
    PEER_SWEEP_SECONDS,
    RoutedJournalClient,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.client.fake_broker import (
    Abort,
    FakeBroker,
    Hang,
    committed,
    content,
    fake_broker,
    header,
    metadata,
)
from tests.support.ports import free_port

J = "a/journal"


@pytest.fixture
def primary() -> Iterator[FakeBroker]:
    yield from fake_broker()


def route_to(*endpoints: str, primary: int = 0) -> pb.Route:
    return pb.Route(
        members=[
            pb.ProcessSpec.ID(zone="local", suffix=f"broker-{i}") for i in range(len(endpoints))
        ],
        primary=primary,
        endpoints=endpoints,
    )


def routed(resp: pb.ReadResponse, route: pb.Route) -> pb.ReadResponse:
    """`resp` with a header naming the journal's `route` (as a broker's first response)."""
    h = header()
    h.process_id.CopyFrom(route.members[route.primary])
    h.route.CopyFrom(route)
    resp.header.CopyFrom(h)
    return resp


async def read_all(reader: Reader) -> bytes:
    async with reader:
        return b"".join([chunk async for chunk in reader])


async def test_a_read_goes_to_the_primary_its_first_read_named(
    fake: FakeBroker, primary: FakeBroker
) -> None:
    route = route_to(f"http://{primary.address}")
    fake.journal.read_scripts.append(
        [routed(metadata(0, begin=0, end=5), route), content(0, b"hello")]
    )
    primary.journal.read_scripts.append([metadata(5, begin=5, end=10), content(5, b"world")])
    async with RoutedJournalClient(fake.address) as client:
        assert client.read_rpc(J) is client.rpc_read  # Nothing known yet.
        assert await read_all(Reader(client, J, end_offset=5)) == b"hello"
        assert await read_all(Reader(client, J, offset=5, end_offset=10)) == b"world"
        assert client.routed_reads == 1
    assert [r.offset for r in fake.journal.read_requests] == [0]
    assert [r.offset for r in primary.journal.read_requests] == [5]


async def test_a_failed_routed_read_goes_back_through_the_own_broker(fake: FakeBroker) -> None:
    now = [100.0]
    gone = free_port()  # Nothing listens there.
    fake.journal.read_scripts.append([metadata(0, begin=0, end=2), content(0, b"ok")])
    async with RoutedJournalClient(fake.address, clock=lambda: now[0]) as client:
        client.note_route(J, route_to(f"http://127.0.0.1:{gone}"))
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await read_all(Reader(client, J, end_offset=2))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert client.read_rpc(J) is client.rpc_read  # Forgotten.
        assert await read_all(Reader(client, J, end_offset=2)) == b"ok"
        # Named again (a listing, another read's header): not routed to while backing off.
        client.note_route(J, route_to(f"http://127.0.0.1:{gone}"))
        assert client.read_rpc(J) is client.rpc_read
        now[0] += ENDPOINT_BACKOFF_SECONDS
        assert client.read_rpc(J) is not client.rpc_read


async def test_routes_noted(fake: FakeBroker, primary: FakeBroker) -> None:
    other = f"http://{primary.address}"
    async with RoutedJournalClient(fake.address, max_routes=2) as client:
        # Keyed by name: a metadata path segment doesn't matter.
        client.note_route(J + ";some/meta", route_to(other))
        routed_rpc = client.read_rpc(J)
        assert routed_rpc is not client.rpc_read
        assert client.read_rpc(J + ";other") is routed_rpc  # One channel per endpoint.
        # No primary (being promoted): forgotten.
        client.note_route(J, route_to(other, primary=-1))
        assert client.read_rpc(J) is client.rpc_read
        # The client's own broker: its own channel.
        client.note_route(J, route_to(f"http://{fake.address}"))
        assert client.read_rpc(J) is client.rpc_read
        # At most max_routes are kept.
        for name in ("x/1", "x/2", "x/3"):
            client.note_route(name, route_to(other))
        assert client.read_rpc("x/1") is client.rpc_read
        assert client.read_rpc("x/3") is routed_rpc


async def test_a_plain_client_does_not_route(fake_client: JournalClient) -> None:
    fake_client.note_route(J, route_to("http://127.0.0.1:1"))
    assert fake_client.read_rpc(J) is fake_client.rpc_read


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.DEADLINE_EXCEEDED,  # A broker ends a read whose token expired.
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # E.g. a message too large for this client.
        grpc.StatusCode.UNAUTHENTICATED,
    ],
)
async def test_a_routed_read_failing_otherwise_than_unavailable_keeps_the_primary(
    fake: FakeBroker, primary: FakeBroker, code: grpc.StatusCode
) -> None:
    primary.journal.read_scripts.append([Abort(code)])
    primary.journal.read_scripts.append([metadata(0, begin=0, end=2), content(0, b"ok")])
    fake.journal.read_scripts.append([metadata(0, begin=0, end=2), content(0, b"no")])
    async with RoutedJournalClient(fake.address) as client:
        client.note_route(J, route_to(f"http://{primary.address}"))
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await read_all(Reader(client, J, end_offset=2))
        assert failed.value.code() == code
        # The primary was not found unreachable: the retry goes to it again.
        assert await read_all(Reader(client, J, end_offset=2)) == b"ok"
        assert client.routed_reads == 2


async def test_a_failure_of_the_own_broker_does_not_mark_the_primary(
    fake: FakeBroker, primary: FakeBroker
) -> None:
    # The read goes through the client's own broker (no route known yet); its first response
    # names the primary, then the own broker's connection fails.
    route = route_to(f"http://{primary.address}")
    fake.journal.read_scripts.append(
        [routed(metadata(0, begin=0, end=5), route), content(0, b"he"), Abort()]
    )
    primary.journal.read_scripts.append([metadata(2, begin=0, end=5), content(2, b"llo")])
    fake.journal.read_scripts.append([metadata(2, begin=0, end=5), content(2, b"LLO")])
    async with RoutedJournalClient(fake.address) as client:
        reader = Reader(client, J, end_offset=5)
        assert await reader.read() == b"he"
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await reader.read()
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        # The primary was never asked: the next read goes to it.
        assert await read_all(Reader(client, J, offset=2, end_offset=5)) == b"llo"
        assert client.routed_reads == 1


class _Opened:
    """Records the peer clients a RoutedJournalClient opens, and which it closed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clients: dict[str, JournalClient] = {}
        self.closed: dict[str, asyncio.Event] = {}
        opened = self

        class Recorded(JournalClient):
            def __init__(self, address: str, **channel: Any) -> None:
                super().__init__(address, **channel)
                opened.clients[address] = self
                opened.closed[address] = asyncio.Event()

            async def close(self, grace: float | None = None) -> None:
                await super().close(grace)
                opened.closed[self.address].set()

        monkeypatch.setattr(routed_client, "JournalClient", Recorded)


async def test_channels_to_endpoints_no_route_names_are_closed(
    fake: FakeBroker, primary: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _Opened(monkeypatch)
    now = [100.0]
    old, new = f"http://{primary.address}", f"http://127.0.0.1:{free_port()}"
    primary.journal.read_scripts.append([metadata(0, begin=0, end=2), content(0, b"ok")])
    async with RoutedJournalClient(fake.address, clock=lambda: now[0]) as client:
        client.note_route(J, route_to(old))
        assert await read_all(Reader(client, J, end_offset=2)) == b"ok"
        # The primary restarts on a new address: no route names the old one any more.
        client.note_route(J, route_to(new))
        client.note_route("other/journal", route_to(old))  # Named again, for a while.
        now[0] += PEER_SWEEP_SECONDS
        client.note_route("other/journal", route_to(new))
        assert old in opened.clients and not opened.closed[old].is_set()
        now[0] += PEER_SWEEP_SECONDS  # Found unused by one sweep: not closed yet.
        client.read_rpc(J)
        assert not opened.closed[old].is_set()
        now[0] += PEER_SWEEP_SECONDS  # ... and by the next: closed.
        client.read_rpc(J)
        async with asyncio.timeout(10):
            await opened.closed[old].wait()
        assert client.peer_endpoints == [new]
        # Named again later: a new channel.
        client.note_route(J, route_to(old))
        assert client.read_rpc(J) is not client.rpc_read
        assert opened.clients[old].channel.get_state() is not grpc.ChannelConnectivity.SHUTDOWN


async def test_a_channel_with_a_call_on_it_is_not_closed(
    fake: FakeBroker, primary: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _Opened(monkeypatch)
    now = [100.0]
    old, new = f"http://{primary.address}", f"http://127.0.0.1:{free_port()}"
    primary.journal.read_scripts.append([metadata(0, begin=0, end=2), content(0, b"ok"), Hang()])
    async with RoutedJournalClient(fake.address, clock=lambda: now[0]) as client:
        client.note_route(J, route_to(old))
        reader = Reader(client, J, block=True)
        assert await reader.read() == b"ok"
        client.note_route(J, route_to(new))  # The read's call stays open on the old one.
        for _ in range(3):
            now[0] += PEER_SWEEP_SECONDS
            client.read_rpc(J)
        assert not opened.closed[old].is_set()
        pending = asyncio.ensure_future(reader.read())  # Still reading from the old primary.
        await asyncio.sleep(0)
        assert not pending.done()
        reader.cancel()  # The call ends: the channel goes with the next sweeps.
        with pytest.raises(ReaderCancelled):
            await pending
        for _ in range(2):
            now[0] += PEER_SWEEP_SECONDS
            client.read_rpc(J)
        async with asyncio.timeout(10):
            await opened.closed[old].wait()


def routed_commit(route: pb.Route, begin: int, end: int) -> pb.AppendResponse:
    """An OK AppendResponse whose header names the journal's `route`."""
    resp = committed(J, begin, end)
    resp.header.route.CopyFrom(route)
    return resp


async def test_an_append_goes_to_the_primary_an_appends_answer_named(
    fake: FakeBroker, primary: FakeBroker
) -> None:
    route = route_to(f"http://{primary.address}")
    fake.journal.append_responses.append(routed_commit(route, 0, 2))
    primary.journal.append_responses.extend(
        [routed_commit(route, 2, 4), routed_commit(route, 4, 6)]
    )
    async with RoutedJournalClient(fake.address) as client:
        assert client.append_rpc(J) is client.rpc_append  # Nothing known yet.
        await append(client, J, b"a\n")
        await append(client, J, b"b\n")
        await append(client, J + ";meta", b"c\n")  # The same journal.
        assert client.routed_appends == 2
    assert [c.requests[1].content for c in fake.journal.append_calls] == [b"a\n"]
    assert [c.requests[1].content for c in primary.journal.append_calls] == [b"b\n", b"c\n"]


async def test_an_append_refused_by_a_broker_that_is_not_primary_goes_to_the_primary(
    fake: FakeBroker, primary: FakeBroker
) -> None:
    """NOT_JOURNAL_PRIMARY_BROKER (as a broker answers a do_not_proxy append) names the
    route: the retry goes to the primary it names, as Gazette's client follows the route in
    the refusal's header."""
    refusal = pb.AppendResponse(status=pb.NOT_JOURNAL_PRIMARY_BROKER, header=header())
    refusal.header.route.CopyFrom(route_to(f"http://{primary.address}"))
    fake.journal.append_responses.append(refusal)
    async with RoutedJournalClient(fake.address) as client:
        resp = await append(client, J, b"a\n")
        assert resp.commit.end == 2
        assert client.routed_appends == 1
    assert len(fake.journal.append_calls) == 1
    assert [c.requests[1].content for c in primary.journal.append_calls] == [b"a\n"]


async def test_a_routed_append_failing_unavailable_forgets_the_primary(
    fake: FakeBroker, primary: FakeBroker
) -> None:
    route = route_to(f"http://{primary.address}")
    primary.journal.append_responses.append(Abort(grpc.StatusCode.UNAVAILABLE))
    async with RoutedJournalClient(fake.address) as client:
        client.note_route(J, route)
        appender = Appender(client, J)
        await appender.write(b"a\n")
        with pytest.raises(grpc.aio.AioRpcError):
            await appender.commit()
        # Back through the client's own broker, which the next answer may route again.
        assert client.append_rpc(J) is client.rpc_append
        await append(client, J, b"b\n")
    assert [c.requests[1].content for c in fake.journal.append_calls] == [b"b\n"]


async def test_a_routed_append_refused_keeps_the_primary(
    fake: FakeBroker, primary: FakeBroker
) -> None:
    route = route_to(f"http://{primary.address}")
    primary.journal.append_responses.append(Abort(grpc.StatusCode.PERMISSION_DENIED))
    async with RoutedJournalClient(fake.address) as client:
        client.note_route(J, route)
        with pytest.raises(grpc.aio.AioRpcError):
            await append(client, J, b"a\n")
        assert client.append_rpc(J) is not client.rpc_append
        await append(client, J, b"b\n")
    assert fake.journal.append_calls == []
