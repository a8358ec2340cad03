"""Full disk in a cluster: one of two brokers of replicated journals has its data directory
on a small tmpfs that fills up.

Whether the full broker is a journal's primary or its replica, appends are refused (the
primary answers RESOURCE_EXHAUSTED, or UNAVAILABLE when a replica refused the replication,
or UNKNOWN when it failed after the append's self-confirming commit went out; either way the
details say "insufficient storage"). Nothing of a refused append surfaces, except that an
append in doubt (UNKNOWN) may, whole and once: the primary's next pipeline never cuts below a
confirmation it sent (`replicated_spool`). Once space is freed appends commit again at the
head, which both brokers read back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.etcd_process import EtcdProcess
from tests.support.small_fs import SmallFs, mounted_tmpfs

pytestmark = pytest.mark.slow

JOURNALS = ["disk/full-a", "disk/full-b"]
RECORD = 64 * 1024


@pytest.fixture
async def full_cluster(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> AsyncIterator[tuple[Cluster, SmallFs]]:
    cluster = Cluster(tmp_path, etcd, etcd_root)
    small = cluster.add("zone-a", "broker-small")
    cluster.add("zone-b", "broker-roomy")
    with mounted_tmpfs(small.data_dir, size="8m") as fs:
        try:
            await cluster.start()
            yield cluster, fs
        finally:
            await cluster.close()


def _record(tag: str, seq: int) -> bytes:
    head = f"{tag}-{seq:05d}:".encode()
    return head + b"." * (RECORD - len(head) - 1) + b"\n"


async def test_full_broker_refuses_appends_as_primary_and_replica(
    full_cluster: tuple[Cluster, SmallFs],
) -> None:
    cluster, fs = full_cluster
    small = cluster.brokers[0]
    specs = [journal_spec(j, replication=2, length=1 << 30) for j in JOURNALS]
    assert (await apply_specs(cluster.stub(cluster.brokers[1]), *specs)).status == pb.OK
    await cluster.wait_ready(JOURNALS, 2)
    stub = cluster.stub(cluster.brokers[1])
    acked: dict[str, list[bytes]] = {j: [] for j in JOURNALS}
    for j in JOURNALS:
        data = _record(j, 0)
        assert (await append_once(stub, j, data)).status == pb.OK
        acked[j].append(data)

    fs.fill(leave=0)
    roles = {}
    in_doubt: dict[str, bytes] = {}
    for j in JOURNALS:
        roles[j] = "primary" if cluster.primary_of(j) is small else "replica"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            for seq in range(1, 200):
                data = _record(j, seq)
                assert (await append_once(stub, j, data)).status == pb.OK
                acked[j].append(data)
        code = refused.value.code()
        # UNKNOWN: in doubt, when the replica failed after the commit went out (at
        # replication 2 a commit carries its own confirmation): it may surface below.
        if code == grpc.StatusCode.UNKNOWN:
            in_doubt[j] = data
        assert code in (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.UNKNOWN,
        ), code
        details = refused.value.details() or ""
        assert "insufficient storage" in details, refused.value

    fs.free()
    for j in JOURNALS:
        deadline = time.monotonic() + 30
        while True:  # The first append after a refusal may still meet a broken pipeline.
            data = _record(j, 1000)
            try:
                resp = await append_once(stub, j, data)
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
                continue
            assert resp.status == pb.OK
            below = sum(map(len, acked[j]))
            if j in in_doubt and resp.commit.begin == below + len(in_doubt[j]):
                acked[j].append(in_doubt[j])  # It surfaced, whole: the reads below show it.
            assert resp.commit.begin == sum(map(len, acked[j])), roles[j]
            acked[j].append(data)
            break
        for broker in cluster.brokers:
            content, head = await read_range(cluster.stub(broker), j)
            assert content == b"".join(acked[j]), (roles[j], broker.member_key)
            assert head == len(content)
