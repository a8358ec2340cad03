"""A client that abandons its append (cancels its call mid-stream, or just after its commit
chunk) fails no other client's append, as with Gazette's brokers: its content is rolled back
on every peer, or its commit goes on (also when the client leaves as the commit lands in the
primary's synced spool), and the pipeline stays in use. Broken, every append in flight around
it failed, most of them UNKNOWN (in doubt)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.broker.test_pipelined_appends import _read_direct
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNAL = "pipelined/journal"  # `_read_direct` reads this one.
ABANDONED = b"abandoned " * 10_000 + b"\n"  # Chunks past the broker's read-ahead (256 KiB).


async def _abandon(stub: pb_grpc.JournalStub, after_commit: bool, rng: random.Random) -> None:
    """An append of 5 chunks of ABANDONED, cancelled mid-stream (or, `after_commit`, within
    a few ms of its commit chunk and the end of its stream)."""
    sent = asyncio.Event()

    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL)
        for _ in range(5):
            yield pb.AppendRequest(content=ABANDONED)
        if after_commit:
            yield pb.AppendRequest()
            sent.set()
            return
        sent.set()
        await asyncio.Event().wait()  # Until cancelled.

    call = stub.Append(requests(), timeout=30)
    await sent.wait()
    await asyncio.sleep(rng.random() * 0.005)
    call.cancel()
    try:
        await call
    except (grpc.aio.AioRpcError, asyncio.CancelledError):
        pass


@pytest.mark.parametrize(
    ("after_commit", "sync"),
    [(False, False), (True, False), (True, True)],
    # With --sync a commit waits for the spool's disk: a client leaving meanwhile.
    ids=["mid-stream", "after-commit", "after-commit-synced"],
)
@pytest.mark.parametrize("replication", [3, 2])
async def test_an_abandoned_append_fails_no_other_append(
    tmp_path: Path,
    etcd: EtcdProcess,
    etcd_root: str,
    replication: int,
    after_commit: bool,
    sync: bool,
) -> None:
    cluster = Cluster(tmp_path, etcd, etcd_root, broker_args=["--sync"] if sync else [])
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    await cluster.start()
    try:
        spec = journal_spec(JOURNAL, replication=replication, length=64 << 20)
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([JOURNAL], replication)
        primary = cluster.primary_of(JOURNAL)
        assert primary is not None
        stub = cluster.stub(primary)
        assert (await append_once(stub, JOURNAL, b"first\n")).status == pb.OK
        stop = asyncio.Event()
        acked: dict[bytes, tuple[int, int]] = {}
        errors: list[str] = []

        async def writer(w: int) -> None:
            seq = 0
            while not stop.is_set():
                data = f"w{w}-{seq}\n".encode() * 50
                seq += 1
                try:
                    resp = await append_once(stub, JOURNAL, data)
                except grpc.aio.AioRpcError as exc:
                    errors.append(f"{exc.code().name}: {exc.details()}")
                    continue
                assert resp.status == pb.OK, resp
                acked[data] = (resp.commit.begin, resp.commit.end)

        writers = [asyncio.create_task(writer(w)) for w in range(6)]
        rng = random.Random(7)
        try:
            for _ in range(20):
                await _abandon(stub, after_commit, rng)
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*writers)
        assert not errors, f"{len(errors)} appends failed, {len(acked)} acknowledged: {errors[0]}"

        # Every acknowledged append is where it was acknowledged; every other byte is a whole
        # abandoned append that committed (its client gone, after its commit).
        content, head = await read_range(stub, JOURNAL)
        assert head == len(content)
        for data, (begin, end) in acked.items():
            assert content[begin:end] == data
        covered = sorted([(0, len(b"first\n")), *acked.values()])
        pos = 0
        for begin, end in covered:
            gap = content[pos:begin]
            assert gap == ABANDONED * (len(gap) // len(ABANDONED)), f"garbage at {pos}"
            pos = end
        assert content[pos:] == ABANDONED * (len(content[pos:]) // len(ABANDONED))
        if not after_commit:
            assert b"abandoned" not in content
        for b in cluster.members_of(JOURNAL):
            assert await _read_direct(cluster, b, head) == content, b.member_key
    finally:
        await cluster.close()
