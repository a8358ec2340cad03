"""Pipelined replication on a real three-broker cluster: concurrent appends to one journal
at replication 3 stream behind each other's commits, yet are acknowledged in order, at
contiguous offsets; and a replica killed mid-pipeline (at replication 3, and 2, where commits
confirm themselves) fails the appends in flight (none is
acknowledged without every replica, and none that failed outright surfaces later: only one
whose confirmation was under way may, and it is reported as in doubt) before the journal
recovers."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, ClusterBroker, append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

JOURNAL = "pipelined/journal"


async def _cluster(tmp_path: Path, etcd: EtcdProcess, root: str, replication: int = 3) -> Cluster:
    cluster = Cluster(tmp_path, etcd, root)
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    await cluster.start()
    spec = journal_spec(JOURNAL, replication=replication, length=4 << 20)
    # Members list the store often: what one persisted, the others read from it soon.
    spec.fragment.refresh_interval.seconds = 1
    assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
    await cluster.wait_ready([JOURNAL], replication)
    return cluster


def _primary(cluster: Cluster) -> ClusterBroker:
    primary = cluster.primary_of(JOURNAL)
    assert primary is not None
    return primary


def _record(w: int, seq: int, rng: random.Random) -> bytes:
    return f"w{w}-{seq}:".encode() + bytes(rng.choices(b"abcdefgh", k=rng.randint(0, 20000)))


async def test_concurrent_appends_are_acknowledged_in_order(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    cluster = await _cluster(tmp_path, etcd, etcd_root)
    try:
        stub = cluster.stub(_primary(cluster))
        rng = random.Random(1)
        acks: list[tuple[int, int, bytes]] = []  # In the order responses arrived.

        async def writer(w: int) -> None:
            for seq in range(25):
                data = _record(w, seq, rng) + b"\n"
                resp = await append_once(stub, JOURNAL, data, chunk=4096)
                assert resp.status == pb.OK, resp
                assert resp.commit.sum == sha1sum_from_digest(hashlib.sha1(data).digest())
                acks.append((resp.commit.begin, resp.commit.end, data))
                # In order: once an append is acknowledged, everything below it is committed
                # (the write head covers it). Arrival order across separate streams is the
                # client's scheduling, not the broker's.
                meta = await stub.Read(
                    pb.ReadRequest(journal=JOURNAL, offset=0, metadata_only=True), timeout=30
                ).read()
                assert meta.write_head >= resp.commit.end, (meta, resp.commit)

        await asyncio.gather(*(writer(w) for w in range(12)))

        # Contiguous: the commits tile the journal, each append whole where it said.
        ordered = sorted(acks)
        for (_, end, _d), (begin, _e, _d2) in itertools.pairwise(ordered):
            assert begin == end
        # Every broker reads back the same journal (replicas directly, not via the primary).
        content, head = await read_range(stub, JOURNAL)
        assert head == len(content) == ordered[-1][1]
        for begin, end, data in ordered:
            assert content[begin:end] == data
        for b in cluster.brokers:
            replica_content = await _read_direct(cluster, b, head)
            assert replica_content == content, b.member_key
    finally:
        await cluster.close()


# At replication 2 the route is a pair, whose commits confirm themselves (`pipeline`).
@pytest.mark.parametrize("replication", [3, 2])
async def test_replica_killed_mid_pipeline(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, replication: int
) -> None:
    cluster = await _cluster(tmp_path, etcd, etcd_root, replication)
    acked: dict[bytes, tuple[int, int]] = {}
    failed: set[bytes] = set()  # The broker said so (UNAVAILABLE: confirmed nowhere).
    in_doubt: set[bytes] = set()  # UNKNOWN: its confirmation was under way.
    sent: set[bytes] = set()
    stop = asyncio.Event()
    progress = asyncio.Condition()

    async def until(cond: Callable[[], bool], within: float) -> None:
        async with asyncio.timeout(within), progress:
            await progress.wait_for(cond)

    try:
        primary = _primary(cluster)
        stub = cluster.stub(primary)

        async def writer(w: int) -> None:
            rng = random.Random(w)
            seq = 0
            while not stop.is_set():
                data = _record(w, seq, rng) * 8 + b"\n"
                seq += 1
                sent.add(data)
                try:
                    resp = await append_once(stub, JOURNAL, data, within=60, chunk=16384)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        failed.add(data)
                    elif exc.code() == grpc.StatusCode.UNKNOWN:
                        in_doubt.add(data)
                    resp = None
                if resp is not None and resp.status == pb.OK:
                    acked[data] = (resp.commit.begin, resp.commit.end)
                async with progress:
                    progress.notify_all()
                if resp is None or resp.status != pb.OK:
                    await asyncio.sleep(0.05)

        writers = [asyncio.create_task(writer(w)) for w in range(8)]
        await until(lambda: len(acked) >= 40, 60)
        victim = next(b for b in cluster.members_of(JOURNAL) if b is not primary)
        victim.kill()  # Appends are streaming and committing right now.
        await until(lambda: bool(failed or in_doubt), 60)
        # The journal recovers: the allocator replaces the replica (or it comes back).
        await asyncio.to_thread(victim.start, 60.0)
        await cluster.wait_ready([JOURNAL], replication)
        recovered = len(acked)
        await until(lambda: len(acked) >= recovered + 40, 90)
        stop.set()
        await asyncio.gather(*writers)

        content, head = await read_range(cluster.stub(_primary(cluster)), JOURNAL)
        assert head == len(content)
        for data, (begin, end) in acked.items():
            assert content[begin:end] == data, "an acknowledged append was lost"
        pos, seen = 0, set()
        while pos < len(content):
            end = content.index(b"\n", pos) + 1
            record = content[pos:end]
            assert record in sent, f"garbage at offset {pos}"
            assert record not in seen, f"record at {pos} appears twice"
            seen.add(record)
            pos = end
        assert not (seen & failed), "an append that failed surfaced later"
        print(f"{len(acked)} acknowledged, {len(failed)} failed, {len(in_doubt)} in doubt")
        # Every member holds every acknowledged append.
        await _every_member_reads(cluster, replication, content)
    finally:
        stop.set()
        await cluster.close()


class _NotAMember(Exception):
    """The broker doesn't serve the journal (any more): its route is `header.route`."""

    def __init__(self, header: pb.Header) -> None:
        members = ", ".join(f"{m.zone}#{m.suffix}" for m in header.route.members)
        super().__init__(f"the route is [{members}] at revision {header.etcd.revision}")
        self.header = header


async def _every_member_reads(cluster: Cluster, replication: int, content: bytes) -> None:
    """Each member of the journal's route reads all of `content` directly (`_read_direct`).

    The route may still change while they do: a replica killed and restarted rejoins the
    cluster only once its old lease expired, and the allocator may then move the journal
    back to it (zones), dropping the broker that replaced it after the last appends. A broker
    that says it no longer serves the journal is passed over, and the members are looked up
    again (at its revision at least): each broker checked was a member when it answered."""
    ks = await cluster.observe()
    checked: set[str] = set()
    async with asyncio.timeout(120):
        while True:
            await cluster.wait_ready([JOURNAL], replication)
            pending = [b for b in cluster.members_of(JOURNAL) if b.member_key not in checked]
            if not pending:
                return
            for b in pending:
                try:
                    got = await _read_direct(cluster, b, len(content))
                except _NotAMember as exc:
                    print(f"{b.member_key} left the route meanwhile: {exc}")
                    await ks.wait_for_revision(exc.header.etcd.revision)
                    break
                assert got == content, b.member_key
                checked.add(b.member_key)


async def _read_direct(cluster: Cluster, broker: ClusterBroker, head: int) -> bytes:
    """Read [0, head) from `broker` itself (do_not_proxy): its spools, and the fragments it
    persisted or lists (which it names by URL in the shared `file://` store)."""
    out = bytearray()
    last: pb.ReadResponse | None = None  # What the broker answered last, should it stall.
    try:
        async with asyncio.timeout(60):
            while len(out) < head:
                progress = len(out)
                async for resp in cluster.stub(broker).Read(
                    pb.ReadRequest(
                        journal=JOURNAL, offset=len(out), block=False, do_not_proxy=True
                    ),
                    timeout=10,
                ):
                    last = resp
                    if resp.status == pb.NOT_JOURNAL_BROKER:
                        raise _NotAMember(resp.header)
                    if resp.status != pb.OK:
                        break  # Not yet confirmed or listed here: try again.
                    if resp.fragment_url:
                        path = cluster.file_root / resp.fragment_url.removeprefix("file:///")
                        frag = resp.fragment
                        out += path.read_bytes()[len(out) - frag.begin :]
                        assert len(out) == frag.end
                        break
                    if resp.content:
                        assert resp.offset == len(out)
                        out += resp.content
                if len(out) == progress:
                    await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(
            f"{broker.member_key} served [0, {len(out)}) of [0, {head}); last answer: {last}"
        ) from None
    return bytes(out[:head])
