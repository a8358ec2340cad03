"""An append (or read, or fragment listing) waiting for its journal's first store listing
ends when the replica stops.

A replica knows its journal's write head only once its stores were listed, so an append
waits for that first listing (giving up after a few failed ones). If the replica stops
meanwhile — the journal deleted, or the broker shutting down — no listing of it ever comes
again (the refresher drops it; one in flight may block on an unreachable store for
minutes), and the append waited forever. It must end promptly instead: JOURNAL_NOT_FOUND
for a deleted journal, UNAVAILABLE (or cancelled) for a broker shutting down (even with a long
grace period, which lets appends under way finish). Both append paths, with brokers in
this process so that the stores' listings can be made to block or fail: single-node
(`append_service`, which waited forever), and cluster (`append_fsm`, whose wait already
ended on the resolution's invalidation: these tests keep it so).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from pygazette.broker.replica import Replica
from pygazette.broker.server import Broker, BrokerConfig
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.stores.interface import StoreError
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.support.etcd_process import EtcdProcess

JOURNAL = "listing/waits"
BOUND = 10.0  # Seconds an append may take to end once its replica stopped.


class Listings:
    """Replaces the replicas' store listings: each blocks until released (`block`), or
    fails at once (`fail`); `waiting` is set once an append waits for a first listing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
        self.mode = mode
        self.released = asyncio.Event()
        self.waiting = asyncio.Event()
        self.waiters = 0  # RPCs that waited for a first listing.
        self.another = asyncio.Event()  # Set (and replaced) as one more does.
        wait_listing = Replica.await_first_listing

        async def list_stores(replica: Replica) -> list[pb.Fragment]:
            if self.mode == "block":
                await self.released.wait()
            raise StoreError("store unreachable (test)")

        async def await_first_listing(replica: Replica, *args: int) -> str:
            self.waiters += 1
            self.waiting.set()
            self.another.set()
            self.another = asyncio.Event()
            return await wait_listing(replica, *args)

        monkeypatch.setattr(Replica, "list_stores", list_stores)
        monkeypatch.setattr(Replica, "await_first_listing", await_first_listing)


async def _read(stub: pb_grpc.JournalStub) -> pb.ReadResponse:
    """A non-blocking read of JOURNAL from its write head: its last response (an empty
    one if the stream ended without any)."""
    last = pb.ReadResponse()
    async for resp in stub.Read(pb.ReadRequest(journal=JOURNAL, offset=-1), timeout=30):
        last = resp
    return last


async def _list_fragments(stub: pb_grpc.JournalStub) -> pb.FragmentsResponse:
    resp: pb.FragmentsResponse = await stub.ListFragments(
        pb.FragmentsRequest(journal=JOURNAL), timeout=30
    )
    return resp


async def _waiting_append(
    stub: pb_grpc.JournalStub,
    listings: Listings,
    rpc: Callable[[pb_grpc.JournalStub], Awaitable[Any]] | None = None,
) -> asyncio.Future[Any]:
    """An append of JOURNAL (or `rpc`), once it waits for the journal's first listing (in a
    cluster, sent again while the journal has no primary yet)."""
    deadline = asyncio.get_running_loop().time() + BOUND
    while True:
        if rpc is None:
            pending = asyncio.ensure_future(append(stub, JOURNAL, b"hello\n"))
        else:
            pending = asyncio.ensure_future(rpc(stub))
        waiting = asyncio.ensure_future(listings.waiting.wait())
        await asyncio.wait([pending, waiting], return_when=asyncio.FIRST_COMPLETED, timeout=BOUND)
        waiting.cancel()
        if listings.waiting.is_set() or not pending.done():
            break
        unassigned = (pb.NO_JOURNAL_PRIMARY_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS)
        assert pending.result().status in unassigned, pending.result()
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)  # The allocator assigns the new journal.
    assert listings.waiting.is_set() and not pending.done(), pending
    return pending


async def _second_waiting(
    stub: pb_grpc.JournalStub, listings: Listings
) -> asyncio.Future[pb.FragmentsResponse]:
    """A fragment listing of JOURNAL, once it waits for the first listing too."""
    another = asyncio.ensure_future(listings.another.wait())
    listing = asyncio.ensure_future(_list_fragments(stub))
    await asyncio.wait([listing, another], return_when=asyncio.FIRST_COMPLETED, timeout=BOUND)
    another.cancel()
    assert listings.waiters == 2 and not listing.done(), listing
    return listing


async def _delete(stub: pb_grpc.JournalStub) -> None:
    delete = pb.ApplyRequest.Change(delete=JOURNAL, expect_mod_revision=-1)
    assert (await stub.Apply(pb.ApplyRequest(changes=[delete]))).status == pb.OK


async def _ends(pending: Awaitable[Any]) -> Any:
    """The RPC's response, or the status it failed with; within BOUND seconds."""
    try:
        async with asyncio.timeout(BOUND):
            return await pending
    except grpc.aio.AioRpcError as exc:
        return exc.code()


def _gone(listed: Any) -> None:
    """A fragment listing of a journal deleted while it waited: JOURNAL_NOT_FOUND (it
    resolves the journal again), or failed UNAVAILABLE."""
    if isinstance(listed, pb.FragmentsResponse):
        assert listed.status == pb.JOURNAL_NOT_FOUND, listed
    else:
        assert listed in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND), listed


@pytest.fixture
async def single_node(
    tmp_path: Path,
) -> AsyncIterator[Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]]]:
    started: list[tuple[Broker, grpc.aio.Channel, Listings]] = []

    async def start(listings: Listings) -> tuple[Broker, pb_grpc.JournalStub]:
        broker = Broker(BrokerConfig(data_dir=tmp_path / "data", port=0, file_root=tmp_path))
        await broker.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}")
        started.append((broker, channel, listings))
        return broker, pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]

    yield start
    for broker, channel, listings in started:
        listings.released.set()
        await channel.close(None)
        if broker.ready_reason != "stopping":  # Not stopped by the test.
            await broker.stop(grace=1.0)


@pytest.fixture
async def clustered(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> AsyncIterator[Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]]]:
    started: list[tuple[Broker, grpc.aio.Channel, Listings]] = []

    async def start(listings: Listings) -> tuple[Broker, pb_grpc.JournalStub]:
        broker = Broker(
            BrokerConfig(
                data_dir=tmp_path / "data",
                port=0,
                file_root=tmp_path / "store",
                zone="zone-a",
                broker_id="broker-0",
                etcd_url=etcd.url,
                etcd_prefix=etcd_root,
                lease_ttl=3.0,
            )
        )
        await broker.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}")
        started.append((broker, channel, listings))
        return broker, pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]

    yield start
    for broker, channel, listings in started:
        listings.released.set()
        await channel.close(None)
        if broker.ready_reason != "stopping":  # Not stopped by the test.
            await broker.stop(grace=1.0)


@pytest.mark.parametrize("mode", ["block", "fail"])
async def test_single_node_append_ends_when_its_journal_is_deleted(
    single_node: Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    listings = Listings(monkeypatch, mode)
    _broker, stub = await single_node(listings)
    assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
    pending = await _waiting_append(stub, listings)
    await _delete(stub)
    resp = await _ends(pending)
    assert isinstance(resp, pb.AppendResponse) and resp.status == pb.JOURNAL_NOT_FOUND, resp


async def test_single_node_append_ends_when_the_broker_stops(
    single_node: Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listings = Listings(monkeypatch, "block")
    broker, stub = await single_node(listings)
    assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
    pending = await _waiting_append(stub, listings)
    # A long grace: in-flight appends may finish; one waiting on the store ends at once.
    stopping = asyncio.ensure_future(broker.stop(grace=60.0))
    resp = await _ends(pending)
    assert resp == grpc.StatusCode.UNAVAILABLE, resp
    async with asyncio.timeout(BOUND):
        await stopping


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["block", "fail"])
async def test_cluster_append_ends_when_its_journal_is_deleted(
    clustered: Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    listings = Listings(monkeypatch, mode)
    _broker, stub = await clustered(listings)
    assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
    pending = await _waiting_append(stub, listings)
    await _delete(stub)
    resp = await _ends(pending)
    assert isinstance(resp, pb.AppendResponse) and resp.status == pb.JOURNAL_NOT_FOUND, resp


@pytest.mark.slow
async def test_cluster_append_ends_when_the_broker_stops(
    clustered: Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listings = Listings(monkeypatch, "block")
    broker, stub = await clustered(listings)
    assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
    pending = await _waiting_append(stub, listings)
    stopping = asyncio.ensure_future(broker.stop(grace=60.0))
    resp = await _ends(pending)
    assert resp == grpc.StatusCode.UNAVAILABLE, resp
    async with asyncio.timeout(BOUND):
        await stopping


@pytest.mark.parametrize("mode", ["block", "fail"])
async def test_single_node_read_and_listing_end_when_their_journal_is_deleted(
    single_node: Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    # Reads from the write head, and fragment listings, wait for the first listing too.
    listings = Listings(monkeypatch, mode)
    _broker, stub = await single_node(listings)
    assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
    reading = await _waiting_append(stub, listings, _read)
    listing = await _second_waiting(stub, listings)
    await _delete(stub)
    read = await _ends(reading)
    assert isinstance(read, pb.ReadResponse) and read.status in (pb.OK, pb.JOURNAL_NOT_FOUND)
    assert not read.content and not read.HasField("fragment"), read  # The stream just ended.
    _gone(await _ends(listing))


@pytest.mark.slow
async def test_cluster_read_and_listing_end_when_their_journal_is_deleted(
    clustered: Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listings = Listings(monkeypatch, "block")
    _broker, stub = await clustered(listings)
    assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
    reading = await _waiting_append(stub, listings, _read)
    listing = await _second_waiting(stub, listings)
    await _delete(stub)
    read = await _ends(reading)
    assert isinstance(read, pb.ReadResponse) and read.status in (pb.OK, pb.JOURNAL_NOT_FOUND)
    assert not read.content and not read.HasField("fragment"), read
    _gone(await _ends(listing))


@pytest.mark.slow
async def test_cluster_listing_waits_through_a_spec_change(
    clustered: Callable[[Listings], Awaitable[tuple[Broker, pb_grpc.JournalStub]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica that goes on serving (its spec edited, so its resolutions are invalidated)
    still lists its stores: a fragment listing waiting for that goes on waiting, and is
    answered. It failed UNAVAILABLE ("moved or was deleted meanwhile") at the edit: in a
    cluster any spec edit (or assignment change) invalidates the replica, e.g. pointing a
    journal at another store while its store can't be listed."""
    listings = Listings(monkeypatch, "block")

    async def list_stores(replica: Replica) -> list[pb.Fragment]:
        await listings.released.wait()
        return []  # Listed, once released.

    monkeypatch.setattr(Replica, "list_stores", list_stores)
    broker, stub = await clustered(listings)
    assert (await apply_specs(stub, journal_spec(JOURNAL))).status == pb.OK
    listing = await _waiting_append(stub, listings, _list_fragments)
    invalidated = broker.resolver.replicas[JOURNAL].invalidated
    again = asyncio.ensure_future(listings.another.wait())  # It waits for the listing anew.
    edited = journal_spec(JOURNAL, labels={"edited": "yes"})
    change = pb.ApplyRequest.Change(upsert=edited, expect_mod_revision=-1)
    assert (await stub.Apply(pb.ApplyRequest(changes=[change]))).status == pb.OK
    async with asyncio.timeout(BOUND):
        await invalidated.wait()  # The edit reached the replica.
    await asyncio.wait([again, listing], return_when=asyncio.FIRST_COMPLETED, timeout=BOUND)
    again.cancel()
    assert broker.resolver.replicas[JOURNAL].spec.labels == edited.labels
    assert not listing.done(), await _ends(listing)
    listings.released.set()
    resp = await _ends(listing)
    assert isinstance(resp, pb.FragmentsResponse) and resp.status == pb.OK, resp
