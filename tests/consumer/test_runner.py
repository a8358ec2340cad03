"""The consumer process (`consumer/runner.py`) on a real broker: what it finds in its data
directory when it starts."""

from __future__ import annotations

from pathlib import Path

from pygazette.consumer.replica import SHARDS_DIR
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess


def test_shard_directories_an_earlier_process_left_are_removed_at_start(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    """A killed consumer leaves its shards' local stores behind, under names no later
    assignment takes (they change with each assignment): a new process removes them as it
    starts, and nothing else of its data directory."""
    data = tmp_path / "consumer"
    stale = data / SHARDS_DIR / "a%2Fshard-12"
    stale.mkdir(parents=True)
    (stale / "store.sqlite").write_bytes(b"x" * 4096)
    (data / "keep.me").write_bytes(b"the operator's\n")
    proc = ConsumerProcess(data, app="tests.consumer.apps:Counter", broker=broker.url)
    proc.start()
    try:
        assert not (data / SHARDS_DIR).exists()
        assert (data / "keep.me").read_bytes() == b"the operator's\n"
    finally:
        proc.kill()
