"""stream-sum under faults, as the consumer issue asks: three summer processes with
`hot_standbys: 1` while consumer primaries are killed with kill -9 (and restarted) and the
broker is killed and restarted: every stream's sum is verified, none is published twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from examples.run_consumer_demo import (
    HERE,
    STREAM_SUM_APP,
    STREAM_SUM_PREFIX,
    ConsumerCluster,
    shard_ids,
)
from examples.stream_sum.chunker import ChunkerConfig, run_chunker
from tests.support.etcd_process import etcd_binary

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(300),
]

SHARDS = HERE / "stream_sum" / "shards.yaml"
STREAMS = 80


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ConsumerCluster]:
    c = ConsumerCluster(tmp_path, lease_ttl="3s", broker_lease_ttl="3s")
    c.start()
    try:
        await c.apply_journals(HERE / "stream_sum" / "journalspace.yaml")
        yield c
    finally:
        await c.close()
        for proc in c.consumers:
            proc.kill()
        c.stop()


async def test_stream_sum_exactly_once_through_consumer_kills_and_a_broker_restart(
    cluster: ConsumerCluster,
) -> None:
    summers = [
        cluster.add_consumer(STREAM_SUM_APP, STREAM_SUM_PREFIX, f"summer-{i}") for i in range(3)
    ]
    await cluster.apply_shards(SHARDS, summers[0])
    ids = shard_ids(SHARDS)
    await cluster.wait_ready(STREAM_SUM_PREFIX, ids, standbys=1)
    cfg = ChunkerConfig(
        broker=cluster.broker.url,
        streams=STREAMS,
        chunks=40,
        workers=4,
        consumer=summers[2].url,
        seed=11,
    )
    chunker = asyncio.create_task(run_chunker(cfg))
    try:
        for shard in (ids[0], ids[1]):
            # kill -9 a primary mid-stream; its standby takes over from the recovery log.
            victim = await cluster.primary_of(STREAM_SUM_PREFIX, shard)
            assert victim is not None, cluster.logs()
            assert not chunker.done(), "the chunker finished before the faults"
            victim.kill()
            await cluster.wait_ready(STREAM_SUM_PREFIX, [shard])
            victim.start()  # It comes back as a standby.
        # kill -9 the broker and restart it on its data directory: every acknowledged
        # append survives (crash-safe spools), and consumers and the chunker retry.
        assert not chunker.done(), "the chunker finished before the faults"
        cluster.broker.kill()
        cluster.broker.start()
        summary = await asyncio.wait_for(chunker, 240)
    finally:
        if not chunker.done():
            chunker.cancel()
            with contextlib.suppress(BaseException):
                await chunker
    if not summary["ok"]:
        print(json.dumps(summary, default=str))
        print(cluster.logs()[-20000:])
    assert summary["ok"], json.dumps(summary, default=str)
    assert summary["verified"] == STREAMS, summary
    assert summary["duplicates"] == summary["mismatches"] == summary["missing"] == 0, summary
