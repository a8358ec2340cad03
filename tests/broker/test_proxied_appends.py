"""Small appends are read whole before the journal is held: through a broker that is not
the journal's primary (it proxies them), and at the primary itself.

A broker reads a small append whole before it dials the primary or takes the journal, so
the journal is held only while the append's bytes are already here: a client that dawdles
between its chunks (or a proxy whose event loop stalls between them) neither blocks other
writers of the journal nor gets failed for the proxy's pace. The client's own pace is still
policed, with a longer allowance while nothing is held; past the read-ahead, a held
journal's 1 s allowance applies, as Gazette's.

A small append the client sent whole travels to the primary in one `AppendWhole` message
(`peer_append_service`), and as a stream to a primary that does not serve that.

Two brokers run in this process on a real etcd; the journal has one replica, so one broker
is its primary and the other proxies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.broker.append_fsm import PROXY_READ_AHEAD
from pygazette.broker.peers import Peers
from pygazette.broker.server import Broker
from pygazette.protocol.pb import peer_pb2 as ppb
from pygazette.protocol.pb import peer_pb2_grpc as ppb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.in_process_brokers import start_brokers
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNAL = "proxied/journal"


class TwoBrokers:
    def __init__(self, tmp: Path, etcd: EtcdProcess, root: str) -> None:
        self.tmp, self.etcd, self.root = tmp, etcd, root
        self.brokers: list[Broker] = []
        self.channels: list[grpc.aio.Channel] = []

    async def start(self) -> None:
        self.brokers = await start_brokers(self.tmp, self.etcd, self.root, 2)
        self.channels = [grpc.aio.insecure_channel(f"127.0.0.1:{b.port}") for b in self.brokers]

    def stub(self, i: int) -> pb_grpc.JournalStub:
        return pb_grpc.JournalStub(self.channels[i])  # type: ignore[no-untyped-call]

    async def primary(self) -> int:
        """The broker that serves the journal (once an append through it succeeded)."""
        while True:
            for i, b in enumerate(self.brokers):
                replica = b.resolver.replicas.get(JOURNAL)
                if replica is not None and replica.primary:
                    if (await append_once(self.stub(i), JOURNAL, b"")).status == pb.OK:
                        return i
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close(None)
        for b in self.brokers:
            await b.stop(grace=1.0)


@pytest.fixture
async def brokers(tmp_path: Path, etcd: EtcdProcess, etcd_root: str) -> AsyncIterator[TwoBrokers]:
    c = TwoBrokers(tmp_path, etcd, etcd_root)
    try:
        await c.start()
        assert (await apply_specs(c.stub(0), journal_spec(JOURNAL, replication=1))).status == (
            pb.OK
        )
        yield c
    finally:
        await c.close()


@pytest.mark.parametrize("through", ["proxy", "primary"])
async def test_a_pausing_client_does_not_hold_the_journal(
    brokers: TwoBrokers, through: str
) -> None:
    """Client 1 appends (through the proxy, or straight to the primary) and pauses before
    its commit until client 2's append, straight to the primary, is acknowledged. Before
    the read-ahead the primary held the journal for client 1's stream: client 2 waited
    behind it until the primary's flow control failed client 1 (DEADLINE_EXCEEDED)."""
    primary = await brokers.primary()
    proxy = 1 - primary if through == "proxy" else primary
    go_on, pausing = asyncio.Event(), asyncio.Event()

    async def paused() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL)
        yield pb.AppendRequest(content=b"first\n")
        pausing.set()  # gRPC asks for the next chunk: the first two are sent.
        await go_on.wait()
        yield pb.AppendRequest()

    first = asyncio.ensure_future(brokers.stub(proxy).Append(paused(), timeout=30))
    await pausing.wait()
    # Time for those chunks to cross loopback to the proxy (and, before the read-ahead, on
    # to the primary): no broker state shows their arrival.
    await asyncio.sleep(0.3)
    second = await append_once(brokers.stub(primary), JOURNAL, b"second\n", within=10)
    assert second.status == pb.OK
    go_on.set()
    resp = await first
    assert resp.status == pb.OK, pb.Status.Name(resp.status)
    content, _head = await read_range(brokers.stub(primary), JOURNAL)
    assert content == b"second\nfirst\n"


async def test_a_client_stalled_behind_a_proxy_is_failed_by_the_proxy(
    brokers: TwoBrokers,
) -> None:
    """The client's pace is still policed (with READ_AHEAD_SLACK_SECONDS of allowance,
    nothing being held): one that sends a chunk and then nothing gets DEADLINE_EXCEEDED,
    and nothing of it is appended. Before, it hung until its own deadline: the primary
    failed its stream, but the proxy waited on the client's next chunk."""
    primary = await brokers.primary()
    proxy = 1 - primary
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL)
        yield pb.AppendRequest(content=b"never committed\n")
        await never.wait()
        yield pb.AppendRequest()

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await brokers.stub(proxy).Append(stalled(), timeout=30)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "minimum append data rate" in (err.value.details() or "")
    ok = await append_once(brokers.stub(proxy), JOURNAL, b"after\n", within=10)
    assert ok.status == pb.OK
    content, _head = await read_range(brokers.stub(primary), JOURNAL)
    assert content == b"after\n"


async def test_a_large_append_stalled_behind_a_proxy_hears_the_primary_at_once(
    brokers: TwoBrokers,
) -> None:
    """Past the read-ahead the proxy streams; when the client then stalls, the primary's
    flow control fails it, and that answer reaches the client without waiting for the
    client's next chunk (it used to hang until the client's own deadline)."""
    primary = await brokers.primary()
    proxy = 1 - primary
    never = asyncio.Event()
    chunk = b"x" * (64 << 10)

    async def stalled() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL)
        for _ in range(PROXY_READ_AHEAD // len(chunk) + 2):
            yield pb.AppendRequest(content=chunk)
        await never.wait()
        yield pb.AppendRequest()

    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await brokers.stub(proxy).Append(stalled(), timeout=60)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "minimum append data rate" in (err.value.details() or "")
    assert time.monotonic() - started < 30  # The primary's answer, not the 60 s deadline.
    ok = await append_once(brokers.stub(proxy), JOURNAL, b"after\n", within=10)
    assert ok.status == pb.OK
    content, _head = await read_range(brokers.stub(primary), JOURNAL)
    assert content == b"after\n"


class _PeerStubs:
    """Records the proxy's `PeerJournal` calls; with `unserved`, points them at a gRPC server
    that serves no `PeerJournal` (as a Gazette broker), which answers UNIMPLEMENTED."""

    def __init__(self, peers: Peers, unserved: str | None = None) -> None:
        self.endpoints: list[str] = []
        self._real = peers.peer_stub
        self._unserved = unserved
        self._channel: grpc.aio.Channel | None = None

    def __call__(self, endpoint: str) -> ppb_grpc.PeerJournalStub:
        self.endpoints.append(endpoint)
        if self._unserved is None:
            return self._real(endpoint)
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._unserved)
        return ppb_grpc.PeerJournalStub(self._channel)  # type: ignore[no-untyped-call]


async def test_a_small_append_reaches_the_primary_whole(
    brokers: TwoBrokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append the client sent whole is proxied in one `AppendWhole` message; its answer,
    an OK or a refusal, is the primary's, and the primary counts it as an Append."""
    primary = await brokers.primary()
    proxy = 1 - primary
    appends = brokers.brokers[proxy].member.appends
    calls = _PeerStubs(appends.peers)
    monkeypatch.setattr(appends.peers, "peer_stub", calls)
    counted = dict(brokers.brokers[primary].rpc_counters.started)

    ok = await append_once(brokers.stub(proxy), JOURNAL, b"whole\n")
    assert ok.status == pb.OK
    assert ok.header.process_id.suffix == f"broker-{primary}"  # The primary's answer.
    assert calls.endpoints == [brokers.brokers[primary].endpoint]
    started = brokers.brokers[primary].rpc_counters.started
    assert started.get("Append", 0) == counted.get("Append", 0) + 1

    refused = await brokers.stub(proxy).Append(
        _requests(pb.AppendRequest(journal=JOURNAL, offset=1), b"at a wrong offset\n"),
        timeout=10,
    )
    assert refused.status == pb.WRONG_APPEND_OFFSET
    assert len(calls.endpoints) == 2
    content, _head = await read_range(brokers.stub(primary), JOURNAL)
    assert content == b"whole\n"


async def test_a_primary_without_append_whole_is_streamed_to(
    brokers: TwoBrokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A primary that answers `AppendWhole` UNIMPLEMENTED (a Gazette broker) gets the append
    as a stream, now and from then on: nothing is lost or appended twice."""
    primary = await brokers.primary()
    proxy = 1 - primary
    bare = grpc.aio.server()  # Serves nothing: every method is UNIMPLEMENTED.
    port = bare.add_insecure_port("127.0.0.1:0")
    await bare.start()
    try:
        appends = brokers.brokers[proxy].member.appends
        calls = _PeerStubs(appends.peers, unserved=f"127.0.0.1:{port}")
        monkeypatch.setattr(appends.peers, "peer_stub", calls)
        for data in (b"one\n", b"two\n"):
            assert (await append_once(brokers.stub(proxy), JOURNAL, data)).status == pb.OK
        assert len(calls.endpoints) == 1  # Asked once; streamed since...
        appends._streaming_only = dict.fromkeys(appends._streaming_only, 0.0)  # Time passed.
        assert (await append_once(brokers.stub(proxy), JOURNAL, b"three\n")).status == pb.OK
        assert len(calls.endpoints) == 2  # ...until it is asked again.
        content, _head = await read_range(brokers.stub(primary), JOURNAL)
        assert content == b"one\ntwo\nthree\n"
    finally:
        await bare.stop(None)


async def test_an_empty_whole_append_is_refused(brokers: TwoBrokers) -> None:
    """`AppendWhole` validates as Append does: no first request, INVALID_ARGUMENT."""
    stub = ppb_grpc.PeerJournalStub(brokers.channels[0])  # type: ignore[no-untyped-call]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.AppendWhole(ppb.WholeAppend(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected an initial AppendRequest" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.AppendWhole(
            ppb.WholeAppend(requests=[pb.AppendRequest(journal="bad journal name")]), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def _requests(first: pb.AppendRequest, data: bytes) -> AsyncIterator[pb.AppendRequest]:
    yield first
    yield pb.AppendRequest(content=data)
    yield pb.AppendRequest()
