"""A broker of a journal's route drained (SIGTERM) while appends stream fails none of them,
as with Gazette's brokers: the allocator adds a member, then drops the drained one, and each
change of members left the Replicate streams of the members that stay in place (their
primary unchanged), so the appends in flight on them complete; the primary's next append
replaces its pipeline. Before, every change of the route ended every peer's stream: the
appends in flight failed, some UNKNOWN (in doubt), which a retrying client may duplicate
(drained replica: 1 UNAVAILABLE and 3 UNKNOWN of ~1,600; Gazette, run the same way: none of
~5,600)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.broker.test_pipelined_appends import JOURNAL, _every_member_reads
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("victim", ["replica", "primary"])
async def test_a_member_drained_under_appends_fails_none(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, victim: str
) -> None:
    cluster = Cluster(tmp_path, etcd, etcd_root)
    for i in range(4):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    await cluster.start()
    try:
        spec = journal_spec(JOURNAL, replication=3, length=64 << 20)
        spec.fragment.refresh_interval.seconds = 1
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([JOURNAL], 3)
        primary = cluster.primary_of(JOURNAL)
        assert primary is not None
        members = cluster.members_of(JOURNAL)
        drained = primary if victim == "primary" else next(b for b in members if b is not primary)
        # Appends go through a broker that stays (proxied if it isn't the primary).
        stub = cluster.stub(next(b for b in cluster.brokers if b is not drained))
        assert (await append_once(stub, JOURNAL, b"first\n", within=30)).status == pb.OK
        stop = asyncio.Event()
        acked: dict[bytes, tuple[int, int]] = {}
        errors: list[str] = []
        progress = asyncio.Condition()

        async def acked_at_least(n: int) -> None:
            async with asyncio.timeout(30), progress:
                await progress.wait_for(lambda: len(acked) >= n)

        async def writer(w: int) -> None:
            seq = 0
            while not stop.is_set():
                data = f"w{w}-{seq}\n".encode() * 50
                seq += 1
                try:
                    resp = await append_once(stub, JOURNAL, data, within=30)
                except grpc.aio.AioRpcError as exc:
                    errors.append(f"{exc.code().name}: {exc.details()}")
                    await asyncio.sleep(0.05)
                    continue
                assert resp.status == pb.OK, resp
                acked[data] = (resp.commit.begin, resp.commit.end)
                async with progress:
                    progress.notify_all()

        writers = [asyncio.create_task(writer(w)) for w in range(6)]
        try:
            await acked_at_least(100)
            await asyncio.to_thread(drained.stop, 60.0)  # Drains, then exits.
            await cluster.wait_ready([JOURNAL], 3)
            settled = len(acked)
            await acked_at_least(settled + 100)
        finally:
            stop.set()
            await asyncio.gather(*writers)
        assert not errors, f"{len(errors)} appends failed, {len(acked)} acknowledged: {errors}"

        content, head = await read_range(stub, JOURNAL)
        assert head == len(content)
        for data, (begin, end) in acked.items():
            assert content[begin:end] == data
        assert sum(end - begin for begin, end in acked.values()) + len(b"first\n") == head
        await _every_member_reads(cluster, 3, content)
    finally:
        await cluster.close()


async def test_an_append_streaming_while_the_journal_loses_a_replica_commits(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """The journal's replication goes from 3 to 2 while an append streams: the allocator drops
    a replica, whose stream ended at once (UNAVAILABLE 'replica is stopping'), failing the
    append; as with Gazette, the replica leaving under the same primary now serves the
    stream until the primary closes it (at most STOP_WAIT_SECONDS), and the append commits."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    await cluster.start()
    try:
        spec = journal_spec(JOURNAL, replication=3, length=64 << 20)
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([JOURNAL], 3)
        primary = cluster.primary_of(JOURNAL)
        assert primary is not None
        stub = cluster.stub(primary)
        assert (await append_once(stub, JOURNAL, b"first\n", within=30)).status == pb.OK
        chunk = b"x" * 99_999 + b"\n"
        sent = 0

        async def requests() -> AsyncIterator[pb.AppendRequest]:
            nonlocal sent
            yield pb.AppendRequest(journal=JOURNAL)
            # Content flows (well above the minimum rate) until the route has dropped a member.
            while sent < 20 or len(cluster.members_of(JOURNAL)) != 2:
                assert sent < 1000, "the allocator never dropped a replica"
                yield pb.AppendRequest(content=chunk)
                sent += 1
                if sent == 10:
                    selector = pb.LabelSelector(
                        include=pb.LabelSet(labels=[pb.Label(name="name", value=JOURNAL)])
                    )
                    listing = await stub.List(pb.ListRequest(selector=selector)).read()
                    listed = listing.journals[0]
                    changed = pb.JournalSpec()
                    changed.CopyFrom(listed.spec)
                    changed.replication = 2
                    change = pb.ApplyRequest.Change(
                        upsert=changed, expect_mod_revision=listed.mod_revision
                    )
                    applied = await stub.Apply(pb.ApplyRequest(changes=[change]))
                    assert applied.status == pb.OK, applied
                await asyncio.sleep(0.01)
            yield pb.AppendRequest()

        await cluster.observe()
        resp = await stub.Append(requests(), timeout=60)
        assert resp.status == pb.OK, resp
        assert resp.commit.end - resp.commit.begin == sent * len(chunk)
        after = await append_once(stub, JOURNAL, b"after\n", within=30)
        assert after.status == pb.OK and after.commit.begin == resp.commit.end, after
        content, head = await read_range(stub, JOURNAL)
        assert head == len(content) == after.commit.end
        assert content[resp.commit.begin : resp.commit.end] == chunk * sent
    finally:
        await cluster.close()
