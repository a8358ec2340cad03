"""`/metrics` and health of real consumer processes (`consumer serve --http-port`): a primary
and a hot standby of the Counter app on etcd, after a workload."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pygazette.client import JournalClient, apply_journals
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.consumer.test_consumer_cluster import (
    LEASE,
    LOGS,
    OUT,
    PREFIX,
    RECOVERY_LOG,
    SHARD,
    SOURCES,
    Group,
    Inputs,
    committed_outputs,
    shard_spec,
)
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.http_scrape import Samples, get, scrape, value, wait_status
from tests.support.journal_data import small_journal_spec
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(300),
]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """An etcd of this test alone (the group's key prefix is fixed)."""
    proc = EtcdProcess(tmp_path / "etcd")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def group(tmp_path: Path, etcd: EtcdProcess, broker: BrokerProcess) -> AsyncIterator[Group]:
    g = Group(tmp_path, etcd, broker)
    await g.ks.open()
    async with JournalClient(broker.url) as client:
        specs = [small_journal_spec(j) for j in [*SOURCES, OUT]]
        specs.append(small_journal_spec(f"{LOGS}/{SHARD}", RECOVERY_LOG))
        await apply_journals(
            client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
        )
    try:
        yield g
    finally:
        for c in g.consumers:
            c.kill()
        await g.ks.close()


def add_consumer(group: Group) -> tuple[ConsumerProcess, str]:
    n = len(group.consumers)
    http_port = free_port()
    proc = ConsumerProcess(
        group.tmp / f"consumer-{n}",
        app="tests.consumer.apps:Counter",
        broker=group.broker.url,
        etcd=group.etcd.url,
        etcd_prefix=PREFIX,
        member_id=f"member-{n}",
        extra_args=["--lease-ttl", LEASE, "--hints-interval", "1s", "--http-port", str(http_port)],
    )
    group.consumers.append(proc)
    proc.start()
    return proc, f"http://127.0.0.1:{http_port}"


async def scrape_until(base: str, done: object, within: float = 30.0) -> Samples:
    deadline = time.monotonic() + within
    while True:
        samples = await asyncio.to_thread(scrape, base)
        if done(samples) or time.monotonic() > deadline:  # type: ignore[operator]
            return samples
        await asyncio.sleep(0.1)


async def test_shard_metrics_and_readiness(group: Group) -> None:
    bases = dict(add_consumer(group) for _ in range(2))
    for base in bases.values():
        # Live at once; ready once joined and its shards (none yet) settled.
        await asyncio.to_thread(wait_status, base + "/debug/live")
        await asyncio.to_thread(wait_status, base + "/debug/ready")
    await group.apply(shard_spec(standbys=1))
    primary = await group.wait_primary()
    await group.wait_standby()
    standby = next(c for c in group.consumers if c is not primary)

    sent = 100
    async with JournalClient(group.broker.url) as client:
        inputs = Inputs(client)
        await inputs.publish(sent)
        assert len(await committed_outputs(client, sent, within=60)) == sent

    base = bases[primary]
    shard = {"shard": SHARD}
    after = await scrape_until(
        base,
        lambda s: all(
            value(s, "gazette_shard_read_head", shard=SHARD, journal=j) == inputs.heads[j]
            for j in SOURCES
        ),
    )
    assert value(after, "gazette_shard_up", shard=SHARD, status="PRIMARY") == 1
    assert value(after, "gazette_shard_read_messages_total", **shard) == sent
    transactions = value(after, "gazette_shard_transactions_total", **shard)
    assert 1 <= transactions <= sent
    assert value(after, "gazette_shard_read_bytes_total", **shard) > 0
    for journal in SOURCES:
        assert (
            value(after, "gazette_shard_read_head", shard=SHARD, journal=journal)
            == (inputs.heads[journal])
        )
    assert value(after, "pygazette_shard_transaction_duration_seconds_count") >= transactions
    assert value(after, "process_resident_memory_bytes") > 0
    assert get(base + "/debug/ready")[0] == 200
    assert value(after, "pygazette_etcd_lease", state="alive") == 1

    # The standby plays the recovery log the primary writes.
    standby_samples = await scrape_until(
        bases[standby], lambda s: value(s, "gazette_recoverylog_recovered_bytes_total") > 0
    )
    assert value(standby_samples, "gazette_shard_up", shard=SHARD, status="STANDBY") == 1
    assert value(standby_samples, "gazette_recoverylog_recovered_bytes_total") > 0
    assert value(standby_samples, "gazette_shard_transactions_total", **shard) == 0
    assert get(bases[standby] + "/debug/ready")[0] == 200
