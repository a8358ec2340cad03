"""bench/fragments.py: a direct read (`do_not_proxy`) of a file store's fragments opens them
itself, under the broker's file root, and a direct read that fell back to the broker fails
the run. Without `file_root` every fragment URL failed to open here and was read through
the broker, so the "direct" figure was a proxied read's."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from fragments import load_journal, make_data, read_runs  # noqa: E402

from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_direct_reads_of_a_file_store_are_direct(tmp_path: Path) -> None:
    data = make_data(2)
    spec = pb.JournalSpec(name="bench/read/file", replication=1)
    spec.fragment.length = 512 << 10
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 300
    broker = BrokerProcess(tmp_path / "broker", extra_args=["--retention-interval", "0s"])
    broker.start()
    try:
        asyncio.run(load_journal(broker, spec, data))
        broker.stop()  # Persists every spool: reads come from the store.
        broker.start()
        # Without the broker's file root, the URLs cannot be opened: the run fails.
        with pytest.raises(RuntimeError, match="fell back to the broker"):
            asyncio.run(read_runs(broker, spec.name, len(data), 1))
        figures = asyncio.run(read_runs(broker, spec.name, len(data), 1, broker.file_root))
    finally:
        broker.kill()
    assert figures["direct_mb_s"] > 0 and figures["proxied_mb_s"] > 0
