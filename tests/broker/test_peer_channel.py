"""A broker's channels to its peers notice a connection that died silently."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from pygazette.broker.peers import Peers
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once
from tests.support.etcd_process import EtcdProcess
from tests.support.tcp_proxy import TcpProxy


async def test_a_peer_connection_that_dies_silently_fails_its_streams_within_seconds(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """A blocking read to a peer whose connection dies silently (a frozen peer, a network
    losing the connection's state: nothing comes back, no reset) fails within seconds, as
    the channel's 2 s keepalive pings mean it to. grpc 1.85's core times a ping's
    acknowledgement out by grpc.http2.ping_timeout_ms (one minute by default), not by
    keepalive_timeout_ms: the stream hung on, a pipeline to a frozen peer with it."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    broker = cluster.add("zone-a", "broker-a")
    proxy: TcpProxy | None = None
    peers = Peers()
    journal = "peers/silent"
    try:
        await cluster.start()
        assert (
            await apply_specs(cluster.stub(broker), journal_spec(journal, replication=1))
        ).status == pb.OK
        await cluster.wait_ready([journal], 1)
        assert (await append_once(cluster.stub(broker), journal, b"one\n")).status == pb.OK
        proxy = TcpProxy(broker.port)
        stub = peers.stub(proxy.url)
        call = stub.Read(pb.ReadRequest(journal=journal, offset=0, block=True), timeout=20)
        first = await call.read()
        assert first.status == pb.OK
        proxy.stall_open()
        stalled = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async with asyncio.timeout(15):
                while True:
                    await call.read()
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value
        assert time.monotonic() - stalled < 10.0
    finally:
        await peers.close()
        if proxy is not None:
            proxy.close()
        await cluster.close()
