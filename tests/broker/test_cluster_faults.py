"""Fault tests of a cluster on a real etcd: brokers killed, restarted, frozen, added, removed.

Writers append self-describing records through any broker (moving to another on errors),
readers poll the write head through any broker, while brokers fail. Afterwards every broker
must read back the same journal, holding every acknowledged append at the offsets its
commit reported, exactly once; every byte must belong to a whole record some writer sent;
appends that failed must not have surfaced (beyond the rare one whose acknowledgement was
lost on the way back); and no reader ever saw the write head move backwards.

`make test-faults` runs the long versions (PYGAZETTE_FAULT_ROUNDS rounds of each fault).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, ClusterBroker, append_once, read_range
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("PYGAZETTE_FAULT_ROUNDS", "1"))
JOURNAL = "faults/journal"
WRITERS = 4
# After a kill, appends resume once the lease (3s) expires, the allocator reassigns and the
# restarted broker rejoins and syncs: a few seconds, bounded generously for loaded machines.
RESUME_BOUND_SECONDS = 45.0
_RECORD = re.compile(rb"w(\d+)-(\d+):\.*\n")


@dataclass
class Workload:
    cluster: Cluster
    journal: str = JOURNAL
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    sent: set[bytes] = field(default_factory=set)
    # Appends a live broker refused (a status, or replication that failed before any
    # confirmation covered them): these must never surface. Other failures (a broker killed
    # mid-append, a confirmation in flight, the client's deadline) leave the append in doubt.
    refused: set[bytes] = field(default_factory=set)
    heads_seen: int = 0
    heads_from: str = ""
    regressions: list[str] = field(default_factory=list)
    last_ack: float = 0.0
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, writers: int = WRITERS, readers: int = 2) -> None:
        for w in range(writers):
            self.tasks.append(asyncio.create_task(self._writer(w)))
        for r in range(readers):
            self.tasks.append(asyncio.create_task(self._head_reader(r)))

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    def _pick(self, rng: random.Random) -> ClusterBroker | None:
        running = self.cluster.running()
        return rng.choice(running) if running else None

    async def _writer(self, w: int) -> None:
        rng = random.Random(w)
        seq = 0
        broker = None
        while not self.stop.is_set():
            if broker is None or not broker.running():
                broker = self._pick(rng)
                if broker is None:
                    await asyncio.sleep(0.05)
                    continue
            data = f"w{w}-{seq}:".encode() + b"." * rng.randint(0, 3000) + b"\n"
            seq += 1
            self.sent.add(data)
            try:
                resp = await append_once(self.cluster.stub(broker), self.journal, data, within=10)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                if _refused(exc):
                    self.refused.add(data)
                broker = None
                await asyncio.sleep(0.05)
                continue
            if resp.status != pb.OK:
                self.refused.add(data)
                await asyncio.sleep(0.1)
                continue
            self.acked[data] = (resp.commit.begin, resp.commit.end)
            self.last_ack = time.monotonic()
            async with self.progress:
                self.progress.notify_all()

    async def _head_reader(self, r: int) -> None:
        rng = random.Random(100 + r)
        broker = None
        while not self.stop.is_set():
            if broker is None or not broker.running():
                broker = self._pick(rng)
                if broker is None:
                    await asyncio.sleep(0.05)
                    continue
            # Any head reported before this request was sent, by any broker to any reader,
            # is a floor for what this one may report.
            floor, floor_from = self.heads_seen, self.heads_from
            try:
                async for resp in self.cluster.stub(broker).Read(
                    pb.ReadRequest(journal=self.journal, offset=-1, block=False), timeout=5
                ):
                    if resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE) and not resp.content:
                        head = resp.write_head
                        if head < floor:
                            self.regressions.append(
                                f"head {head} < {floor} ({floor_from}) via "
                                f"{broker.member_key} from {resp.header.process_id.suffix} "
                                f"at {time.time():.3f}"
                            )
                        if head > self.heads_seen:
                            self.heads_seen = head
                            self.heads_from = f"{resp.header.process_id.suffix} {time.time():.3f}"
                    break
            except (grpc.aio.AioRpcError, TimeoutError):
                broker = None
            await asyncio.sleep(0.01)
            if rng.random() < 0.2:
                broker = None  # Move between brokers too.

    async def wait_acks(self, more: int, within: float = 60.0) -> None:
        target = len(self.acked) + more
        try:
            async with asyncio.timeout(within), self.progress:
                await self.progress.wait_for(lambda: len(self.acked) >= target)
        except TimeoutError:
            raise AssertionError(
                f"appends stalled at {len(self.acked)} acks\n{self.cluster.log_tail()}"
            ) from None

    async def wait_ack_after(self, t: float, within: float) -> float:
        """Seconds from `t` to the first acknowledgement after it."""
        try:
            async with asyncio.timeout(within), self.progress:
                await self.progress.wait_for(lambda: self.last_ack > t)
        except TimeoutError:
            raise AssertionError(
                f"no append acknowledged within {within}s of the fault\n{self.cluster.log_tail()}"
            ) from None
        return self.last_ack - t

    async def verify(self) -> None:
        assert not self.regressions, self.regressions[:5]
        contents = {}
        for b in self.cluster.running():
            content, head = await read_range(self.cluster.stub(b), self.journal)
            assert head == len(content), f"{b.member_key}: head {head} != {len(content)}"
            contents[b.member_key] = content
        content = max(contents.values(), key=len)
        for who, other in contents.items():
            if other != content:
                differ = next(
                    (i for i, (a, b) in enumerate(zip(other, content, strict=False)) if a != b),
                    min(len(other), len(content)),
                )
                raise AssertionError(
                    f"{who} reads {len(other)} bytes, others {len(content)}; they differ at "
                    f"{differ}\n{self.cluster.log_tail()}"
                )
        assert len(content) >= self.heads_seen, "the journal is shorter than a head readers saw"
        for data, (begin, end) in self.acked.items():
            assert content[begin:end] == data, (
                f"acknowledged append lost at [{begin}, {end})\n{self.cluster.log_tail()}"
            )
        pos, seen = 0, set()
        while pos < len(content):
            m = _RECORD.match(content, pos)
            assert m is not None, f"garbage at offset {pos}: {content[pos : pos + 40]!r}"
            record = m.group(0)
            assert record in self.sent, f"unknown record at {pos}"
            assert record not in seen, f"record at {pos} appears twice"
            seen.add(record)
            pos = m.end()
        assert set(self.acked) <= seen
        # Appends a broker refused never surface later; only appends left in doubt may.
        surfaced = seen - set(self.acked)
        print(
            f"{len(self.acked)} appends acknowledged, {len(self.refused)} refused; "
            f"{len(surfaced)} unacknowledged ones in the journal, all in doubt"
        )
        assert not surfaced & self.refused, sorted(surfaced & self.refused)[:3]


def _refused(exc: BaseException) -> bool:
    """Whether an append failed cleanly: a broker's own answer that replication failed before
    any confirmation covered it (the next pipeline cuts it everywhere), as opposed to a
    broker killed mid-append, an append whose confirmation was in flight (UNKNOWN), or the
    client's deadline."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return False
    details = exc.details() or ""
    return exc.code() == grpc.StatusCode.UNAVAILABLE and details.startswith("replication of")


async def _cluster(
    tmp_path: Path, etcd: EtcdProcess, root: str, n: int = 3, *, shared_store: bool = True
) -> Cluster:
    cluster = Cluster(tmp_path, etcd, root, shared_store=shared_store)
    for i in range(n):
        cluster.add("zone-a" if i % 2 == 0 else "zone-b", f"broker-{i}")
    await cluster.start()
    spec = journal_spec(JOURNAL, replication=3, length=256 * 1024)
    assert (await apply_specs(cluster.stub(cluster.brokers[0]), spec)).status == pb.OK
    await cluster.wait_ready([JOURNAL], 3)
    return cluster


async def test_kill_primary_under_appends(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    cluster = await _cluster(tmp_path, etcd, etcd_root)
    work = Workload(cluster)
    try:
        work.start()
        for _ in range(max(1, ROUNDS)):
            await work.wait_acks(100)
            primary = cluster.primary_of(JOURNAL)
            assert primary is not None
            killed_at = time.monotonic()
            primary.kill()  # Mid-flight: writers are streaming appends right now.
            await asyncio.to_thread(primary.start, 60.0)  # A supervisor restarts it.
            resumed = await work.wait_ack_after(killed_at, RESUME_BOUND_SECONDS)
            print(f"appends resumed {resumed:.1f}s after kill -9 of the primary")
            await cluster.wait_ready([JOURNAL], 3)
            await work.wait_acks(50)
        await work.finish()
        await work.verify()
    finally:
        await cluster.close()


async def test_kill_any_broker_without_a_shared_store(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """Brokers each keep `file:///` in their own data directory, as three brokers started
    with nothing but the `serve` flags do: what a broker never held, it reads from a peer."""
    cluster = await _cluster(tmp_path, etcd, etcd_root, shared_store=False)
    work = Workload(cluster)
    rng = random.Random(7)
    try:
        work.start()
        for _ in range(max(2, ROUNDS)):
            await work.wait_acks(60)
            victim = rng.choice(cluster.brokers)
            killed_at = time.monotonic()
            victim.kill()
            await asyncio.to_thread(victim.start, 60.0)
            await work.wait_ack_after(killed_at, RESUME_BOUND_SECONDS)
            await cluster.wait_ready([JOURNAL], 3)
        await work.wait_acks(30)
        await work.finish()
        await work.verify()
    finally:
        await cluster.close()


async def test_rolling_restart_under_appends(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    cluster = await _cluster(tmp_path, etcd, etcd_root)
    work = Workload(cluster)
    try:
        work.start()
        for _ in range(max(1, ROUNDS)):
            for broker in list(cluster.brokers):
                await work.wait_acks(40)
                await asyncio.to_thread(broker.stop, 60.0)  # SIGTERM: a graceful hand-off.
                await asyncio.to_thread(broker.start, 60.0)
                await cluster.wait_ready([JOURNAL], 3)
        await work.wait_acks(40)
        await work.finish()
        await work.verify()
    finally:
        await cluster.close()


async def test_frozen_primary_is_fenced(tmp_path: Path, etcd: EtcdProcess, etcd_root: str) -> None:
    """SIGSTOP the primary; a fourth broker takes its place; the primary resumes, and exits
    without committing anything (no split brain)."""
    cluster = await _cluster(tmp_path, etcd, etcd_root, n=4)
    work = Workload(cluster)
    try:
        work.start()
        for _ in range(max(1, ROUNDS)):
            await work.wait_acks(80)
            primary = cluster.primary_of(JOURNAL)
            assert primary is not None
            frozen_at = time.monotonic()
            primary.freeze()
            # The others notice its lease expire and move on without it.
            await cluster.wait_for(
                lambda p=primary: not cluster.is_member(p), "the frozen broker's lease expires"
            )
            await cluster.wait_ready([JOURNAL], 3)
            await work.wait_ack_after(frozen_at, RESUME_BOUND_SECONDS)
            await work.wait_acks(40)
            before = dict(work.acked)
            primary.thaw()
            # It finds its lease gone and leaves; the cluster keeps serving meanwhile.
            code = await asyncio.to_thread(primary.wait_exit, 60.0)
            assert code != 0
            assert "lease" in primary.log()
            await work.wait_acks(40)
            assert set(before) <= set(work.acked)
            await asyncio.to_thread(primary.start, 60.0)
            await cluster.wait_for(lambda p=primary: cluster.is_member(p), "it rejoins")
        # Unless it got the journal back, its old spools are orphans: once the journal is
        # settled without it, they are persisted (if the store lacks them) and cleared.
        spools = primary.data_dir / "spools" / JOURNAL.replace("/", "%2F")
        async with asyncio.timeout(60):
            while primary not in cluster.members_of(JOURNAL) and list(spools.glob("*.log")):  # noqa: ASYNC110 (polls files)
                await asyncio.sleep(0.5)
        await work.finish()
        await work.verify()
    finally:
        await cluster.close()


async def test_scale_out_and_in(tmp_path: Path, etcd: EtcdProcess, etcd_root: str) -> None:
    cluster = await _cluster(tmp_path, etcd, etcd_root)
    extra = [journal_spec(f"faults/more-{i}", replication=3, length=1 << 20) for i in range(6)]
    assert (await apply_specs(cluster.stub(cluster.brokers[0]), *extra)).status == pb.OK
    names = [s.name for s in extra]
    await cluster.wait_ready(names, 3)
    work = Workload(cluster)
    try:
        work.start()
        for _ in range(max(1, ROUNDS)):
            await work.wait_acks(60)
            fourth = cluster.add("zone-b", f"broker-{len(cluster.brokers)}")
            await cluster.start(fourth)

            def rebalanced(b: ClusterBroker = fourth) -> bool:
                return sum(b in cluster.members_of(n) for n in [*names, JOURNAL]) >= 3

            await cluster.wait_for(rebalanced, "journals move to the new broker", 90)
            await cluster.wait_ready([*names, JOURNAL], 3)
            await work.wait_acks(60)
            # Scale back in: the new broker leaves gracefully, handing its journals back.
            await asyncio.to_thread(fourth.stop, 60.0)
            assert fourth.proc is not None and fourth.proc.returncode == 0, fourth.log()
            cluster.brokers.remove(fourth)
            await cluster.wait_ready([*names, JOURNAL], 3)
            for n in [*names, JOURNAL]:
                assert fourth not in cluster.members_of(n)
            await work.wait_acks(60)
        await work.finish()
        await work.verify()
    finally:
        await cluster.close()
