"""The `consumer.Shard` service on real grpc.aio servers over a real etcd, through
`ShardClient` and raw stubs: List, Apply, GetHints, Unassign, and Stat (served by the primary
and proxied to it). Replicas are `FakeReplica` doubles whose progress the test drives."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.allocator.allocator import Allocator, MemberKeyMissing, ObservedState
from pygazette.allocator.session import MemberSession
from pygazette.consumer.hints import encode_hints, store_recovered_hints
from pygazette.consumer.key_space import ShardDecoder
from pygazette.consumer.resolver import ShardResolver
from pygazette.consumer.shard_client import (
    NoShardPrimary,
    ShardClient,
    ShardEtcdTransactionFailed,
    ShardNotFound,
    ShardStopped,
)
from pygazette.consumer.shard_service import ShardService
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import Delete, Put
from pygazette.keyspace.layout import AssignmentKey, KeyLayout
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.response_checks import ResponseCheckInterceptor, response_checks_enabled
from tests.consumer.test_resolver import (
    FakeReplica,
    Replicas,
    consumer_spec,
    shard_spec,
    until,
)
from tests.support.etcd_process import EtcdProcess
from tests.support.ports import free_port

RS = cpb.ReplicaStatus
ZONE = "zone-a"


@dataclass
class Proc:
    """One consumer process: keyspace mirror, membership, allocator, resolver, Shard server."""

    suffix: str
    layout: KeyLayout
    ks: EtcdKeyspace
    session: MemberSession
    observed: ObservedState
    resolver: ShardResolver
    service: ShardService
    server: grpc.aio.Server
    endpoint: str
    replicas: Replicas
    task: asyncio.Task[None] | None

    @property
    def id(self) -> pb.ProcessSpec.ID:
        return pb.ProcessSpec.ID(zone=ZONE, suffix=self.suffix)

    def replica(self, shard_id: str) -> FakeReplica | None:
        return self.replicas.live(shard_id)

    def assignments(self, shard_id: str) -> list[tuple[str, int, int]]:
        """(suffix, slot, status code) of the shard's assignments, as this process sees them."""
        return [
            (a.suffix, a.slot, RS.FromString(a.kv.value).code)
            for a in self.observed.current.assignments_of(shard_id)
        ]

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, MemberKeyMissing):
                await self.task
        await self.resolver.stop()
        await self.server.stop(None)
        await self.service.close()
        await self.session.close(revoke=True)
        await self.ks.close()


async def start_proc(
    etcd: EtcdProcess, root: str, suffix: str, *, allocate: bool = True, auto_status: bool = True
) -> Proc:
    layout = KeyLayout(root)
    ks = EtcdKeyspace(etcd.url, root)
    await ks.open()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    spec = consumer_spec(ZONE, suffix, endpoint)
    key = layout.member_key(ZONE, suffix)
    observed = ObservedState(ks, layout, ShardDecoder(layout), key)
    replicas = Replicas(auto_status=auto_status)
    resolver = ShardResolver(ks, layout, observed, key, replicas, process_spec=spec.process_spec)
    service = ShardService(resolver, ks, layout)
    # As the consumer's runner does: under PYGAZETTE_CHECK_RESPONSES (the test suite's
    # default), every response is checked with Gazette's rules before it is sent.
    checks = [ResponseCheckInterceptor()] if response_checks_enabled() else []
    server = grpc.aio.server(interceptors=checks)
    cpb_grpc.add_ShardServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    session = MemberSession(ks, key, spec.SerializeToString(), lease_ttl=5)
    await session.start()
    resolver.start()
    task = asyncio.create_task(Allocator(ks, observed).run()) if allocate else None
    return Proc(
        suffix, layout, ks, session, observed, resolver, service, server, endpoint, replicas, task
    )


@pytest.fixture
def root(etcd_root: str) -> str:
    return etcd_root.replace("/gazette/cluster", "/gazette/consumers/app")


@pytest.fixture
async def proc(etcd: EtcdProcess, root: str) -> AsyncIterator[Proc]:
    p = await start_proc(etcd, root, "consumer-1")
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def client(proc: Proc) -> AsyncIterator[ShardClient]:
    async with ShardClient(proc.endpoint) as c:
        yield c


def upsert(spec: cpb.ShardSpec, rev: int = 0, **kwargs: object) -> cpb.ApplyRequest.Change:
    return cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=rev, **kwargs)  # type: ignore[arg-type]


def delete(shard_id: str, rev: int) -> cpb.ApplyRequest.Change:
    return cpb.ApplyRequest.Change(delete=shard_id, expect_mod_revision=rev)


async def serving(p: Proc, *shard_ids: str) -> None:
    """Wait until each shard has a primary here that reported PRIMARY."""

    def ready() -> bool:
        return all(
            (p.suffix, 0, RS.PRIMARY) in p.assignments(s) and p.replica(s) is not None
            for s in shard_ids
        )

    await until(p.ks, ready, f"{shard_ids} are served by {p.suffix}")


# List and Apply.
async def test_apply_and_list(proc: Proc, client: ShardClient) -> None:
    specs = [
        shard_spec("shard-a-0", labels={"app": "a", "tier": "gold"}, sources=("in/journal-a",)),
        shard_spec("shard-a-1", labels={"app": "a"}),
        shard_spec("shard-b-0", labels={"app": "b"}),
    ]
    resp = await client.apply([upsert(s) for s in specs])
    assert resp.header.process_id == proc.id
    revision = resp.header.etcd.revision
    assert proc.ks.revision >= revision  # It answered once its mirror read its own write.

    listed = await client.list_shards()
    assert [s.spec.id for s in listed] == ["shard-a-0", "shard-a-1", "shard-b-0"]
    for s, spec in zip(listed, specs, strict=True):
        assert s.mod_revision == s.create_revision == revision
        assert s.spec.sources == spec.sources and s.spec.labels == spec.labels
        # As Gazette stores and lists it: non-nullable sub-messages present.
        assert s.spec.HasField("labels") and s.spec.HasField("min_txn_duration")

    async def ids(selector: str) -> list[str]:
        return [s.spec.id for s in await client.list_shards(selector)]

    assert await ids("app=a") == ["shard-a-0", "shard-a-1"]
    assert await ids("app=a, tier=gold") == ["shard-a-0"]
    assert await ids("app!=a") == ["shard-b-0"]
    assert await ids("!tier") == ["shard-a-1", "shard-b-0"]
    # The synthetic "id" label.
    assert await ids("id=shard-a-1") == ["shard-a-1"]
    assert await ids("id in (shard-a-0, shard-b-0)") == ["shard-a-0", "shard-b-0"]
    assert await ids("id:prefix=shard-a") == ["shard-a-0", "shard-a-1"]
    assert await ids("app=a, id notin (shard-a-0)") == ["shard-a-1"]
    assert await ids("app=c") == []

    # Allocation: each shard gets a primary here, whose status and route are listed.
    await serving(proc, "shard-a-0", "shard-a-1", "shard-b-0")
    listed = await client.list_shards("id=shard-a-0")
    [s] = listed
    assert list(s.route.members) == [proc.id] and s.route.primary == 0
    assert list(s.route.endpoints) == [proc.endpoint]
    assert [st.code for st in s.status] == [RS.PRIMARY]
    list_resp = await client.list_all()
    assert list_resp.header.process_id == proc.id and list_resp.header.route.primary == -1

    # Updates and deletes are guarded by mod revisions.
    changed = shard_spec("shard-a-1", labels={"app": "a", "tier": "silver"})
    with pytest.raises(ShardEtcdTransactionFailed) as failed:
        await client.apply([upsert(changed, revision - 1)])
    assert failed.value.header is not None and failed.value.header.etcd.revision >= revision
    with pytest.raises(ShardEtcdTransactionFailed):
        await client.apply([upsert(changed, 0)])  # 0: must not exist yet.
    resp = await client.apply([upsert(changed, revision)])
    assert await ids("tier=silver") == ["shard-a-1"]
    # -1 skips the check; one failing guard fails the whole transaction.
    with pytest.raises(ShardEtcdTransactionFailed):
        await client.apply([upsert(specs[2], -1), delete("shard-a-0", revision + 1000)])
    await client.apply([delete("shard-a-0", revision), delete("shard-b-0", -1)])
    assert await ids("") == ["shard-a-1"]


async def test_apply_and_list_reject_bad_requests(proc: Proc) -> None:
    channel = grpc.aio.insecure_channel(proc.endpoint.removeprefix("http://"))
    stub = cpb_grpc.ShardStub(channel)  # type: ignore[no-untyped-call]
    try:
        cases: list[tuple[Callable[[], object], str]] = [
            (
                lambda: stub.Apply(cpb.ApplyRequest(changes=[upsert(shard_spec("x"))])),
                "Changes[0].Upsert.Id: invalid length (1; expected 4 <= length <= 512)",
            ),
            (
                lambda: stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change()])),
                "Changes[0]: neither Upsert nor Delete are set",
            ),
            (
                lambda: stub.Apply(cpb.ApplyRequest(changes=[delete("shard-000", 0)])),
                "Changes[0]: invalid ExpectModRevision (0; expected > 0 or -1)",
            ),
            (
                lambda: stub.Apply(
                    cpb.ApplyRequest(changes=[upsert(shard_spec("shard-000", labels={"id": "x"}))])
                ),
                'Labels cannot include label "id"',
            ),
            (
                # One etcd transaction holds one operation per key: Gazette's Apply fails
                # whole. It was refused as UNAVAILABLE ("executing etcd transaction: ...
                # duplicate key given in txn request"), a failure to retry.
                lambda: stub.Apply(
                    cpb.ApplyRequest(
                        changes=[upsert(shard_spec("shard-000")), delete("shard-000", -1)]
                    )
                ),
                "Changes[1]: shard shard-000 is in more than one change of the request",
            ),
            (
                lambda: stub.List(
                    cpb.ListRequest(
                        selector=pb.LabelSelector(
                            include=pb.LabelSet(labels=[pb.Label(name="x", value="y")])
                        )
                    )
                ),
                "Selector.Include.Labels[0].Name: invalid length",
            ),
            (
                lambda: stub.Stat(cpb.StatRequest(shard="shard-000", read_through={"bad": 1})),
                "ReadThrough.Offsets[bad]",
            ),
            (lambda: stub.GetHints(cpb.GetHintsRequest(shard="")), "Shard: invalid length"),
            (
                lambda: stub.Unassign(cpb.UnassignRequest(shards=["ok-shard", "no spaces"])),
                "Shards[1]: not a valid token (no spaces)",
            ),
        ]
        for call, message in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call()  # type: ignore[misc]
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in (err.value.details() or ""), err.value.details()

        # Hints of another log than the shard's recovery log.
        spec = shard_spec("shard-000", recovery_log_prefix="recovery/logs", hint_prefix="/hints")
        change = upsert(spec, primary_hints=rpb.FSMHints(log="recovery/other/shard-000"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Apply(cpb.ApplyRequest(changes=[change]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "PrimaryHints.Log" in (err.value.details() or "")
    finally:
        await channel.close(None)


async def test_a_change_that_changes_nothing_is_answered_at_once(
    etcd: EtcdProcess, root: str
) -> None:
    # Deleting a shard that doesn't exist (expect_mod_revision -1) changes no key: etcd
    # answers at its current revision, which writes outside the consumer's root (a primary's
    # recorded hints, every few seconds; another application) have taken past the last
    # change the mirror saw. The answer waited for the mirror to reach that revision, which
    # no change under the root would bring: 30 s (a client's deadline first). Gazette's
    # consumer waits the same way (KeySpace.WaitForRevision, until the caller's deadline) but
    # writes its hints every 5 minutes, not every few seconds.
    p = await start_proc(etcd, root, "consumer-1", allocate=False)
    try:
        async with ShardClient(p.endpoint) as client:
            await client.apply([upsert(shard_spec("shard-0"))])
            elsewhere = await p.ks.txn([], [Put(f"/hints{root}/shard-0.primary", b"{}")])
            assert p.ks.revision < elsewhere.revision
            resp = await client.apply([delete("shard-9", -1)], within=5)
            assert resp.status == cpb.OK
            assert resp.header.etcd.revision >= elsewhere.revision
            # A change under the root is still answered once the mirror reflects it.
            resp = await client.apply([upsert(shard_spec("shard-1"))], within=5)
            assert p.ks.get(p.layout.item_key("shard-1")) is not None
            assert p.ks.revision >= resp.header.etcd.revision
    finally:
        await p.close()


# GetHints.
def _hints(log: str, author: int) -> rpb.FSMHints:
    hints = rpb.FSMHints(log=log)
    node = hints.live_nodes.add(fnode=1)
    node.segments.add(author=author, first_seq_no=1, last_seq_no=3, first_offset=0, last_offset=99)
    hints.properties.add(path="/IDENTITY", content="x")
    return hints


async def test_get_hints(proc: Proc, client: ShardClient, root: str) -> None:
    hint_prefix = root.replace("/consumers/app", "/hints")
    log = "recovery/logs/shard-000"
    spec = shard_spec(
        "shard-000",
        recovery_log_prefix="recovery/logs",
        hint_prefix=hint_prefix,
        hint_backups=3,
    )
    await client.apply([upsert(spec)])
    with pytest.raises(ShardNotFound):
        await client.get_hints("shard-999")

    # Nothing stored yet: empty primary hints and one empty entry per backup key.
    resp = await client.get_hints("shard-000")
    assert resp.HasField("primary_hints") and not resp.primary_hints.HasField("hints")
    assert len(resp.backup_hints) == 3
    assert not any(h.HasField("hints") for h in resp.backup_hints)
    assert resp.header.process_id == proc.id

    # Keys as Gazette lays them out: <hint_prefix>/<id>.primary and .backup.<n>; values are
    # JSON as Go's encoding/json writes FSMHints, or binary protobuf.
    primary, backup1 = _hints(log, 111), _hints(log, 222)
    go_json = json.dumps(
        {
            "log": log,
            "live_nodes": [
                {
                    "fnode": 1,
                    "segments": [
                        {"author": 111, "first_seq_no": 1, "last_seq_no": 3, "last_offset": 99}
                    ],
                }
            ],
            "properties": [{"path": "/IDENTITY", "content": "x"}],
        }
    ).encode()
    await proc.ks.txn(
        [],
        [
            Put(f"{hint_prefix}/shard-000.primary", go_json),
            Put(f"{hint_prefix}/shard-000.backup.1", backup1.SerializeToString()),
        ],
    )
    resp = await client.get_hints("shard-000")
    assert resp.primary_hints.hints == primary
    assert [h.hints if h.HasField("hints") else None for h in resp.backup_hints] == [
        None,
        backup1,
        None,
    ]

    # Apply installs primary hints with an upsert (as JSON Gazette reads).
    installed = _hints(log, 333)
    listed = (await client.list_shards("id=shard-000"))[0]
    await client.apply([upsert(spec, listed.mod_revision, primary_hints=installed)])
    stored = await proc.ks.get_remote(f"{hint_prefix}/shard-000.primary")
    assert stored is not None and stored.value == encode_hints(installed)
    assert json.loads(stored.value)["live_nodes"][0]["segments"][0]["author"] == 333
    assert (await client.get_hints("shard-000")).primary_hints.hints == installed

    # Stored hints of another log are an error, not silently served.
    await proc.ks.txn(
        [], [Put(f"{hint_prefix}/shard-000.backup.0", encode_hints(_hints("other/log", 1)))]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.get_hints("shard-000")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "hints.Log other/log != ShardSpec.RecoveryLog" in (err.value.details() or "")
    await proc.ks.txn([], [Delete(f"{hint_prefix}/shard-000.backup.0")])


async def test_get_hints_reads_every_key_at_one_revision(
    etcd: EtcdProcess, proc: Proc, client: ShardClient, root: str
) -> None:
    """GetHints reads the primary and backup keys in one etcd transaction, as Gazette's
    fetchHints does: a rotation of recovered hints (backup.0 -> backup.1 -> backup.2, one
    transaction) committed between separate reads of the keys answered a mix no revision
    held (one set twice, the newest missing), and `shards prune`, which keeps only the
    fragments some hints of the response need, could remove those of the missing one."""
    hint_prefix = root.replace("/consumers/app", "/hints")
    log = "recovery/logs/shard-000"
    spec = shard_spec(
        "shard-000", recovery_log_prefix="recovery/logs", hint_prefix=hint_prefix, hint_backups=3
    )
    await client.apply([upsert(spec)])
    rotator = EtcdKeyspace(etcd.url, root)
    await rotator.open()
    stop = asyncio.Event()

    async def rotate() -> None:
        author = 0
        while not stop.is_set():
            author += 1
            assert await store_recovered_hints(rotator, spec, _hints(log, author))

    rotating = asyncio.create_task(rotate())
    try:
        torn = []
        for _ in range(100):
            resp = await client.get_hints("shard-000")
            authors = [
                h.hints.live_nodes[0].segments[0].author
                for h in resp.backup_hints
                if h.HasField("hints")
            ]
            # Each revision holds backups of consecutive rotations, newest first.
            if authors and authors != list(range(authors[0], authors[0] - len(authors), -1)):
                torn.append(authors)
        assert not torn, f"backup hints of no one revision: {torn[:5]}"
    finally:
        stop.set()
        await rotating
        await rotator.close()


# Unassign.
async def test_unassign(etcd: EtcdProcess, root: str) -> None:
    # No allocator: the test writes assignments itself, so nothing moves behind its back.
    p = await start_proc(etcd, root, "consumer-1", allocate=False, auto_status=False)
    layout = p.layout
    try:
        async with ShardClient(p.endpoint) as client:
            await client.apply([upsert(shard_spec(f"shard-{i}", hot_standbys=1)) for i in range(3)])

            def key(shard: str, suffix: str, slot: int) -> str:
                return layout.assignment_key(AssignmentKey(shard, ZONE, suffix, slot))

            def value(code: int, *errors: str) -> bytes:
                return RS(code=code, errors=list(errors)).SerializeToString()  # type: ignore[arg-type]

            result = await p.ks.txn(
                [],
                [
                    Put(key("shard-0", "consumer-1", 0), value(RS.PRIMARY)),
                    Put(key("shard-0", "consumer-2", 1), value(RS.STANDBY)),
                    Put(key("shard-1", "consumer-1", 0), value(RS.PRIMARY)),
                    Put(key("shard-1", "consumer-2", 1), value(RS.FAILED, "boom")),
                    Put(key("shard-2", "consumer-2", 1), value(RS.STANDBY)),
                ],
            )
            await p.ks.wait_for_revision(result.revision)

            # Only failed assignments: shard-1's standby.
            assert await client.unassign(
                ["shard-0", "shard-1"], only_failed=True, dry_run=True
            ) == ["shard-1"]
            assert p.ks.get(key("shard-1", "consumer-2", 1)) is not None  # Dry run.
            assert await client.unassign(["shard-0", "shard-1"], only_failed=True) == ["shard-1"]
            assert p.ks.get(key("shard-1", "consumer-2", 1)) is None
            assert p.ks.get(key("shard-1", "consumer-1", 0)) is not None

            # Primaries (and failed ones): shard-2 has no primary, so nothing of it goes.
            assert await client.unassign(["shard-0", "shard-2", "shard-9"], dry_run=True) == [
                "shard-0"
            ]
            assert await client.unassign(["shard-0", "shard-2"]) == ["shard-0"]
            assert p.ks.get(key("shard-0", "consumer-1", 0)) is None
            assert p.ks.get(key("shard-0", "consumer-2", 1)) is not None
            assert p.ks.get(key("shard-2", "consumer-2", 1)) is not None
            assert await client.unassign([]) == []
    finally:
        await p.close()


# Stat.
async def test_stat_waits_for_read_through(proc: Proc, client: ShardClient) -> None:
    spec = shard_spec("shard-000", sources=("in/journal-a", "in/journal-b"))
    await client.apply([upsert(spec)])
    await serving(proc, "shard-000")
    replica = proc.replica("shard-000")
    assert replica is not None

    # Nothing asked: the current progress, at once.
    resp = await client.stat("shard-000")
    assert dict(resp.read_through) == {} and resp.header.process_id == proc.id
    assert resp.header.route.primary == 0 and list(resp.header.route.members) == [proc.id]
    assert resp.header.etcd.revision > 0

    # Offsets of journals the shard doesn't read are ignored.
    resp = await client.stat("shard-000", {"other/journal": 500})
    assert dict(resp.read_through) == {}

    pending = asyncio.ensure_future(client.stat("shard-000", {"in/journal-a": 100}))
    await replica.until_waiting()
    await replica.advance({"in/journal-a": 50, "in/journal-b": 7}, {"out/journal": 10})
    await replica.advance({"in/journal-b": 9}, {})
    assert not pending.done()
    await replica.advance({"in/journal-a": 120}, {"out/journal": 300})
    resp = await pending
    assert dict(resp.read_through) == {"in/journal-a": 120, "in/journal-b": 9}
    assert dict(resp.publish_at) == {"out/journal": 300}
    assert resp.status == cpb.OK and resp.header.process_id == proc.id

    # A deadline ends the wait.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.stat("shard-000", {"in/journal-a": 10_000}, within=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    with pytest.raises(ShardNotFound):
        await client.stat("shard-999")


async def test_stat_without_a_deadline_waits_as_long_as_it_takes(
    proc: Proc, client: ShardClient
) -> None:
    # As Gazette's: a Stat waits until the shard reads through its offsets, the client's
    # deadline passes (or it cancels), or the shard stops. Without a deadline the server
    # gave up after 300 s with DEADLINE_EXCEEDED, which the client never asked for: a
    # read-your-writes Stat of a shard backfilling a long journal failed.
    await client.apply([upsert(shard_spec("shard-000", sources=("in/journal-a",)))])
    await serving(proc, "shard-000")
    replica = proc.replica("shard-000")
    assert replica is not None

    pending = asyncio.ensure_future(client.stat("shard-000", {"in/journal-a": 100}))
    await replica.until_waiting()
    assert replica.withins == [None]  # No limit of the server's own.
    await replica.advance({"in/journal-a": 100}, {})
    assert dict((await pending).read_through) == {"in/journal-a": 100}

    # With a deadline, the client's: the wait ends with it.
    await client.stat("shard-000", {"in/journal-a": 100}, within=30)
    (within,) = replica.withins[1:]
    assert within is not None and 0 < within <= 31

    # A client that gives up ends the server's wait too (nothing is left waiting).
    pending = asyncio.ensure_future(client.stat("shard-000", {"in/journal-a": 200}))
    await replica.until_waiting()
    pending.cancel()
    async with asyncio.timeout(10), replica._changed:
        await replica._changed.wait_for(lambda: replica.waiters == 0)


async def test_stat_of_an_unassigned_shard(etcd: EtcdProcess, root: str) -> None:
    p = await start_proc(etcd, root, "consumer-1", allocate=False, auto_status=False)
    try:
        async with ShardClient(p.endpoint) as client:
            await client.apply([upsert(shard_spec("shard-000", sources=("in/journal-a",)))])
            with pytest.raises(NoShardPrimary) as err:
                await client.stat("shard-000")
            assert err.value.header is not None and err.value.header.process_id == p.id

            # Assigned here, and unassigned while a Stat waits: SHARD_STOPPED.
            key = p.layout.assignment_key(AssignmentKey("shard-000", ZONE, "consumer-1", 0))
            result = await p.ks.txn([], [Put(key, RS(code=RS.PRIMARY).SerializeToString())])
            await p.ks.wait_for_revision(result.revision)
            replica = p.replica("shard-000")
            assert replica is not None
            pending = asyncio.ensure_future(client.stat("shard-000", {"in/journal-a": 1}))
            await replica.until_waiting()
            assert await client.unassign(["shard-000"]) == ["shard-000"]
            with pytest.raises(ShardStopped):
                await pending
    finally:
        await p.close()


async def test_stat_is_proxied_to_the_primary(etcd: EtcdProcess, root: str) -> None:
    p1 = await start_proc(etcd, root, "consumer-1")
    p2 = await start_proc(etcd, root, "consumer-2")
    procs = {p.suffix: p for p in (p1, p2)}
    try:
        async with ShardClient(p1.endpoint) as c1, ShardClient(p2.endpoint) as c2:
            await c1.apply([upsert(shard_spec("shard-000", sources=("in/journal-a",)))])

            def primary() -> Proc | None:
                for suffix, slot, code in p1.assignments("shard-000"):
                    if slot == 0 and code == RS.PRIMARY:
                        return procs[suffix]
                return None

            await until(p1.ks, lambda: primary() is not None, "shard-000 has a primary")
            owner = primary()
            assert owner is not None
            await serving(owner, "shard-000")
            other = p2 if owner is p1 else p1
            replica = owner.replica("shard-000")
            assert replica is not None and other.replica("shard-000") is None
            await replica.advance({"in/journal-a": 42}, {"out/journal": 7})

            # Asked of the other process, which proxies to the primary (the client doesn't
            # know the route yet).
            client = c2 if other is p2 else c1
            client.route_stat = False
            pending = asyncio.ensure_future(client.stat("shard-000", {"in/journal-a": 50}))
            await replica.until_waiting()
            await replica.advance({"in/journal-a": 60}, {})
            resp = await pending
            assert dict(resp.read_through) == {"in/journal-a": 60}
            assert dict(resp.publish_at) == {"out/journal": 7}
            assert resp.header.process_id == owner.id  # Answered by the primary.
            assert list(resp.header.route.endpoints) == [owner.endpoint]

            # A request already proxied is not proxied again.
            hdr = pb.Header()
            hdr.CopyFrom(resp.header)
            hdr.process_id.CopyFrom(other.id)
            async with grpc.aio.insecure_channel(other.endpoint.removeprefix("http://")) as ch:
                raw = cpb_grpc.ShardStub(ch)  # type: ignore[no-untyped-call]
                resp = await raw.Stat(cpb.StatRequest(shard="shard-000", header=hdr))
            assert resp.status == cpb.NOT_SHARD_PRIMARY and resp.header.process_id == other.id

            # With routing, the client goes to the primary directly after learning the route.
            client.route_stat = True
            await client.list_shards()
            resp = await client.stat("shard-000")
            assert resp.header.process_id == owner.id
            assert client.peers._stubs.keys() == {owner.endpoint}
    finally:
        await p2.close()
        await p1.close()


async def test_apply_holds_as_many_changes_as_etcd_allows(
    etcd: EtcdProcess, root: str, tmp_path: Path
) -> None:
    # As Gazette's, the consumer applies a request in one etcd transaction and leaves its size
    # to etcd: refused by a default etcd (--max-txn-ops 128) as INVALID_ARGUMENT saying to
    # batch, and applied whole by one configured for more. The consumer refused more than 128
    # changes itself, whatever its etcd allowed.
    changes = [upsert(shard_spec(f"many-{i:03d}", disable=True)) for i in range(200)]
    p = await start_proc(etcd, root, "consumer-1", allocate=False)
    try:
        async with ShardClient(p.endpoint) as c:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.apply(changes)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "too many operations" in (err.value.details() or "")
        assert "batches" in (err.value.details() or "")
    finally:
        await p.close()

    roomy = EtcdProcess(tmp_path / "roomy-etcd", extra_args=["--max-txn-ops=512"])
    roomy.start()
    try:
        p = await start_proc(roomy, root, "consumer-1", allocate=False)
        try:
            async with ShardClient(p.endpoint) as c:
                await c.apply(changes)
                listed = await c.list_all(pb.LabelSelector())
            assert [s.spec.id for s in listed.shards] == [f"many-{i:03d}" for i in range(200)]
        finally:
            await p.close()
    finally:
        roomy.stop()
