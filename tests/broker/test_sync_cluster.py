"""Two brokers run with --sync (power-loss safety) on a real etcd: replicated appends are
acknowledged, each broker's frontier log records the confirmed frontier of what it
acknowledged, and after both are killed every acknowledged append reads back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.broker.fragment.frontier_log import FILE_NAME, parse_records
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, ClusterBroker, append_once
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNAL = "synced/journal"


async def test_synced_brokers_replicate_and_keep_every_acknowledged_append(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    cluster = Cluster(tmp_path, etcd, etcd_root, broker_args=["--sync"])
    brokers = [cluster.add("zone-a", "broker-1"), cluster.add("zone-b", "broker-2")]
    try:
        await cluster.start()
        spec = journal_spec(JOURNAL, replication=2, length=1 << 20)
        assert (await apply_specs(cluster.stub(brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([JOURNAL], 2)
        acked = b""
        for i in range(20):
            data = f"synced record {i}\n".encode()
            resp = await append_once(cluster.stub(brokers[i % 2]), JOURNAL, data)
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            acked += data
        # The primary recorded (and synced) the frontier before it acknowledged the last
        # append; on a route of two the peer's commit confirms itself.
        for b in brokers:
            frontiers, _count, _valid = parse_records(
                (b.data_dir / "spools" / FILE_NAME).read_bytes()
            )
            assert frontiers.get(JOURNAL) == len(acked), b.member_key

        for b in brokers:
            b.kill()
        await cluster.start()
        await cluster.wait_ready([JOURNAL], 2)
        for b in brokers:
            content, head = await _read_when_served(cluster, b)
            assert content == acked and head == len(acked)
    finally:
        await cluster.close()


async def _read_when_served(cluster: Cluster, broker: ClusterBroker) -> tuple[bytes, int]:
    """The journal read through `broker` up to its write head, once the restarted cluster
    serves it again: until then a read fails UNAVAILABLE, or answers that the journal has
    too few brokers or no primary (its members' leases expire, the allocator assigns it
    again), which clients retry."""
    deadline = time.monotonic() + 60
    while True:
        out, head, status = bytearray(), 0, pb.OK
        try:
            async for resp in cluster.stub(broker).Read(
                pb.ReadRequest(journal=JOURNAL, block=False), timeout=30
            ):
                out += resp.content
                if not resp.content:
                    head, status = resp.write_head, resp.status
                    if status != pb.OK:
                        break
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            status = pb.NO_JOURNAL_PRIMARY_BROKER
        if status == pb.OFFSET_NOT_YET_AVAILABLE:
            return bytes(out), head
        assert status in (pb.INSUFFICIENT_JOURNAL_BROKERS, pb.NO_JOURNAL_PRIMARY_BROKER), (
            pb.Status.Name(status)
        )
        assert time.monotonic() < deadline, pb.Status.Name(status)
        await asyncio.sleep(0.1)
