"""A broker's lifecycle under failure: draining on SIGTERM while its membership or its
store fails."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import grpc
import pytest

from pygazette.broker.replica import spool_directory
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import RetryReader
from pygazette.keyspace.keyspace import Delete
from pygazette.keyspace.layout import decode_broker_spec
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.broker.test_cluster_faults import Workload
from tests.support.broker_process import BrokerProcess
from tests.support.cluster import Cluster, ClusterBroker, append_once, read_range
from tests.support.etcd_process import EtcdProcess
from tests.support.s3_server import S3Server
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow


async def test_a_draining_broker_that_loses_its_lease_exits_at_once(tmp_path: Path) -> None:
    """SIGTERM starts a drain; etcd then goes away for good. The broker's lease lapses after
    its TTL (3 s here) and, as Gazette's, it must exit then (non-zero: it left the cluster
    without handing its journals over), not serve out the rest of its drain timeout."""
    own = EtcdProcess(tmp_path / "etcd")
    own.start()
    cluster = Cluster(tmp_path, own, "/lifecycle/gazette/cluster")
    draining = cluster.add("zone-a", "broker-a")
    draining.extra_args += ["--drain-timeout", "300s"]
    # No room elsewhere: the journal stays on the draining broker, whose drain goes on.
    cluster.add("zone-b", "broker-b").extra_args += ["--journal-limit", "0"]
    journal = "lifecycle/j"
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=1)
        assert (await apply_specs(cluster.stub(draining), spec)).status == pb.OK
        await cluster.wait_ready([journal], 1)
        assert cluster.primary_of(journal) is draining

        assert draining.proc is not None
        draining.proc.send_signal(signal.SIGTERM)
        key = cluster.layout.member_key(draining.zone, draining.suffix)

        def exiting() -> bool:
            assert cluster.ks is not None
            kv = cluster.ks.get(key)
            return kv is not None and decode_broker_spec(cluster.layout, kv).exiting

        await cluster.wait_for(exiting, "the broker marks itself exiting")
        own.stop()  # etcd is gone: the lease can't be kept alive.
        lost_at = time.monotonic()
        try:
            code = await asyncio.to_thread(draining.wait_exit, 40.0)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still draining {time.monotonic() - lost_at:.0f} s after etcd went away\n"
                f"{draining.log()}"
            ) from None
        assert code != 0, draining.log()
        assert "lease" in draining.log()
    finally:
        await cluster.close()
        own.kill()


@pytest.fixture
def s3_behind_proxy(s3_server: S3Server) -> Iterator[tuple[TcpProxy, str]]:
    """A bucket's store URL reaching the S3 server through a proxy the test can cut."""
    proxy = TcpProxy(s3_server.port)
    try:
        yield proxy, s3_server.store_url(s3_server.create_bucket(), endpoint=proxy.endpoint)
    finally:
        proxy.close()


async def test_a_drained_broker_persists_its_spools_before_it_exits(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, s3_behind_proxy: tuple[TcpProxy, str]
) -> None:
    """A journal of replication 1 moves off a broker on SIGTERM (a scale-in): what it was
    appended until then lies in that broker's spool alone, until persisted. With the store
    slow to take it (out for a while, here), the broker must not exit before it persisted
    them, as Gazette's waits for its persister: it may never run again, and the journal's
    acknowledged appends would be missing from the store and from its new broker."""
    proxy, store = s3_behind_proxy
    cluster = Cluster(tmp_path, etcd, etcd_root)
    leaving = cluster.add("zone-a", "broker-a")
    leaving.extra_args += ["--retention-interval", "0s"]
    staying = cluster.add("zone-b", "broker-b")
    staying.extra_args += ["--retention-interval", "0s"]
    journal = "lifecycle/scaled-in"
    data = b"".join(f"record {i:04d}\n".encode() for i in range(200))
    try:
        await cluster.start(leaving)
        spec = journal_spec(journal, replication=1, length=1 << 20, stores=[store])
        assert (await apply_specs(cluster.stub(leaving), spec)).status == pb.OK
        await cluster.wait_ready([journal], 1)
        resp = await append_once(cluster.stub(leaving), journal, data)
        assert resp.status == pb.OK and resp.commit.begin == 0, resp
        await cluster.start(staying)

        proxy.cut()  # The store is out: the spool can't persist for now.
        assert leaving.proc is not None
        leaving.proc.send_signal(signal.SIGTERM)
        await cluster.wait_for(
            lambda: cluster.members_of(journal) == [staying] and cluster.ready(journal, 1),
            "the journal moves to the staying broker",
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = await asyncio.to_thread(leaving.wait_exit, 15.0)
            raise AssertionError(
                f"exited ({code}) while its spool was not persisted\n{leaving.log()}"
            )
        proxy.restore()
        assert await asyncio.to_thread(leaving.wait_exit, 60.0) == 0, leaving.log()

        content, head = await _read_retrying(cluster, staying, journal)
        assert head >= len(data) and content[: len(data)] == data
    finally:
        await cluster.close()


async def _read_retrying(
    cluster: Cluster, broker: ClusterBroker, journal: str, within: float = 60.0
) -> tuple[bytes, int]:
    """`read_range`, retried as clients retry UNAVAILABLE (the broker's listing of the
    store, which failed while it was out, is retried on a backoff)."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await read_range(cluster.stub(broker), journal)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
            await asyncio.sleep(0.5)


async def test_a_broker_whose_member_key_is_deleted_leaves_and_rejoins(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """The primary's member key is deleted (by hand) under appends: as Gazette's, it stops
    serving and exits non-zero; its journal goes on elsewhere; restarted, it rejoins. Every
    acknowledged append reads back where its commit said, exactly once."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    journal = "lifecycle/keyless"
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=2, length=64 * 1024)
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([journal], 2)
        work = Workload(cluster, journal)
        work.start()
        await work.wait_acks(60)
        primary = cluster.primary_of(journal)
        assert primary is not None
        ks = await cluster.observe()
        deleted_at = time.monotonic()
        await ks.txn([], [Delete(cluster.layout.member_key(primary.zone, primary.suffix))])
        code = await asyncio.to_thread(primary.wait_exit, 30.0)
        assert code != 0, primary.log()
        await work.wait_ack_after(deleted_at, 45.0)
        await cluster.wait_for(
            lambda p=primary: p not in cluster.members_of(journal) and cluster.ready(journal, 2),
            "the journal goes on without the broker",
        )
        await work.wait_acks(40)
        await asyncio.to_thread(primary.start, 60.0)
        await cluster.wait_for(lambda p=primary: cluster.is_member(p), "it rejoins")
        await work.wait_acks(40)
        await work.finish()
        await work.verify()
    finally:
        await cluster.close()


async def test_a_broker_whose_member_key_is_deleted_revokes_its_lease_as_it_leaves(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """The primary's member key is deleted by hand. The broker leaves (non-zero) and, as
    Gazette's does (its session closes the lease as its tasks end), revokes its lease, which
    is still alive: its assignments go with it and the journal goes on elsewhere at once.
    Left to lapse, the lease (30 s here) kept the broker's assignments, and the journal's
    appends failed ('unusable peer endpoint') until it expired."""
    cluster = Cluster(tmp_path, etcd, etcd_root, lease_ttl="30s")
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    journal = "lifecycle/keyless-revoked"
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=2)
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([journal], 2)
        primary = cluster.primary_of(journal)
        assert primary is not None
        ks = await cluster.observe()
        await ks.txn([], [Delete(cluster.layout.member_key(primary.zone, primary.suffix))])
        assert await asyncio.to_thread(primary.wait_exit, 10.0) != 0, primary.log()
        await cluster.wait_for(
            lambda p=primary: p not in cluster.members_of(journal) and cluster.ready(journal, 2),
            "the journal goes on without the broker, before its lease would lapse",
            within=15.0,
        )
        other = next(b for b in cluster.running() if b is not primary)
        assert (await append_once(cluster.stub(other), journal, b"after\n")).status == pb.OK
    finally:
        await cluster.close()


async def test_no_spool_directory_is_left_of_a_journal_gone_from_the_broker(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """A journal deleted (or moved away) leaves no directory in the broker's spool root
    once its spools persisted: one was kept, empty, for every journal the broker ever
    held, and every start listed them all again."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    broker = cluster.add("zone-a", "broker-a")
    names = [f"lifecycle/gone-{i}" for i in range(3)]
    try:
        await cluster.start()
        specs = [journal_spec(n, replication=1) for n in names]
        assert (await apply_specs(cluster.stub(broker), *specs)).status == pb.OK
        await cluster.wait_ready(names, 1)
        for n in names:
            assert (await append_once(cluster.stub(broker), n, b"record\n")).status == pb.OK
        spools = broker.data_dir / "spools"
        directories = [spool_directory(spools, n) for n in names]
        assert all(d.is_dir() for d in directories)
        deletes = [pb.ApplyRequest.Change(delete=n, expect_mod_revision=-1) for n in names]
        resp = await cluster.stub(broker).Apply(pb.ApplyRequest(changes=deletes))
        assert resp.status == pb.OK
        async with asyncio.timeout(60):  # A sweep runs every 10 s.
            while any(d.exists() for d in directories):  # noqa: ASYNC110 (polls files)
                await asyncio.sleep(0.5)
    finally:
        await cluster.close()


@pytest.mark.parametrize("how", ["blackhole", "cut"])
async def test_a_broker_cut_off_from_etcd_alone_leaves_and_rejoins(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, how: str
) -> None:
    """The allocator's leader (the oldest broker) loses etcd while its peers keep it, under
    appends: etcd's answers are lost (`blackhole`: its requests still land, keep-alives
    included) or its connections refused (`cut`). It must stop serving and exit non-zero
    once its lease may have expired; the others go on without it; restarted with etcd
    back, it rejoins. No acknowledged append is lost, no refused one surfaces."""
    proxy = TcpProxy(etcd.client_port)
    cluster = Cluster(tmp_path, etcd, etcd_root)
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    cut_off = cluster.brokers[0]
    base = cut_off.command

    def via_proxy(port: int) -> list[str]:
        return [*base(port), "--etcd", proxy.url]  # The last --etcd wins.

    cut_off.command = via_proxy  # type: ignore[method-assign]
    journals = [f"lifecycle/cut-{i}" for i in range(3)]
    try:
        await cluster.start()
        specs = [journal_spec(j, replication=2, length=64 * 1024) for j in journals]
        assert (await apply_specs(cluster.stub(cluster.brokers[1]), *specs)).status == pb.OK
        await cluster.wait_ready(journals, 2)
        works = [Workload(cluster, j) for j in journals]
        for w in works:
            w.start(writers=2, readers=1)
        for w in works:
            await w.wait_acks(30)
        if how == "blackhole":
            proxy.blackhole()
        else:
            proxy.cut()
        cut_at = time.monotonic()
        code = await asyncio.to_thread(cut_off.wait_exit, 45.0)
        assert code != 0, cut_off.log()
        for w in works:
            await w.wait_ack_after(cut_at, 45.0)
        await cluster.wait_for(
            lambda: all(
                cut_off not in cluster.members_of(j) and cluster.ready(j, 2) for j in journals
            ),
            "the journals go on without the broker",
        )
        for w in works:
            await w.wait_acks(20)
        if how == "blackhole":
            proxy.reset()  # Forwards normally again.
        else:
            proxy.restore()
        await asyncio.to_thread(cut_off.start, 60.0)
        await cluster.wait_for(lambda: cluster.is_member(cut_off), "it rejoins")
        for w in works:
            await w.wait_acks(20)
        for w in works:
            await w.finish()
        for w in works:
            await w.verify()
    finally:
        await cluster.close()
        proxy.close()


def _failed_pulses(log: str) -> list[float]:
    """When each failed pulse of the broker's log was logged (Unix seconds)."""
    return [
        datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        for m in re.finditer(r"time=(\S+) .*journal pulse failed.*INDEX_HAS_GREATER_OFFSET", log)
    ]


async def test_a_journal_that_lost_every_broker_is_pulsed_less_and_less(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """The only broker of a journal of replication 1 is killed with content it never
    persisted: the broker it moves to refuses appends (INDEX_HAS_GREATER_OFFSET) until an
    operator resets its head, and so fails every pulse. Failed pulses back off (up to a
    minute, Gazette's pulse interval) instead of running, and logging, every second for as
    long as the journal stays so."""
    store = tmp_path / "store"
    store.mkdir()

    def broker(name: str) -> BrokerProcess:
        return BrokerProcess(
            tmp_path / name,
            extra_args=[
                *etcd.client_flags,
                *("--etcd-prefix", etcd_root, "--id", name, "--lease-ttl", "2s"),
                *("--file-root", str(store)),
            ],
            env={"PYGAZETTE_LOG_LEVEL": "info"},
        )

    journal = "lifecycle/lost"
    spec = journal_spec(journal, replication=1, length=1 << 20)
    spec.fragment.refresh_interval.seconds = 1
    first = broker("broker-a")
    await asyncio.to_thread(first.start)
    try:
        channel = grpc.aio.insecure_channel(first.address)
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        assert (await apply_specs(stub, spec)).status == pb.OK
        async with asyncio.timeout(60):
            while True:
                if (await append_once(stub, journal, b"abc\n")).status == pb.OK:
                    break
                await asyncio.sleep(0.2)  # Until the journal has its broker.
        # The second append rolls the first's spool: [0, 4) is persisted, [4, 8) only spooled.
        assert (await append_once(stub, journal, b"def\n")).status == pb.OK
        async with asyncio.timeout(30):
            while not any(p.name.startswith(f"{0:016x}-{4:016x}-") for p in store.rglob("*")):  # noqa: ASYNC110 (polls files)
                await asyncio.sleep(0.1)
        await channel.close()
    finally:
        first.kill()  # Its spool, with [4, 8), is lost with it.

    second = broker("broker-b")
    await asyncio.to_thread(second.start)
    try:
        async with grpc.aio.insecure_channel(second.address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            async with asyncio.timeout(60):
                while True:
                    with contextlib.suppress(grpc.aio.AioRpcError):  # Proxied to the dead.
                        resp = await append_once(stub, journal, b"x\n")
                        if resp.status == pb.INDEX_HAS_GREATER_OFFSET:
                            break
                    await asyncio.sleep(0.2)  # Until the journal moved to this broker.
        async with asyncio.timeout(60):
            while len(failed := _failed_pulses(second.log_path.read_text())) < 5:  # noqa: ASYNC110 (polls its log)
                await asyncio.sleep(0.2)
        gaps = [round(b - a, 1) for a, b in itertools.pairwise(failed)]
        assert gaps[3] >= 5.0, f"failed pulses every {gaps} s"
    finally:
        second.stop()


async def test_blocking_reads_follow_their_journal_as_its_brokers_move(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """Blocking reads (through two brokers, one of them the primary) stay open while the
    journal's brokers move under appends: its primary stops gracefully (its journal moves),
    then another broker is killed -9 and restarted. Each reader reads every byte once, in
    order, without a gap: what the journal holds once the appends are done."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    for i in range(4):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    journal = "lifecycle/followed"
    clients: list[JournalClient] = []
    readers: list[RetryReader] = []
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=2, length=32 * 1024)
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([journal], 2)
        primary = cluster.primary_of(journal)
        assert primary is not None
        other = next(b for b in cluster.brokers if b not in cluster.members_of(journal))
        read: list[bytearray] = []
        for b in (primary, other):
            client = JournalClient(b.address)
            clients.append(client)
            readers.append(RetryReader(client, journal, offset=0, block=True))
            read.append(bytearray())

        async def follow(reader: RetryReader, into: bytearray) -> None:
            while True:
                into += await reader.read(1 << 16)

        followers = [asyncio.create_task(follow(r, d)) for r, d in zip(readers, read, strict=True)]
        work = Workload(cluster, journal)
        work.start(writers=3, readers=0)
        await work.wait_acks(50)
        await asyncio.to_thread(primary.stop, 60.0)  # SIGTERM: the journal moves.
        assert primary.proc is not None and primary.proc.returncode == 0, primary.log()
        await cluster.wait_ready([journal], 2)
        await work.wait_acks(50)
        victim = next(b for b in cluster.members_of(journal) if b is not other)
        victim.kill()
        await work.wait_acks(30, within=90)
        await asyncio.to_thread(victim.start, 60.0)
        await asyncio.to_thread(primary.start, 60.0)
        await cluster.wait_ready([journal], 2)
        await work.wait_acks(30)
        await work.finish()
        await work.verify()
        content, head = await read_range(cluster.stub(other), journal)
        async with asyncio.timeout(60):
            while any(len(d) < head for d in read):  # noqa: ASYNC110 (the readers fill them)
                await asyncio.sleep(0.1)
        for f in followers:
            f.cancel()
        await asyncio.wait(followers)
        for d in read:
            assert bytes(d[:head]) == content, f"read {len(d)} bytes, differing from the journal"
    finally:
        for r in readers:
            r.cancel()
        for c in clients:
            await c.close()
        await cluster.close()


async def test_a_whole_cluster_stopped_at_once_exits_promptly_and_keeps_every_append(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """Every broker gets SIGTERM at once (a cluster shut down): none can take the others'
    journals, so each leaves without waiting out its drain timeout, and exits 0. Started
    again on the same data directories, they serve every acknowledged append."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    for b in cluster.brokers:
        b.extra_args += ["--drain-timeout", "120s"]
    journals = {f"lifecycle/all-{r}-{i}": r for r in (1, 2) for i in range(3)}
    try:
        await cluster.start()
        specs = [journal_spec(j, replication=r, length=4096) for j, r in journals.items()]
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), *specs)).status == pb.OK
        for r in (1, 2):
            await cluster.wait_ready([j for j, jr in journals.items() if jr == r], r)
        acked: dict[str, bytes] = {}
        for n, j in enumerate(journals):
            data = b"".join(f"{j} record {k}\n".encode() for k in range(50 + n))
            resp = await append_once(cluster.stub(cluster.brokers[n % 3]), j, data)
            assert resp.status == pb.OK and resp.commit.begin == 0, resp
            acked[j] = data
        for b in cluster.brokers:
            assert b.proc is not None
            b.proc.send_signal(signal.SIGTERM)
        for b in cluster.brokers:
            try:
                code = await asyncio.to_thread(b.wait_exit, 60.0)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{b.member_key} still draining\n{b.log()}") from None
            assert code == 0, b.log()
        await cluster.start()
        for r in (1, 2):
            await cluster.wait_ready([j for j, jr in journals.items() if jr == r], r)
        for j, data in acked.items():
            content, head = await _read_retrying(cluster, cluster.brokers[0], j)
            assert content == data and head == len(data), j
    finally:
        await cluster.close()


async def test_appends_go_on_while_a_broker_is_briefly_cut_off_from_etcd(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """etcd unreachable from one broker for less than its lease (10 s): it stays a member,
    keeps its journals and takes appends meanwhile (its lease is surely alive: confirmations
    may go out), and follows the keyspace again once etcd is back."""
    proxy = TcpProxy(etcd.client_port)
    cluster = Cluster(tmp_path, etcd, etcd_root, lease_ttl="10s")
    for i in range(3):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    cut_off = cluster.brokers[0]
    base = cut_off.command

    def via_proxy(port: int) -> list[str]:
        return [*base(port), "--etcd", proxy.url]

    cut_off.command = via_proxy  # type: ignore[method-assign]
    journal = "lifecycle/brief"
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=3, length=64 * 1024)
        assert (await apply_specs(cluster.stub(cluster.brokers[1]), spec)).status == pb.OK
        await cluster.wait_ready([journal], 3)
        work = Workload(cluster, journal)
        work.start(writers=3, readers=1)
        await work.wait_acks(30)
        proxy.cut()
        async with asyncio.timeout(9):  # A keep-alive every third of the lease.
            while "lease keep-alive failed" not in cut_off.log():  # noqa: ASYNC110 (its log)
                await asyncio.sleep(0.1)
        await work.wait_ack_after(time.monotonic(), 4.0)  # Its lease may have 6 s left.
        assert cut_off.running(), cut_off.log()
        proxy.restore()
        assert cut_off.running() and cluster.is_member(cut_off), cut_off.log()
        # It follows the keyspace again: a new journal is served through it.
        other = journal_spec("lifecycle/brief-after", replication=3)
        assert (await apply_specs(cluster.stub(cluster.brokers[1]), other)).status == pb.OK
        await cluster.wait_ready([other.name], 3)
        resp = await append_once(cluster.stub(cut_off), other.name, b"after\n", within=30)
        assert resp.status == pb.OK, resp
        await work.wait_acks(30)
        await work.finish()
        await work.verify()
        assert "cannot keep the etcd lease alive" not in cut_off.log(), cut_off.log()
    finally:
        await cluster.close()
        proxy.close()


async def test_a_blocking_read_proxied_through_a_stopping_broker_ends_cleanly(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """A blocking read through a broker that doesn't serve the journal is proxied to its
    primary. SIGTERMed, that broker ends the read at once with OK, as it ends a blocking read
    it serves itself, and the client resolves the journal again. It held the read until
    gRPC's grace period ran out in the shutdown, which then ended it CANCELLED."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    for i in range(2):
        cluster.add("zone-a", f"broker-{i}")
    journal = "lifecycle/proxied"
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=1)
        assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
        await cluster.wait_ready([journal], 1)
        primary = cluster.primary_of(journal)
        assert primary is not None
        other = next(b for b in cluster.brokers if b is not primary)
        assert (await append_once(cluster.stub(primary), journal, b"hello\n")).status == pb.OK
        async with grpc.aio.insecure_channel(other.address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Read(pb.ReadRequest(journal=journal, offset=0, block=True))
            read = b""
            async with asyncio.timeout(30):
                while read != b"hello\n":  # Then it waits at the head, proxied.
                    resp = await call.read()
                    assert resp is not grpc.aio.EOF
                    read += resp.content
            assert other.proc is not None
            other.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                assert await call.read() is grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
        assert await asyncio.to_thread(other.wait_exit, 60.0) == 0, other.log()
    finally:
        await cluster.close()


async def test_a_blocking_read_proxied_after_serving_stopped_opens_no_read_on_the_primary(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocking read that reaches a broker's proxying once it stopped serving (between
    stop_serving and the gRPC server's stop; or its resolution was under way) ends at once,
    cleanly. It opened the read on the primary first and left it there, never cancelled: the
    primary held a blocking read for a client long gone, until this broker's process ended."""
    from pygazette.broker.journal_service import JournalService
    from tests.broker.test_proxied_appends import JOURNAL, TwoBrokers

    calls: list[grpc.aio.UnaryStreamCall[pb.ReadRequest, pb.ReadResponse]] = []
    peer_stub = JournalService._peer_stub

    class Recording:
        def __init__(self, stub: pb_grpc.JournalStub) -> None:
            self._stub = stub

        def Read(self, request: pb.ReadRequest) -> object:
            call = self._stub.Read(request)
            calls.append(call)
            return call

        def __getattr__(self, name: str) -> object:
            return getattr(self._stub, name)

    monkeypatch.setattr(
        JournalService,
        "_peer_stub",
        lambda self, res, context: Recording(peer_stub(self, res, context)),
    )
    brokers = TwoBrokers(tmp_path, etcd, etcd_root)
    try:
        await brokers.start()
        spec = journal_spec(JOURNAL, replication=1)
        assert (await apply_specs(brokers.stub(0), spec)).status == pb.OK
        proxy = 1 - await brokers.primary()
        brokers.brokers[proxy].resolver.stop_serving()  # Its gRPC server still takes calls.
        call = brokers.stub(proxy).Read(pb.ReadRequest(journal=JOURNAL, offset=0, block=True))
        async with asyncio.timeout(10):
            assert [r async for r in call] == []
            assert await call.code() == grpc.StatusCode.OK
        assert [c for c in calls if not c.done()] == []
    finally:
        await brokers.close()
