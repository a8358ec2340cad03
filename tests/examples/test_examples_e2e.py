"""The examples end to end, for real: etcd, a broker joined to it, two consumer processes
(`pygazette consumer serve --app ...`), journals and shards applied with the CLI.

- stream-sum: the chunker verifies every stream's sum arrives exactly once, with its value;
  again while the primary of a shard is killed (kill -9) and its hot standby takes over.
- word-count: published texts are counted, and queries read their writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from examples.run_consumer_demo import (
    HERE,
    STREAM_SUM_APP,
    STREAM_SUM_PREFIX,
    TEXTS,
    WORD_COUNT_APP,
    WORD_COUNT_PREFIX,
    ConsumerCluster,
    shard_ids,
)
from examples.stream_sum.chunker import ChunkerConfig, run_chunker
from examples.stream_sum.messages import FINAL_SUMS_JOURNAL
from examples.word_count.publish import publish_text
from examples.word_count.query import query
from examples.word_count.wordcount import ngrams
from pygazette.client import JournalClient
from pygazette.client.reader import Reader
from pygazette.client.retry_reader import read_journal
from pygazette.consumer.shard_client import ShardClient
from tests.support.etcd_process import etcd_binary

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(300),
]

STREAM_SUM_SHARDS = HERE / "stream_sum" / "shards.yaml"
WORD_COUNT_SHARDS = HERE / "word_count" / "shards.yaml"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ConsumerCluster]:
    c = ConsumerCluster(tmp_path, lease_ttl="3s")
    c.start()
    try:
        await c.apply_journals(HERE / "stream_sum" / "journalspace.yaml")
        await c.apply_journals(HERE / "word_count" / "journalspace.yaml")
        yield c
    finally:
        await c.close()
        for proc in c.consumers:
            proc.kill()
        c.stop()


async def start_summers(cluster: ConsumerCluster) -> list[str]:
    summers = [
        cluster.add_consumer(STREAM_SUM_APP, STREAM_SUM_PREFIX, f"summer-{i}") for i in range(2)
    ]
    await cluster.apply_shards(STREAM_SUM_SHARDS, summers[0])
    ids = shard_ids(STREAM_SUM_SHARDS)
    await cluster.wait_ready(STREAM_SUM_PREFIX, ids, standbys=1)
    return [s.url for s in summers]


def assert_verified(summary: dict[str, object], streams: int) -> None:
    assert summary["ok"], summary
    assert summary["verified"] == streams, summary
    assert summary["duplicates"] == summary["mismatches"] == summary["missing"] == 0, summary


async def test_stream_sum_every_sum_exactly_once(cluster: ConsumerCluster) -> None:
    urls = await start_summers(cluster)
    cfg = ChunkerConfig(
        broker=cluster.broker.url, streams=30, chunks=30, workers=4, consumer=urls[0], seed=7
    )
    summary = await run_chunker(cfg)
    assert_verified(summary, 30)
    assert summary["chunks"] == 30 * 31
    assert summary["settled_shards"] == shard_ids(STREAM_SUM_SHARDS)

    # Sums (and their acknowledgements) are written as Go's encoding/json writes them.
    async with JournalClient(cluster.broker.url) as client:
        raw = b"".join([c async for c in read_journal(client, FINAL_SUMS_JOURNAL)])
    lines = raw.splitlines()
    assert lines
    for line in lines:
        doc = orjson.loads(line)
        assert list(doc) == ["UUID", "ID", "SeqNo", "Value"], line
        assert orjson.dumps(doc) == line  # Compact, in Go's field order.
    assert sum(1 for line in lines if orjson.loads(line)["SeqNo"]) >= 30


async def test_stream_sum_survives_a_killed_primary(cluster: ConsumerCluster) -> None:
    urls = await start_summers(cluster)
    cfg = ChunkerConfig(
        broker=cluster.broker.url, streams=60, chunks=60, workers=4, consumer=urls[1], seed=8
    )
    chunker = asyncio.create_task(run_chunker(cfg))
    try:
        # Once chunks flow to the shard, kill its primary: its standby takes over from the
        # recovery log; no sum may be lost, repeated or wrong.
        async with JournalClient(cluster.broker.url) as client:
            async with Reader(client, "examples/stream-sum/chunks/part-000", block=True) as r:
                assert await r.read()
        victim = await cluster.primary_of(STREAM_SUM_PREFIX, "chunks-part-000")
        assert victim is not None
        assert not chunker.done()
        victim.kill()
        summary = await chunker
    finally:
        if not chunker.done():
            chunker.cancel()
            with contextlib.suppress(BaseException):
                await chunker
    assert_verified(summary, 60)
    survivor = await cluster.primary_of(STREAM_SUM_PREFIX, "chunks-part-000")
    assert survivor is not None and survivor is not victim


@pytest.fixture
async def counters(cluster: ConsumerCluster) -> str:
    procs = [
        cluster.add_consumer(WORD_COUNT_APP, WORD_COUNT_PREFIX, f"counter-{i}") for i in range(2)
    ]
    await cluster.apply_shards(WORD_COUNT_SHARDS, procs[0])
    await cluster.wait_ready(WORD_COUNT_PREFIX, shard_ids(WORD_COUNT_SHARDS))
    return procs[1].url


async def test_word_count_reads_its_writes(cluster: ConsumerCluster, counters: str) -> None:
    expected: Counter[str] = Counter()
    offsets: dict[str, int] = {}
    async with JournalClient(cluster.broker.url) as client, ShardClient(counters) as shards:
        for text in TEXTS:
            written = await publish_text(client, text)
            expected.update(ngrams(text))
            for journal, offset in written["journals"].items():
                offsets[journal] = max(offset, offsets.get(journal, 0))
            # Right after each publish, a query sees it (no waiting in between).
            got = await query(client, shards, "was", offsets=offsets)
            assert got["count"] == expected["was"], got
        for word in ("it", "born", "times", "never-published"):
            got = await query(client, shards, word, offsets=offsets)
            assert got["count"] == expected[word], (word, got)
        # Without offsets: the partition's write head now (everybody's writes).
        got = await query(client, shards, "the")
        assert got["count"] == expected["the"]
        # A prefix query answers from the shard the prefix maps to (as Gazette's Query).
        got = await query(client, shards, "was", prefix=True)
        assert got["grams"]["was"] == expected["was"]
        assert all(g.startswith("was") for g in got["grams"])
