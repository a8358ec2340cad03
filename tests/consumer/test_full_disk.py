"""Full disk under a consumer: its data directory (where shard stores live) is a small tmpfs
that fills up while the shard commits.

The store's failed write interrupts the shard cleanly: never FAILED, it logs "No space left
on device" and recovers again from its log, with backoff, while the process goes on.
Nothing of the failed transaction is committed and nothing acknowledged is lost. Once space
is freed the shard recovers by itself, in the same process, and goes on exactly once: every
key's committed outputs count 1, 2, …, N with nothing missing or repeated. A restarted
consumer on that data directory recovers it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pygazette.client import JournalClient
from pygazette.protocol.pb import consumer_pb2 as cpb
from tests.consumer.test_consumer_cluster import (
    SHARD,
    Group,
    Inputs,
    assert_exactly_once,
    committed_outputs,
    shard_spec,
)
from tests.consumer.test_consumer_cluster import (  # Fixtures: etcd, the Counter group.
    etcd as etcd,
)
from tests.consumer.test_consumer_cluster import group as group
from tests.support.small_fs import SmallFs, mounted_tmpfs

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def consumer_fs(tmp_path: Path) -> AsyncIterator[SmallFs]:
    # Where Group.add puts the first consumer's data directory.
    with mounted_tmpfs(tmp_path / "consumer-0", size="4m") as fs:
        yield fs


async def test_full_store_disk_interrupts_the_shard_until_space_is_freed_exactly_once(
    consumer_fs: SmallFs, group: Group
) -> None:
    consumer = group.add()
    await group.apply(shard_spec(standbys=0))
    async with JournalClient(group.broker.url) as client:
        inputs = Inputs(client)
        await group.wait_primary()
        await inputs.publish(100)
        before = await committed_outputs(client, inputs.sent, 60)
        assert_exactly_once(before, inputs.sent)

        consumer_fs.fill(leave=0)
        await inputs.publish(100)

        def out_of_space() -> bool:
            return "No space left on device" in consumer.log() and "will recover" in (
                consumer.log()
            )

        await group.wait_for(out_of_space, "the shard to report the full disk")
        assert not group.failed(SHARD), group.replicas(SHARD)
        assert consumer.running()  # The shard is interrupted, not the process.
        # What was committed stays committed, exactly once: nothing acknowledged is lost.
        during = await committed_outputs(client, 0, 1)
        assert during[: len(before)] == before
        by_key: dict[str, list[int]] = {}
        for o in during:
            by_key.setdefault(o["key"], []).append(o["count"])
        for key, counts in by_key.items():
            assert counts == list(range(1, len(counts) + 1)), (key, counts)

        # Freed, the shard recovers by itself, in the same process.
        consumer_fs.free()
        assert await group.wait_primary() is consumer
        outputs = await committed_outputs(client, inputs.sent, 90)
        assert_exactly_once(outputs, inputs.sent)
        assert consumer.running()

        # A restart on that data directory recovers it again.
        consumer.kill()
        consumer.start()
        await group.wait_primary()
        assert not any(
            s.code == cpb.ReplicaStatus.FAILED for _m, s in group.replicas(SHARD).values()
        )
        await inputs.publish(100)
        outputs = await committed_outputs(client, inputs.sent, 90)
        assert_exactly_once(outputs, inputs.sent)
