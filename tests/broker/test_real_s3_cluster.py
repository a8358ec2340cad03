"""A replicated journal of a broker cluster (real etcd) on a real S3 server process, cut off
from it through a TCP proxy: the primary is killed while spools wait for the store, a new
route forms, and once the store is reachable again every acknowledged append is persisted
to the bucket, by whichever replica held it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.fragment_helpers import assemble, check_fragment_file
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.etcd_process import EtcdProcess
from tests.support.s3_real_server import RealS3Server, running_real_s3
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow


@pytest.fixture
def real_s3(tmp_path: Path) -> Iterator[RealS3Server]:
    with running_real_s3(tmp_path / "s3") as server:
        yield server


def _persisted(s3: RealS3Server, bucket: str, journal: str) -> list[tuple[pb.Fragment, bytes]]:
    """The bucket's fragments of `journal`, checked, largest first among overlapping copies
    (replicas may each persist the same spool), reduced to a non-overlapping cover."""
    frags = []
    for key in s3.object_keys(bucket, f"{journal}/"):
        raw, _ = s3.get_object(bucket, key)
        frags.append(check_fragment_file(journal, key[len(journal) + 1 :], raw))
    cover: list[tuple[pb.Fragment, bytes]] = []
    reach = 0
    for frag, content in sorted(frags, key=lambda fc: (fc[0].begin, -fc[0].end)):
        if frag.end <= reach:
            continue  # A copy of, or contained in, what is covered already.
        assert frag.begin == reach, f"gap or overlap at {reach}: fragment {frag.begin}"
        cover.append((frag, content))
        reach = frag.end
    return cover


async def test_primary_killed_while_the_store_is_cut_off(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, real_s3: RealS3Server
) -> None:
    bucket = real_s3.create_bucket()
    proxy = TcpProxy(real_s3.port)
    store = real_s3.store_url(bucket, endpoint=proxy.endpoint)
    cluster = Cluster(tmp_path, etcd, etcd_root)
    brokers = [cluster.add(f"zone-{z}", f"broker-{i}") for i, z in enumerate("abc", 1)]
    for b in brokers:
        b.env.update(real_s3.env())
        b.extra_args += ["--spool-backlog-limit", str(64 * 1024), "--retention-interval", "0s"]
    journal = "real-s3-cluster/j"
    acked: list[tuple[int, bytes]] = []
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=2, length=1024, stores=[store])
        assert (await apply_specs(cluster.stub(brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([journal], 2)
        first = await append_once(cluster.stub(brokers[0]), journal, b"listed\n")
        assert first.status == pb.OK
        acked.append((first.commit.begin, b"listed\n"))

        proxy.cut()
        for i in range(12):  # Fewer bytes than the backlog bound: all are acknowledged.
            data = f"record {i:05d} ".encode() + b"." * 1000 + b"\n"
            resp = await append_once(cluster.stub(brokers[i % 3]), journal, data)
            assert resp.status == pb.OK, resp
            acked.append((resp.commit.begin, data))

        primary = cluster.primary_of(journal)
        assert primary is not None
        primary.kill()
        await cluster.wait_for(
            lambda: cluster.ready(journal, 2) and cluster.primary_of(journal) is not primary,
            "a new route without the killed primary",
        )
        survivor = cluster.primary_of(journal)
        assert survivor is not None

        proxy.restore()
        deadline = time.monotonic() + 60
        while True:  # Appends go on (or resume once the backlog drains into the store).
            data = b"after the outage\n"
            resp = await append_once(cluster.stub(survivor), journal, data)
            if resp.status == pb.OK:
                acked.append((resp.commit.begin, data))
                break
            assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY, resp
            assert time.monotonic() < deadline, resp.store_health_error
            await asyncio.sleep(0.1)
        content, _ = await read_range(cluster.stub(survivor), journal)
        for begin, data in acked:
            assert content[begin : begin + len(data)] == data

        for b in cluster.running():  # A clean stop persists whatever spools remain.
            await asyncio.to_thread(b.stop)
        end = acked[-1][0] + len(acked[-1][1])
        persisted = assemble(_persisted(real_s3, bucket, journal))
        assert len(persisted) == end
        for begin, data in acked:
            assert persisted[begin : begin + len(data)] == data
    except BaseException:
        print(cluster.log_tail())
        raise
    finally:
        await cluster.close()
        proxy.close()
