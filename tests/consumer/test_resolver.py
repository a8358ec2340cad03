"""The shard resolver: local replicas follow this process's assignments, replicas report
their status into their assignments, and shard IDs resolve to routes and statuses.

Replicas here are `FakeReplica` test doubles of the `ReplicaHandle` interface (the real one
is `consumer.replica`). Single-process behaviour runs on the embedded keyspace, with
assignments written by the test; allocation, leases and failover run on a real etcd with
real allocators.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pygazette.allocator.allocator import Allocator, MemberKeyMissing, ObservedState
from pygazette.allocator.session import MemberSession
from pygazette.allocator.state import Assignment
from pygazette.consumer import resolver as resolver_module
from pygazette.consumer.key_space import ShardDecoder
from pygazette.consumer.resolver import (
    STATUS_BATCH,
    STATUS_WRITERS,
    ReplicaStopped,
    ResolveError,
    ShardResolver,
    StatusReporter,
)
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import (
    Compare,
    Delete,
    Keyspace,
    KeyValue,
    Put,
    TxnResult,
)
from pygazette.keyspace.layout import AssignmentKey, KeyLayout
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.support.etcd_process import EtcdProcess

RS = cpb.ReplicaStatus
ROOT = "/gazette/consumers/app"
WITHIN = 30.0


# Test doubles and helpers (also used by test_shard_service).
class FakeReplica:
    """A ReplicaHandle whose progress the test drives.

    With `auto_status`, it reports PRIMARY when given slot 0 and STANDBY otherwise, as a
    real replica without a recovery log would.
    """

    def __init__(
        self,
        spec: cpb.ShardSpec,
        assignment: KeyValue,
        report: StatusReporter,
        *,
        auto_status: bool = True,
    ) -> None:
        self.spec = spec
        self.assignment = assignment
        self.report = report
        self.auto_status = auto_status
        self.slot: int | None = None
        self.slots: list[int] = []  # Slot of every update.
        self.updates = 0
        self.members: list[tuple[str, int]] = []  # (suffix, slot) of the last update.
        self.stopped = False
        self.read_through: dict[str, int] = {}
        self.publish_at: dict[str, int] = {}
        self.waiters = 0
        self.withins: list[float | None] = []  # The time limit of every wait_read_through.
        self._status = RS(code=RS.IDLE)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Future[None]] = set()

    @property
    def status(self) -> cpb.ReplicaStatus:
        return self._status

    def update(
        self,
        spec: cpb.ShardSpec,
        assignment: KeyValue,
        slot: int,
        all_assignments: list[Assignment],
    ) -> None:
        self.spec = spec
        self.assignment = assignment
        self.updates += 1
        self.slots.append(slot)
        self.members = [(a.suffix, a.slot) for a in all_assignments]
        if slot != self.slot:
            self.slot = slot
            if self.auto_status:
                self.set_status(RS.PRIMARY if slot == 0 else RS.STANDBY)

    def set_status(self, code: int, error: str = "") -> None:
        self._status = RS(code=code, errors=[error] if error else [])  # type: ignore[arg-type]
        task: asyncio.Future[None] = asyncio.ensure_future(self.report(self._status))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reported(self) -> None:
        """Wait for status reports in flight."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def stop(self) -> None:
        self.stopped = True
        async with self._changed:
            self._changed.notify_all()

    async def advance(self, read_through: dict[str, int], publish_at: dict[str, int]) -> None:
        self.read_through.update(read_through)
        self.publish_at.update(publish_at)
        async with self._changed:
            self._changed.notify_all()

    async def until_waiting(self, n: int = 1) -> None:
        async with asyncio.timeout(WITHIN), self._changed:
            await self._changed.wait_for(lambda: self.waiters >= n)

    async def wait_read_through(
        self, read_through: dict[str, int], within: float | None
    ) -> tuple[dict[str, int], dict[str, int]]:
        self.withins.append(within)

        def ready() -> bool:
            return self.stopped or all(
                self.read_through.get(j, -1) >= o for j, o in read_through.items()
            )

        async with asyncio.timeout(within), self._changed:
            self.waiters += 1
            self._changed.notify_all()
            try:
                await self._changed.wait_for(ready)
            finally:
                self.waiters -= 1
                self._changed.notify_all()
        if self.stopped:
            raise ReplicaStopped("stopped")
        return dict(self.read_through), dict(self.publish_at)

    def hints(self) -> rpb.FSMHints | None:
        return None


@dataclass
class Replicas:
    """A replica factory remembering what it made."""

    auto_status: bool = True
    made: list[FakeReplica] = field(default_factory=list)

    def __call__(
        self, spec: cpb.ShardSpec, assignment: KeyValue, report: StatusReporter
    ) -> FakeReplica:
        replica = FakeReplica(spec, assignment, report, auto_status=self.auto_status)
        self.made.append(replica)
        return replica

    def of(self, shard_id: str) -> list[FakeReplica]:
        return [r for r in self.made if r.spec.id == shard_id]

    def live(self, shard_id: str) -> FakeReplica | None:
        live = [r for r in self.of(shard_id) if not r.stopped]
        assert len(live) <= 1
        return live[0] if live else None


def shard_spec(
    shard_id: str,
    *,
    sources: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
    hot_standbys: int = 0,
    **kwargs: object,
) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id, hot_standbys=hot_standbys, **kwargs)  # type: ignore[arg-type]
    spec.max_txn_duration.seconds = 1
    for journal in sorted(sources):
        spec.sources.add(journal=journal)
    for name, value in sorted((labels or {}).items()):
        spec.labels.labels.add(name=name, value=value)
    return spec


def consumer_spec(zone: str, suffix: str, endpoint: str, limit: int = 10) -> cpb.ConsumerSpec:
    spec = cpb.ConsumerSpec(shard_limit=limit)
    spec.process_spec.id.zone = zone
    spec.process_spec.id.suffix = suffix
    spec.process_spec.endpoint = endpoint
    return spec


async def until(ks: Keyspace, cond: Callable[[], bool], what: str, within: float = WITHIN) -> None:
    """Wait, over keyspace changes, until `cond()` holds."""
    try:
        async with asyncio.timeout(within):
            while not cond():
                await ks.wait_for_change(ks.revision)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


# Single process, embedded keyspace, assignments written by the test.
@dataclass
class Local:
    ks: EmbeddedKeyspace
    layout: KeyLayout
    observed: ObservedState
    resolver: ShardResolver
    replicas: Replicas

    def asn_key(self, shard_id: str, suffix: str, slot: int, zone: str = "zone-a") -> str:
        return self.layout.assignment_key(AssignmentKey(shard_id, zone, suffix, slot))

    async def put(self, *ops: Put | Delete, compares: list[Compare] | None = None) -> int:
        result = await self.ks.txn(compares or [], list(ops))
        assert result.succeeded
        return result.revision


async def _local(tmp_path: Path, ks: EmbeddedKeyspace | None = None) -> Local:
    ks = ks or EmbeddedKeyspace(tmp_path / "ks.json")
    layout = KeyLayout(ROOT)
    me = layout.member_key("zone-a", "local")
    other = layout.member_key("zone-b", "peer")
    await ks.txn(
        [], [Put(me, consumer_spec("zone-a", "local", "http://local:1").SerializeToString())]
    )
    await ks.txn(
        [], [Put(other, consumer_spec("zone-b", "peer", "http://peer:2").SerializeToString())]
    )
    observed = ObservedState(ks, layout, ShardDecoder(layout), me)
    replicas = Replicas()
    spec = consumer_spec("zone-a", "local", "http://local:1")
    resolver = ShardResolver(ks, layout, observed, me, replicas, process_spec=spec.process_spec)
    resolver.start()
    return Local(ks, layout, observed, resolver, replicas)


async def test_replicas_follow_local_assignments(tmp_path: Path) -> None:
    t = await _local(tmp_path)
    reps = t.replicas
    item = t.layout.item_key("shard-000")
    await t.put(Put(item, shard_spec("shard-000", hot_standbys=1).SerializeToString()))
    assert reps.made == []  # Not assigned here.

    # Assigned here as a standby (slot 1); the peer is primary.
    await t.put(
        Put(t.asn_key("shard-000", "peer", 0, "zone-b"), b""),
        Put(t.asn_key("shard-000", "local", 1), b""),
    )
    [replica] = reps.made
    assert replica.slots == [1]
    assert replica.members == [("local", 1), ("peer", 0)]  # Key order: zone-a < zone-b.
    await replica.reported()
    assert RS.FromString(t.ks.get(t.asn_key("shard-000", "local", 1)).value).code == RS.STANDBY  # type: ignore[union-attr]

    # Another member's status changes: the replica hears of it, nothing is restarted.
    updates = replica.updates
    await t.put(
        Put(t.asn_key("shard-000", "peer", 0, "zone-b"), RS(code=RS.PRIMARY).SerializeToString())
    )
    assert replica.updates == updates + 1 and len(reps.made) == 1

    # The spec changes: an update with the new spec.
    new_spec = shard_spec("shard-000", hot_standbys=1, labels={"app": "x"})
    await t.put(Put(item, new_spec.SerializeToString()))
    assert replica.spec == new_spec

    # Promotion: the assignment moves to slot 0 (as the allocator moves it: delete and put
    # with the value). The same replica carries on, as primary.
    old = t.ks.get(t.asn_key("shard-000", "local", 1))
    assert old is not None
    await t.put(
        Delete(t.asn_key("shard-000", "peer", 0, "zone-b")),
        Delete(old.key),
        Put(t.asn_key("shard-000", "local", 0), old.value),
    )
    assert len(reps.made) == 1 and replica.slots[-1] == 0 and not replica.stopped
    await replica.reported()
    asn = t.ks.get(t.asn_key("shard-000", "local", 0))
    assert asn is not None and RS.FromString(asn.value).code == RS.PRIMARY
    assert replica.assignment.key == asn.key

    # Deleted and re-created (a new create revision, same slot): a new replica.
    await t.put(Delete(asn.key))
    await t.put(Put(asn.key, b""))
    await t.resolver.stop()  # Waits for stopping replicas.
    assert len(reps.made) == 2
    assert reps.made[0].stopped and reps.made[1].stopped


async def test_unassigned_replica_is_stopped(tmp_path: Path) -> None:
    t = await _local(tmp_path)
    await t.put(
        Put(t.layout.item_key("shard-000"), shard_spec("shard-000").SerializeToString()),
        Put(t.asn_key("shard-000", "local", 0), b""),
    )
    [replica] = t.replicas.made
    await t.put(Delete(t.asn_key("shard-000", "local", 0)))
    assert t.resolver.replicas == {}
    await t.resolver.stop()
    assert replica.stopped

    # A stopped resolver makes no more replicas.
    await t.put(Put(t.asn_key("shard-000", "local", 0), b""))
    assert len(t.replicas.made) == 1


async def test_status_reports_reduce_and_end_with_the_assignment(tmp_path: Path) -> None:
    t = await _local(tmp_path)
    t.replicas.auto_status = False
    key = t.asn_key("shard-000", "local", 0)
    await t.put(
        Put(t.layout.item_key("shard-000"), shard_spec("shard-000").SerializeToString()),
        Put(key, b""),
    )
    [replica] = t.replicas.made

    def stored() -> cpb.ReplicaStatus:
        kv = t.ks.get(key)
        assert kv is not None
        return RS.FromString(kv.value)

    await replica.report(RS(code=RS.BACKFILL))
    assert stored() == RS(code=RS.BACKFILL)
    await replica.report(RS(code=RS.PRIMARY))
    assert stored() == RS(code=RS.PRIMARY)
    # Codes never go down (Gazette's Reduce): a lower one changes nothing.
    rev = t.ks.revision
    await replica.report(RS(code=RS.STANDBY))
    assert stored() == RS(code=RS.PRIMARY) and t.ks.revision == rev
    # A status no one could decode is refused, not stored.
    with pytest.raises(ValidationError):
        await replica.report(RS(code=RS.STANDBY, errors=["x"]))
    assert stored() == RS(code=RS.PRIMARY)
    # Errors accumulate (each once); FAILED sticks.
    await replica.report(RS(code=RS.FAILED, errors=["first"]))
    await replica.report(RS(code=RS.FAILED, errors=["second"]))
    await replica.report(RS(code=RS.PRIMARY))
    assert stored().code == RS.FAILED and sorted(stored().errors) == ["first", "second"]

    # Gone assignment: a no-op.
    await t.put(Delete(key))
    rev = t.ks.revision
    await replica.report(RS(code=RS.FAILED, errors=["late"]))
    assert t.ks.revision == rev and t.ks.get(key) is None
    await t.resolver.stop()


class _RacingKeyspace(EmbeddedKeyspace):
    """Changes `race_key` just before the next transaction that compares it."""

    race_key = ""
    race_value = b""

    async def txn(self, compares: list[Compare], ops: list[Put | Delete]) -> TxnResult:  # type: ignore[override]
        if self.race_key and any(c.key == self.race_key for c in compares):
            key, self.race_key = self.race_key, ""
            await super().txn([], [Put(key, self.race_value)])
        return await super().txn(compares, ops)


async def test_status_report_retries_when_the_assignment_changed(tmp_path: Path) -> None:
    ks = _RacingKeyspace(tmp_path / "ks.json")
    t = await _local(tmp_path, ks)
    t.replicas.auto_status = False
    key = t.asn_key("shard-000", "local", 0)
    await t.put(
        Put(t.layout.item_key("shard-000"), shard_spec("shard-000").SerializeToString()),
        Put(key, b""),
    )
    [replica] = t.replicas.made
    ks.race_key = key
    ks.race_value = RS(code=RS.FAILED, errors=["concurrent"]).SerializeToString()
    await replica.report(RS(code=RS.PRIMARY))
    kv = ks.get(key)
    assert kv is not None
    # The first attempt lost to the concurrent write; the retry reduced over it.
    assert RS.FromString(kv.value) == RS(code=RS.FAILED, errors=["concurrent"])
    await replica.report(RS(code=RS.FAILED, errors=["mine"]))
    kv = ks.get(key)
    assert kv is not None and sorted(RS.FromString(kv.value).errors) == ["concurrent", "mine"]
    await t.resolver.stop()


class _CountingKeyspace(EmbeddedKeyspace):
    """Records the puts of each transaction that writes assignments."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.assignment_txns: list[int] = []

    async def txn(self, compares: list[Compare], ops: list[Put | Delete]) -> TxnResult:  # type: ignore[override]
        if compares and all("/assign/" in op.key for op in ops):
            self.assignment_txns.append(len(ops))
        return await super().txn(compares, ops)


async def test_status_reports_made_together_are_written_together(tmp_path: Path) -> None:
    ks = _CountingKeyspace(tmp_path / "ks.json")
    t = await _local(tmp_path, ks)
    ids = [f"shard-{i:03d}" for i in range(250)]
    for i in range(0, len(ids), 50):  # 250 shards assigned here, 50 per transaction.
        ops: list[Put | Delete] = []
        for sid in ids[i : i + 50]:
            ops.append(Put(t.layout.item_key(sid), shard_spec(sid).SerializeToString()))
            ops.append(Put(t.asn_key(sid, "local", 0), b""))
        await t.put(*ops)
    assert len(t.replicas.made) == 250
    for replica in t.replicas.made:
        await replica.reported()  # Each reported PRIMARY (auto_status).
    for sid in ids:
        kv = ks.get(t.asn_key(sid, "local", 0))
        assert kv is not None and RS.FromString(kv.value).code == RS.PRIMARY
    # Alone, that is 250 transactions.
    assert 3 <= len(ks.assignment_txns) <= 10, ks.assignment_txns
    assert sum(ks.assignment_txns) == 250 and max(ks.assignment_txns) <= STATUS_BATCH
    assert t.resolver.status_txns == len(ks.assignment_txns)
    await t.resolver.stop()


async def test_a_status_batch_that_lost_a_race_is_written_report_by_report(
    tmp_path: Path,
) -> None:
    ks = _RacingKeyspace(tmp_path / "ks.json")
    t = await _local(tmp_path, ks)
    t.replicas.auto_status = False
    ids = ["shard-000", "shard-001", "shard-002"]
    ops: list[Put | Delete] = []
    for sid in ids:
        ops.append(Put(t.layout.item_key(sid), shard_spec(sid).SerializeToString()))
        ops.append(Put(t.asn_key(sid, "local", 0), b""))
    await t.put(*ops)
    raced = t.asn_key("shard-001", "local", 0)
    ks.race_key = raced
    ks.race_value = RS(code=RS.FAILED, errors=["concurrent"]).SerializeToString()
    await asyncio.gather(*(r.report(RS(code=RS.PRIMARY)) for r in t.replicas.made))
    for sid in ids:
        kv = ks.get(t.asn_key(sid, "local", 0))
        assert kv is not None
        want = RS(code=RS.FAILED, errors=["concurrent"]) if kv.key == raced else RS(code=RS.PRIMARY)
        assert RS.FromString(kv.value) == want
    assert t.resolver.status_txns == 0  # The batch failed; each went alone.
    await t.resolver.stop()


class _GatedKeyspace(EmbeddedKeyspace):
    """In memory; holds status transactions while `gate` is closed, so that the writers
    holding them all go on (and finish) in one turn of the event loop."""

    def __init__(self) -> None:
        super().__init__(None)
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = 0
        self.all_held = asyncio.Event()
        self.hold = 0

    async def txn(self, compares: list[Compare], ops: list[Put | Delete]) -> TxnResult:  # type: ignore[override]
        if not self.gate.is_set() and compares and all("/assign/" in op.key for op in ops):
            self.held += 1
            if self.held == self.hold:
                self.all_held.set()
            await self.gate.wait()
        return await super().txn(compares, ops)


async def test_a_report_made_as_every_status_writer_finishes_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every writer busy with a report of its own; they all finish in one turn of the loop,
    # and a replica woken by the first one reports again before the finished writers are
    # dropped from the count of writers. That report must still get a writer: it used to
    # wait, unwritten, until some other report came along (for ever, in a quiet process).
    monkeypatch.setattr(resolver_module, "STATUS_BATCH", 1)  # One report per writer.
    ks = _GatedKeyspace()
    t = await _local(tmp_path, ks)
    t.replicas.auto_status = False
    ids = [f"shard-{i:03d}" for i in range(STATUS_WRITERS)]
    ops: list[Put | Delete] = []
    for sid in ids:
        ops.append(Put(t.layout.item_key(sid), shard_spec(sid).SerializeToString()))
        ops.append(Put(t.asn_key(sid, "local", 0), b""))
    await t.put(*ops)
    first, *others = t.replicas.made

    async def report_twice() -> None:
        await first.report(RS(code=RS.STANDBY))
        await first.report(RS(code=RS.PRIMARY))  # As soon as the first is written.

    ks.gate.clear()
    ks.hold = STATUS_WRITERS
    twice = asyncio.ensure_future(report_twice())
    rest = [asyncio.ensure_future(r.report(RS(code=RS.STANDBY))) for r in others]
    async with asyncio.timeout(WITHIN):
        await ks.all_held.wait()  # Each writer holds one report.
    ks.gate.set()
    try:
        async with asyncio.timeout(5.0):
            await twice
    finally:
        twice.cancel()
    await asyncio.gather(*rest)
    kv = ks.get(t.asn_key(first.spec.id, "local", 0))
    assert kv is not None and RS.FromString(kv.value).code == RS.PRIMARY
    await t.resolver.stop()


async def test_resolve(tmp_path: Path) -> None:
    t = await _local(tmp_path)
    t.replicas.auto_status = False  # No status writes behind the test's back.
    r = t.resolver
    await t.put(
        Put(t.layout.item_key("local-shard"), shard_spec("local-shard").SerializeToString()),
        Put(t.layout.item_key("peer-shard"), shard_spec("peer-shard").SerializeToString()),
        Put(t.layout.item_key("idle-shard"), shard_spec("idle-shard").SerializeToString()),
        Put(t.asn_key("local-shard", "local", 0), b""),
        Put(t.asn_key("local-shard", "peer", 1, "zone-b"), b""),
        Put(t.asn_key("peer-shard", "peer", 0, "zone-b"), b""),
        Put(t.asn_key("idle-shard", "local", 1), b""),
    )
    me = pb.ProcessSpec.ID(zone="zone-a", suffix="local")
    peer = pb.ProcessSpec.ID(zone="zone-b", suffix="peer")

    res = await r.resolve("missing-shard")
    assert res.status == cpb.SHARD_NOT_FOUND and res.header.process_id == me
    assert res.header.etcd.revision == t.ks.revision and res.header.etcd.cluster_id
    assert res.route.primary == -1 and not res.route.members

    res = await r.resolve("local-shard")
    assert res.status == cpb.OK and res.local
    assert res.replica is t.replicas.live("local-shard")
    assert res.header.process_id == me
    assert list(res.route.members) == [me, peer] and res.route.primary == 0
    assert list(res.route.endpoints) == ["http://local:1", "http://peer:2"]
    assert res.spec is not None and res.spec.id == "local-shard"

    res = await r.resolve("peer-shard")
    assert res.status == cpb.OK and not res.local and res.replica is None
    assert res.header.process_id == peer and res.route.primary == 0

    res = await r.resolve("peer-shard", proxy=False)
    assert res.status == cpb.NOT_SHARD_PRIMARY and res.header.process_id == me

    res = await r.resolve("idle-shard")
    assert res.status == cpb.NO_SHARD_PRIMARY and res.header.process_id == me
    res = await r.resolve("idle-shard", require_primary=False)
    assert res.status == cpb.OK and res.replica is None and list(res.route.members) == [me]

    # A proxied request names the cluster and this process, and its revision is awaited.
    hdr = pb.Header(process_id=me, etcd=pb.Header.Etcd(cluster_id=t.ks.identity.cluster_id))
    hdr.etcd.revision = t.ks.revision + 1
    pending = asyncio.ensure_future(r.resolve("peer-shard", proxy=False, proxy_header=hdr))
    await asyncio.sleep(0)
    assert not pending.done()
    await t.put(Put(t.asn_key("peer-shard", "local", 1), b""))
    res = await pending
    assert res.status == cpb.NOT_SHARD_PRIMARY and res.header.etcd.revision == hdr.etcd.revision
    with pytest.raises(ResolveError, match="process ID doesn't match"):
        await r.resolve("local-shard", proxy_header=pb.Header(process_id=peer))
    wrong = pb.Header(etcd=pb.Header.Etcd(cluster_id=t.ks.identity.cluster_id + 1))
    with pytest.raises(ResolveError, match="cluster ID doesn't match"):
        await r.resolve("local-shard", proxy_header=wrong)

    # Undecodable statuses are left out of routes, as Gazette never sees them.
    await t.put(Put(t.asn_key("local-shard", "peer", 1, "zone-b"), b"\xff"))
    res = await r.resolve("local-shard")
    assert list(res.route.members) == [me]

    assert [s.id for s in r.shards_with_source("a/journal")] == []
    await t.put(
        Put(
            t.layout.item_key("idle-shard"),
            shard_spec("idle-shard", sources=("a/journal",)).SerializeToString(),
        )
    )
    assert [s.id for s in r.shards_with_source("a/journal")] == ["idle-shard"]

    # Shutting down: a local primary no longer resolves.
    r.stop_serving()
    with pytest.raises(ResolveError, match="shutting down"):
        await r.resolve("local-shard")
    assert (await r.resolve("peer-shard")).status == cpb.OK  # Still proxyable.
    await r.stop()


# Several processes on a real etcd, with allocation.
@dataclass
class Member:
    ks: EtcdKeyspace
    session: MemberSession
    observed: ObservedState
    resolver: ShardResolver
    replicas: Replicas
    task: asyncio.Task[None]

    async def close(self, *, revoke: bool) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, MemberKeyMissing):
            await self.task
        await self.resolver.stop()
        await self.session.close(revoke=revoke)
        await self.ks.close()


async def _member(etcd: EtcdProcess, root: str, suffix: str) -> Member:
    layout = KeyLayout(root)
    ks = EtcdKeyspace(etcd.url, root)
    await ks.open()
    key = layout.member_key("zone", suffix)
    spec = consumer_spec("zone", suffix, f"http://{suffix}:8080")
    session = MemberSession(ks, key, spec.SerializeToString(), lease_ttl=2)
    await session.start()
    observed = ObservedState(ks, layout, ShardDecoder(layout), key)
    replicas = Replicas()
    resolver = ShardResolver(ks, layout, observed, key, replicas, process_spec=spec.process_spec)
    resolver.start()
    task = asyncio.create_task(Allocator(ks, observed).run())
    return Member(ks, session, observed, resolver, replicas, task)


@pytest.fixture
def consumer_root(etcd_root: str) -> str:
    return etcd_root.replace("/gazette/cluster", "/gazette/consumers/app")


async def test_hot_standby_takes_over_on_etcd(etcd: EtcdProcess, consumer_root: str) -> None:
    layout = KeyLayout(consumer_root)
    m1 = await _member(etcd, consumer_root, "consumer-1")
    m2 = await _member(etcd, consumer_root, "consumer-2")
    members = [m1, m2]
    try:
        spec = shard_spec("shard-000", hot_standbys=1)
        await m1.ks.txn([], [Put(layout.item_key("shard-000"), spec.SerializeToString())])

        def statuses(m: Member = m1) -> dict[str, int]:
            return {
                a.suffix: (RS.FromString(a.kv.value).code if a.kv.value else RS.IDLE)
                for a in m.observed.current.assignments_of("shard-000")
            }

        await until(
            m1.ks,
            lambda: sorted(statuses().values()) == [RS.STANDBY, RS.PRIMARY],
            "a primary and a standby reported",
        )
        primary = next(m for m in members if m.replicas.live("shard-000").slot == 0)  # type: ignore[union-attr]
        standby = m2 if primary is m1 else m1
        replica = standby.replicas.live("shard-000")
        assert replica is not None and replica.slots[-1] == 1
        # Reported statuses keep the assignment under its member's lease.
        for a in m1.observed.current.assignments_of("shard-000"):
            owner = m1 if a.suffix == "consumer-1" else m2
            assert a.kv.lease == owner.session.lease

        # The primary dies without a word: once its lease expires, the standby's replica
        # (the same one) is promoted.
        members.remove(primary)
        await primary.close(revoke=False)
        await until(
            standby.ks,
            lambda: (
                replica.slot == 0
                and statuses(standby).get(standby.resolver.local_id.suffix) == RS.PRIMARY
            ),
            "the standby took over",
        )
        assert standby.replicas.live("shard-000") is replica
        res = await standby.resolver.resolve("shard-000", proxy=False)
        assert res.status == cpb.OK and res.replica is replica
    finally:
        for m in members:
            await m.close(revoke=True)
