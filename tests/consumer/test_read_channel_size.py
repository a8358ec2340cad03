"""A shard's `read_channel_size` bounds the messages read ahead of its transactions, as
Gazette's read channel does (a spec sets it small when messages are large, to bound memory).

The real `ShardReplica` runs the `Counter` app against a real broker, in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pygazette.client import JournalClient
from pygazette.consumer import replica as replica_module
from pygazette.consumer.replica import ShardReplica
from pygazette.consumer.source_reader import SourceBatch, SourceReaders
from pygazette.keyspace.keyspace import KeyValue
from tests.consumer.test_consumer_cluster import (
    SHARD,
    Inputs,
    assert_exactly_once,
    committed_outputs,
    shard_spec,
)
from tests.consumer.test_replica_recovery import _Harness, client  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


class _Recorded(SourceReaders):
    """SourceReaders that remember themselves and the most messages they ever queued."""

    made: list[_Recorded] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.most_queued = 0
        _Recorded.made.append(self)

    async def _put(self, batch: SourceBatch) -> None:
        await super()._put(batch)
        self.most_queued = max(self.most_queued, self._queued)


async def test_read_channel_size_bounds_the_messages_read_ahead(
    tmp_path: Path,
    client: JournalClient,  # noqa: F811 (fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replica_module, "SourceReaders", _Recorded)
    _Recorded.made = []
    h = _Harness(tmp_path, client)
    spec = shard_spec(standbys=0)
    spec.read_channel_size = 16
    assignment = KeyValue(f"/assignments/{SHARD}#local#0", b"", 1, 1)
    replica = ShardReplica(h.ctx, spec, assignment, h.report)
    replica.update(spec, assignment, 0, [])
    try:
        await h.wait(lambda: replica.is_primary)
        inputs = Inputs(client)
        await inputs.publish(600)
        assert_exactly_once(await committed_outputs(client, inputs.sent, 60), inputs.sent)
    finally:
        await replica.stop()
    (readers,) = _Recorded.made
    # It was 4,096 messages whatever the spec said (and batches of 1,024).
    assert readers.queue_messages == 16
    assert readers.batch_messages <= 16
    assert readers.most_queued <= 16
