"""Consumer processes on etcd, for real: shards with recovery logs and hot standbys, kill -9
of a primary, a primary frozen past its lease and resumed, failed shards.

Every test checks exactly-once end to end with the `Counter` app (tests/consumer/apps.py):
the committed outputs of each key must count 1, 2, …, N with nothing missing or repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pygazette.client import JournalClient, append, apply_journals
from pygazette.client.append_service import AppendService
from pygazette.client.reader import Reader
from pygazette.consumer.recoverylog import Player
from pygazette.consumer.shard_client import ShardClient
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.keyspace import Delete, Put
from pygazette.keyspace.layout import KeyLayout
from pygazette.message.publisher import Publisher
from pygazette.message.reader import ReadCommitted
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.journal_data import small_journal_spec

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(300),
]

NDJSON = "application/x-ndjson"
RECOVERY_LOG = "application/x-gazette-recoverylog"
PREFIX = "/tests/consumers/counter"
SOURCES = ["tests/consumer/in-a", "tests/consumer/in-b"]
OUT = "tests/consumer/out"
LOGS = "tests/consumer/recovery"
SHARD = "counter-000"
ROCKSDB_SHARD = "counter-000-rocksdb"  # The Counter app keeps it in a RocksDBStore.
LEASE = "3s"


def shard_spec(shard_id: str = SHARD, *, standbys: int = 1, log: bool = True) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id, hot_standbys=standbys)
    for src in SOURCES:
        spec.sources.add(journal=src)
    if log:
        spec.recovery_log_prefix = LOGS
        spec.hint_prefix = "/tests/hints"
        spec.hint_backups = 2
    spec.max_txn_duration.FromMilliseconds(100)
    spec.labels.CopyFrom(label_set({"app": "counter"}))
    return spec


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(tmp_path / "etcd")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


class Group:
    """A broker, etcd, and consumer processes of the Counter app."""

    def __init__(self, tmp: Path, etcd: EtcdProcess, broker: BrokerProcess) -> None:
        self.tmp = tmp
        self.etcd = etcd
        self.broker = broker
        self.consumers: list[ConsumerProcess] = []
        self.layout = KeyLayout(PREFIX)
        self.ks = EtcdKeyspace(etcd.url, PREFIX)

    def add(self, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> ConsumerProcess:
        n = len(self.consumers)
        proc = ConsumerProcess(
            self.tmp / f"consumer-{n}",
            app="tests.consumer.apps:Counter",
            broker=self.broker.url,
            etcd=self.etcd.url,
            etcd_prefix=PREFIX,
            member_id=f"member-{n}",
            extra_args=["--lease-ttl", LEASE, "--hints-interval", "1s", *args],
            env=env,
        )
        self.consumers.append(proc)
        proc.start()
        return proc

    async def apply(self, *specs: cpb.ShardSpec) -> None:
        ops = [Put(self.layout.item_key(s.id), s.SerializeToString()) for s in specs]
        result = await self.ks.txn([], ops)
        assert result.succeeded

    def replicas(self, shard: str = SHARD) -> dict[int, tuple[str, cpb.ReplicaStatus]]:
        """slot -> (member suffix, status) of the shard's assignments."""
        out: dict[int, tuple[str, cpb.ReplicaStatus]] = {}
        for kv in self.ks.range(self.layout.item_assignments_prefix(shard)):
            key = self.layout.parse_assignment_key(kv.key)
            status = cpb.ReplicaStatus()
            status.ParseFromString(kv.value)
            out[key.slot] = (key.suffix, status)
        return out

    def failed(self, shard: str) -> bool:
        statuses = [s for _m, s in self.replicas(shard).values()]
        return bool(statuses) and all(s.code == cpb.ReplicaStatus.FAILED for s in statuses)

    def primary(self, shard: str = SHARD) -> ConsumerProcess | None:
        slot0 = self.replicas(shard).get(0)
        if slot0 is None or slot0[1].code != cpb.ReplicaStatus.PRIMARY:
            return None
        for c in self.consumers:
            if c.member_id == slot0[0] and c.running():
                return c
        return None

    async def wait_for(self, cond: Any, what: str, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while not cond():
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {c.member_id}\n{c.log()}" for c in self.consumers)
                raise AssertionError(f"timed out waiting for {what}\n{logs}")
            with contextlib.suppress(TimeoutError):
                await self.ks.wait_for_change(self.ks.revision, 0.5)

    async def wait_primary(self, shard: str = SHARD, *, not_: Any = None) -> ConsumerProcess:
        found: list[ConsumerProcess] = []

        def ready() -> bool:
            p = self.primary(shard)
            if p is None or p is not_:
                return False
            found[:] = [p]
            return True

        await self.wait_for(ready, f"a primary of {shard}")
        return found[0]

    async def wait_standby(self, shard: str = SHARD) -> None:
        await self.wait_for(
            lambda: any(
                s.code == cpb.ReplicaStatus.STANDBY
                for slot, (_m, s) in self.replicas(shard).items()
                if slot > 0
            ),
            f"a standby of {shard}",
        )


@pytest.fixture
async def group(tmp_path: Path, etcd: EtcdProcess, broker: BrokerProcess) -> AsyncIterator[Group]:
    g = Group(tmp_path, etcd, broker)
    await g.ks.open()
    async with JournalClient(broker.url) as client:
        specs = [small_journal_spec(j) for j in [*SOURCES, OUT]]
        specs += [
            small_journal_spec(f"{LOGS}/{s}", RECOVERY_LOG)
            for s in (SHARD, "counter-001", "counter-002", ROCKSDB_SHARD)
        ]
        await apply_journals(
            client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
        )
    try:
        yield g
    finally:
        for c in g.consumers:
            c.kill()
        await g.ks.close()


class Inputs:
    """Publishes committed inputs: `n` messages per round over keys k0..k9."""

    def __init__(self, client: JournalClient) -> None:
        self.client = client
        self.sent = 0
        self.heads: dict[str, int] = {}

    async def publish(self, n: int) -> None:
        async with AppendService(self.client) as service:
            pub = Publisher(service)
            msgs = [{"key": f"k{(self.sent + i) % 10}"} for i in range(n)]
            half = n // 2
            for src, batch in ((SOURCES[0], msgs[:half]), (SOURCES[1], msgs[half:])):
                for aa in pub.publish_committed_many(lambda _m, s=src: (s, NDJSON), batch):
                    await aa
                    assert aa.response is not None
                    self.heads[src] = aa.response.commit.end
        self.sent += n


async def committed_outputs(client: JournalClient, expected: int, within: float) -> list[Any]:
    """Committed outputs, read until `expected` arrived (or `within` seconds passed)."""
    out: list[Any] = []
    deadline = time.monotonic() + within
    async with ReadCommitted(client, OUT, block=True) as rc:
        while len(out) < expected:
            try:
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    out.extend(e.message for e in await rc.next_batch())
            except TimeoutError:
                break
    # Then anything more that is there already (duplicates would show up here).
    async with ReadCommitted(client, OUT, offset=None) as rc:
        everything: list[Any] = []
        with contextlib.suppress(StopAsyncIteration):
            while True:
                everything.extend(e.message for e in await rc.next_batch())
    return everything


def assert_exactly_once(outputs: list[Any], sent: int) -> None:
    by_key: dict[str, list[int]] = {}
    for o in outputs:
        by_key.setdefault(o["key"], []).append(o["count"])
    assert sum(len(v) for v in by_key.values()) == sent, {k: len(v) for k, v in by_key.items()}
    for key, counts in by_key.items():
        assert counts == list(range(1, len(counts) + 1)), (key, counts)


async def test_primary_killed_standby_takes_over_exactly_once(group: Group) -> None:
    for _ in range(3):
        group.add()
    await group.apply(shard_spec())
    async with JournalClient(group.broker.url) as client:
        inputs = Inputs(client)
        primary = await group.wait_primary()
        await group.wait_standby()
        for _round in range(3):
            await inputs.publish(400)
            await committed_outputs(client, inputs.sent, 60)
            await group.wait_standby()
            primary.kill()
            primary = await group.wait_primary(not_=primary)
            primary_restart = [c for c in group.consumers if not c.running()]
            for c in primary_restart:
                c.start()
        await inputs.publish(400)
        outputs = await committed_outputs(client, inputs.sent, 60)
        assert_exactly_once(outputs, inputs.sent)


async def test_rocksdb_primary_killed_standby_takes_over_exactly_once(group: Group) -> None:
    # A RocksDBStore (the Counter app's store for shards named *-rocksdb): the standby plays
    # the recorded database and takes over from the kill -9'd primary.
    shard = ROCKSDB_SHARD
    for _ in range(2):
        group.add()
    await group.apply(shard_spec(shard))
    async with JournalClient(group.broker.url) as client:
        inputs = Inputs(client)
        primary = await group.wait_primary(shard=shard)
        await group.wait_standby(shard=shard)
        await inputs.publish(100)
        await committed_outputs(client, inputs.sent, 60)
        primary.kill()
        await group.wait_primary(not_=primary, shard=shard)
        await inputs.publish(100)
        outputs = await committed_outputs(client, inputs.sent, 60)
        assert_exactly_once(outputs, inputs.sent)


async def test_frozen_primary_is_fenced_after_takeover(group: Group) -> None:
    a, b = group.add(), group.add()
    await group.apply(shard_spec())
    async with JournalClient(group.broker.url) as client:
        inputs = Inputs(client)
        old = await group.wait_primary()
        await group.wait_standby()
        await inputs.publish(300)
        await committed_outputs(client, inputs.sent, 60)
        # Publish more and freeze the primary at once, likely mid-transaction, past its
        # lease: the standby takes over (hand-off in the log) and processes those inputs.
        log_head = await log_write_head(client)
        await inputs.publish(300)
        old.freeze()
        try:
            new = await group.wait_primary(not_=old)
            assert new is not old
            await inputs.publish(300)
            await committed_outputs(client, inputs.sent, 60)
        finally:
            old.thaw()
        # The resumed primary finds its lease gone and its log author fenced: it exits
        # (or fails the shard) without committing anything more, and at once: its shards
        # get no time to finish transactions they could not commit any more.
        thawed = time.monotonic()
        status = old.wait_exit(60)
        assert status != 0
        assert time.monotonic() - thawed < 8, old.log()
        assert "lease" in old.log() or "fenced" in old.log().lower(), old.log()
        await inputs.publish(300)
        outputs = await committed_outputs(client, inputs.sent, 60)
        assert_exactly_once(outputs, inputs.sent)
        assert await log_write_head(client) > log_head
        del a, b


async def test_a_draining_consumer_hands_its_shard_over_and_exits_zero(group: Group) -> None:
    """SIGTERM: the consumer marks itself exiting, its shard moves to the other member, and
    it exits 0 once it holds none, well before its drain timeout (30 s)."""
    draining = group.add()
    group.add()
    await group.apply(shard_spec(standbys=0, log=False))
    assert await group.wait_primary() is draining
    assert draining.proc is not None
    draining.proc.send_signal(signal.SIGTERM)
    termed = time.monotonic()
    assert await asyncio.to_thread(draining.wait_exit, 25.0) == 0, draining.log()
    assert time.monotonic() - termed < 20, draining.log()
    await group.wait_primary(not_=draining)


async def test_a_draining_consumer_that_loses_its_lease_exits_at_once(group: Group) -> None:
    """SIGTERM starts a drain that can't finish (the other member takes no shards); etcd then
    goes away for good. The consumer's lease lapses after its TTL (3 s) and, as Gazette's
    consumer (and pygazette's broker), it must leave then, non-zero: it holds no shard any
    more and handed none over. It waited out the rest of its drain (30 s) and exited 0."""
    draining = group.add()
    group.add(args=("--shard-limit", "0"))
    await group.apply(shard_spec(standbys=0, log=False))
    assert await group.wait_primary() is draining
    assert draining.proc is not None
    draining.proc.send_signal(signal.SIGTERM)
    key = group.layout.member_key(draining.zone, draining.member_id)

    def exiting() -> bool:
        kv = group.ks.get(key)
        return kv is not None and cpb.ConsumerSpec.FromString(kv.value).exiting

    await group.wait_for(exiting, "the consumer marks itself exiting")
    group.etcd.stop()  # The lease can't be kept alive.
    lost_at = time.monotonic()
    try:
        code = await asyncio.to_thread(draining.wait_exit, 20.0)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"still draining {time.monotonic() - lost_at:.0f} s after etcd went away\n"
            f"{draining.log()}"
        ) from None
    assert code != 0, draining.log()
    assert "lease" in draining.log()


async def test_a_consumer_whose_member_key_is_deleted_revokes_its_lease_as_it_leaves(
    group: Group,
) -> None:
    """The primary's member key is deleted by hand: it leaves (non-zero) and, as Gazette's
    consumer does, revokes its lease, still alive, so that its assignments go with it and
    the standby takes the shard over at once. Left to lapse, the lease (30 s here) kept the
    shard's primary assignment and the standby waited for it."""
    primary = group.add(args=("--lease-ttl", "30s"))
    group.add(args=("--lease-ttl", "30s"))
    await group.apply(shard_spec(standbys=1, log=True))
    assert await group.wait_primary() is primary
    await group.wait_standby()
    key = group.layout.member_key(primary.zone, primary.member_id)
    assert (await group.ks.txn([], [Delete(key)])).succeeded
    assert await asyncio.to_thread(primary.wait_exit, 10.0) != 0, primary.log()
    deleted = time.monotonic()
    await group.wait_primary(not_=primary)
    assert time.monotonic() - deleted < 15, "the standby waited for the lease to lapse"


async def log_write_head(client: JournalClient) -> int:
    async with Reader(client, f"{LOGS}/{SHARD}", offset=-1, metadata_only=True) as reader:
        with contextlib.suppress(Exception):
            await reader.read()
        return reader.write_head


async def test_failing_app_fails_only_its_shard(group: Group) -> None:
    group.add(env={"COUNTER_FAIL_ON": "poison"})
    other = shard_spec("counter-001", standbys=0)
    await group.apply(shard_spec(standbys=0), other)
    async with JournalClient(group.broker.url) as client:
        await group.wait_primary()
        await group.wait_primary("counter-001")
        async with AppendService(client) as service:
            pub = Publisher(service)
            await pub.publish_committed(lambda _m: (SOURCES[0], NDJSON), {"key": "poison"})
        await group.wait_for(
            lambda: all(
                s.code == cpb.ReplicaStatus.FAILED for _m, s in group.replicas(SHARD).values()
            ),
            "the shards to fail",
        )
        errors = [e for _m, s in group.replicas(SHARD).values() for e in s.errors]
        assert any("cannot count key 'poison'" in e for e in errors), errors
        # Nothing of the failed transaction committed.
        outputs = await committed_outputs(client, 0, 1)
        assert all(o["key"] != "poison" for o in outputs)


async def test_a_shard_failing_with_a_long_error_reports_it_truncated(group: Group) -> None:
    """A failure's message goes into the assignment's status cut to 2,048 characters and
    ' ...[truncated]', as Gazette cuts it (MAX_ETCD_ERR_LEN). Whole, a long one (here 2 MiB
    of detail) is more than etcd takes in a request: the status write was refused and
    retried for ever, and the shard never showed FAILED (still PRIMARY to the allocator,
    `shards list` and `shards unassign --failed`)."""
    group.add(env={"COUNTER_FAIL_ON": "poison", "COUNTER_FAIL_DETAIL_BYTES": str(2 << 20)})
    await group.apply(shard_spec(standbys=0))
    async with JournalClient(group.broker.url) as client:
        await group.wait_primary()
        async with AppendService(client) as service:
            pub = Publisher(service)
            await pub.publish_committed(lambda _m: (SOURCES[0], NDJSON), {"key": "poison"})
        await group.wait_for(lambda: group.failed(SHARD), "the shard to fail", within=30)
    (error,) = [e for _m, s in group.replicas(SHARD).values() for e in s.errors]
    assert error.startswith("ValueError: cannot count key 'poison' xxx"), error[:100]
    assert error.endswith("x ...[truncated]") and len(error) == 2048 + len(" ...[truncated]")


async def test_stat_reads_your_writes_through_any_consumer(group: Group) -> None:
    group.add()
    group.add()
    await group.apply(shard_spec())
    async with JournalClient(group.broker.url) as client:
        inputs = Inputs(client)
        primary = await group.wait_primary()
        other = next(c for c in group.consumers if c is not primary)
        await inputs.publish(500)
        # Ask the process that is NOT primary: it proxies to the primary, which answers
        # once it has committed a transaction reading through the given offsets.
        async with ShardClient(other.url, route_stat=False) as shards:
            resp = await shards.stat(SHARD, inputs.heads, within=60)
        for journal, offset in inputs.heads.items():
            assert resp.read_through[journal] >= offset
        assert resp.publish_at[OUT] > 0
        # Read-your-writes: every output is committed and readable right now.
        outputs: list[Any] = []
        async with ReadCommitted(client, OUT) as rc:
            with contextlib.suppress(StopAsyncIteration):
                while True:
                    outputs.extend(e.message for e in await rc.next_batch())
        assert_exactly_once(outputs, inputs.sent)


async def test_store_rebuilt_from_log_and_hints_equals_the_primarys(group: Group) -> None:
    primary_proc = group.add()
    await group.apply(shard_spec(standbys=0))
    async with JournalClient(group.broker.url) as client:
        inputs = Inputs(client)
        await group.wait_primary()
        for _ in range(3):  # Several commits, and recorded hints stored meanwhile.
            await inputs.publish(300)
            async with ShardClient(primary_proc.url) as shards:
                await shards.stat(SHARD, inputs.heads, within=60)
        async with ShardClient(primary_proc.url) as shards:
            deadline = time.monotonic() + 30
            while True:  # Recorded hints land every --hints-interval (1s here).
                hints = await shards.get_hints(SHARD)
                if hints.primary_hints.HasField("hints") and hints.primary_hints.hints.live_nodes:
                    break
                assert time.monotonic() < deadline, "no recorded hints were stored"
                await asyncio.sleep(0.2)
        recorded = hints.primary_hints.hints
        assert recorded.log == f"{LOGS}/{SHARD}"
        # Recovery verified the (empty) hints it started from: they rotated into backup 0.
        assert hints.backup_hints[0].HasField("hints")
        # A player with no local disk rebuilds the store from the hints and the log.
        target = group.tmp / "rebuilt"
        player = Player(client, recorded, target)
        player.finish_at_write_head()
        await player.play()
        live = next((group.tmp / "consumer-0" / "shards").glob(f"{SHARD}-*"))
        original = json.loads((live / "state.json").read_bytes())
        rebuilt = json.loads((target / "state.json").read_bytes())
        assert rebuilt == original
        assert sum(rebuilt["state"]["counts"].values()) == inputs.sent


async def test_undecodable_message_and_unopenable_store_fail_only_their_shards(
    group: Group,
) -> None:
    group.add(env={"COUNTER_BROKEN_STORES": "counter-002"})
    decoding = shard_spec(standbys=0, log=False)
    decoding.ClearField("sources")
    decoding.sources.add(journal=SOURCES[1])
    healthy = shard_spec("counter-001", standbys=0, log=False)
    healthy.ClearField("sources")
    healthy.sources.add(journal=SOURCES[0])
    broken = shard_spec("counter-002", standbys=0, log=False)
    await group.apply(decoding, healthy, broken)
    async with JournalClient(group.broker.url) as client:
        await group.wait_primary("counter-001")
        await group.wait_for(
            lambda: group.failed("counter-002"), "the shard whose store can't open to fail"
        )
        errors = [e for _m, s in group.replicas("counter-002").values() for e in s.errors]
        assert any("cannot open the store of counter-002" in e for e in errors), errors
        # A line that is not JSON in counter-000's source fails it, with the decode error.
        await append(client, SOURCES[1], b'{"key": "k1"}\nnot json at all\n')
        await group.wait_for(
            lambda: group.failed(SHARD), "the shard reading undecodable content to fail"
        )
        errors = [e for _m, s in group.replicas(SHARD).values() for e in s.errors]
        assert any("MessageDecodeError" in e for e in errors), errors
        # The healthy shard carries on.
        inputs = Inputs(client)
        await inputs.publish(100)
        outputs = await committed_outputs(client, 50, 30)
        assert len([o for o in outputs if o["shard"] == "counter-001"]) == 50
        assert all(o["shard"] == "counter-001" for o in outputs)
