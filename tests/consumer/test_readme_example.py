"""The README's consumer example, as a newcomer runs it: its code copied out of README.md,
served by `pygazette consumer serve` alone on an embedded keyspace (no etcd), with a shard
applied through the Shard service and words published to its source."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path
from typing import Any

from pygazette.client import JournalClient, apply_journals
from pygazette.client.append_service import AppendService
from pygazette.consumer.shard_client import ShardClient
from pygazette.message.publisher import Publisher
from pygazette.message.reader import ReadCommitted
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.journal_data import small_journal_spec

README = Path(__file__).resolve().parents[2] / "README.md"
NDJSON = "application/x-ndjson"


def readme_counter_source() -> str:
    text = README.read_text()
    blocks = re.findall(r"```python\n(# counter\.py.*?)```", text, re.S)
    assert blocks, "README.md lost its counter.py example"
    return blocks[0]


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
            await apply_journals(
                client,
                [
                    pb.ApplyRequest.Change(upsert=small_journal_spec(j), expect_mod_revision=0)
                    for j in ("examples/words", "examples/counts")
                ],
            )
            spec = cpb.ShardSpec(id="counter-000")
            spec.sources.add(journal="examples/words")
            spec.max_txn_duration.FromMilliseconds(100)
            async with ShardClient(consumer.url) as shards:
                await shards.apply([cpb.ApplyRequest.Change(upsert=spec)])
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
