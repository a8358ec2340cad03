"""The README's consumer example, as a newcomer runs it: its code (README.md shows
examples/counter/counter.py whole) served by `pygazette consumer serve` alone on an embedded
keyspace (no etcd), with the journals and the shard of examples/counter/ applied, and words
published to its source."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path
from typing import Any

from pygazette.cli import journalspace, shardspace
from pygazette.client import JournalClient, apply_journals
from pygazette.client.append_service import AppendService
from pygazette.consumer.shard_client import ShardClient
from pygazette.message.publisher import Publisher
from pygazette.message.reader import ReadCommitted
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
EXAMPLE = REPO / "examples" / "counter"
NDJSON = "application/x-ndjson"


def readme_counter_source() -> str:
    text = README.read_text()
    blocks = re.findall(r"```python\n(# examples/counter/counter\.py.*?)```", text, re.S)
    assert blocks, "README.md lost its counter.py example"
    return blocks[0]


def test_the_readme_shows_the_example_file() -> None:
    assert readme_counter_source() == (EXAMPLE / "counter.py").read_text()


async def test_readme_counter_runs_on_an_embedded_keyspace(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "counter.py").write_text(readme_counter_source())
    consumer = ConsumerProcess(
        tmp_path / "consumer", app="counter:Counter", broker=broker.url, env={}
    )
    consumer.env["PYTHONPATH"] = str(app_dir)
    consumer.start()
    try:
        async with JournalClient(broker.url) as client:
            journals = journalspace.parse_journalspace((EXAMPLE / "journalspace.yaml").read_text())
            await apply_journals(client, list(journalspace.apply_request(journals).changes))
            shard_set = shardspace.parse_shardspace((EXAMPLE / "shards.yaml").read_text())
            async with ShardClient(consumer.url) as shards:
                await shards.apply(list(shardspace.apply_request(shard_set).changes))
                words = ["the", "cat", "the", "hat", "the"]
                async with AppendService(client) as service:
                    pub = Publisher(service)
                    aas = pub.publish_committed_many(
                        lambda _m: ("examples/words", NDJSON), [{"word": w} for w in words]
                    )
                    for aa in aas:
                        await aa
                head = aas[-1].response.commit.end  # type: ignore[union-attr]
                deadline = time.monotonic() + 60
                while True:
                    try:
                        await shards.stat("counter-000", {"examples/words": head}, within=30)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise AssertionError(consumer.log()) from None
                        await asyncio.sleep(0.2)  # Not assigned yet.
            outputs: list[Any] = []
            async with ReadCommitted(client, "examples/counts") as rc:
                with contextlib.suppress(StopAsyncIteration):
                    while True:
                        outputs.extend(e.message for e in await rc.next_batch())
        counts = [(o["word"], o["n"]) for o in outputs]
        assert counts == [("the", 1), ("cat", 1), ("the", 2), ("hat", 1), ("the", 3)]
    finally:
        consumer.kill()
