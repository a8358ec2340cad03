"""A cluster primary bounds its spool backlog while the journal's store is unreachable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.etcd_process import EtcdProcess
from tests.support.s3_server import S3Server
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow


@pytest.fixture
def s3_behind_proxy(s3_server: S3Server) -> Iterator[tuple[TcpProxy, str]]:
    """A bucket's store URL reaching the S3 server through a proxy the test can cut."""
    proxy = TcpProxy(s3_server.port)
    try:
        yield proxy, s3_server.store_url(s3_server.create_bucket(), endpoint=proxy.endpoint)
    finally:
        proxy.close()


async def test_primary_refuses_appends_past_the_backlog_and_resumes(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, s3_behind_proxy: tuple[TcpProxy, str]
) -> None:
    proxy, store = s3_behind_proxy
    limit = 16 * 1024
    cluster = Cluster(tmp_path, etcd, etcd_root)
    brokers = [cluster.add("zone-a", "broker-1"), cluster.add("zone-b", "broker-2")]
    for b in brokers:
        b.extra_args += ["--spool-backlog-limit", str(limit), "--retention-interval", "0s"]
    journal = "outage/j"
    acked: list[tuple[int, bytes]] = []
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=2, length=1024, stores=[store])
        assert (await apply_specs(cluster.stub(brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([journal], 2)
        first = await append_once(cluster.stub(brokers[0]), journal, b"listed\n")
        assert first.status == pb.OK  # The store was listed: the head is known.
        acked.append((first.commit.begin, b"listed\n"))

        proxy.cut()
        refused = None
        for i in range(200):
            data = f"record {i:05d} ".encode() + b"." * 1000 + b"\n"
            resp = await append_once(cluster.stub(brokers[i % 2]), journal, data)
            if resp.status != pb.OK:
                refused = resp
                break
            acked.append((resp.commit.begin, data))
        assert refused is not None, "appends were never refused"
        assert refused.status == pb.FRAGMENT_STORE_UNHEALTHY, refused
        assert store in refused.store_health_error
        assert f"limit {limit}" in refused.store_health_error
        assert limit <= (len(acked) - 1) * 1012 <= limit + 3 * 1012  # Records after "listed".

        proxy.restore()
        deadline = time.monotonic() + 60
        while True:  # Appends resume once the backlog drains into the store.
            data = b"after the outage\n"
            resp = await append_once(cluster.stub(brokers[0]), journal, data)
            if resp.status == pb.OK:
                acked.append((resp.commit.begin, data))
                break
            assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY, resp
            assert time.monotonic() < deadline, resp.store_health_error
            await asyncio.sleep(0.1)
        for b in brokers:  # Nothing acknowledged was lost, on either replica.
            content, _ = await read_range(cluster.stub(b), journal)
            for begin, data in acked:
                assert content[begin : begin + len(data)] == data
    except BaseException:
        print(cluster.log_tail())
        raise
    finally:
        await cluster.close()


async def test_primary_refuses_appends_while_the_store_cannot_be_listed(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, s3_behind_proxy: tuple[TcpProxy, str]
) -> None:
    proxy, store = s3_behind_proxy
    cluster = Cluster(tmp_path, etcd, etcd_root)
    broker = cluster.add("zone-a", "broker-1")
    journal = "unlisted/j"
    try:
        await cluster.start()
        proxy.cut()  # Before the journal exists: its first listing can never land.
        spec = journal_spec(journal, replication=1, stores=[store])
        assert (await apply_specs(cluster.stub(broker), spec)).status == pb.OK
        await cluster.wait_ready([journal], 1)
        # Refused with the listing's error once a few listings failed, not left hanging.
        resp = await append_once(cluster.stub(broker), journal, b"x\n")
        assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY, resp
        assert f"cannot list fragments of {journal}" in resp.store_health_error

        proxy.restore()
        deadline = time.monotonic() + 60
        while (resp := await append_once(cluster.stub(broker), journal, b"x\n")).status != pb.OK:
            assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY, resp
            assert time.monotonic() < deadline, resp.store_health_error
            await asyncio.sleep(0.1)
        assert resp.commit.begin == 0
    except BaseException:
        print(cluster.log_tail())
        raise
    finally:
        await cluster.close()
