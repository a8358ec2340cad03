"""Spark reads what Gazette's exactly-once consumers wrote: stream-sum's Go summers publish
their sums in transactions (JSON, the UUID in Go's field "UUID"), with ACK messages; a
`readCommitted` Spark read of the sums journal has exactly the messages pygazette's own
read-committed reader (the message layer's Sequencer) delivers, and no ACK."""

from __future__ import annotations

from pathlib import Path

import pytest

from pygazette.client import SyncJournalClient
from pygazette.message.json_framing import JSONFraming
from pygazette.message.sequencer import Sequencer
from pygazette.message.uuid import ACK_TXN
from tests.support.gazette_process import EtcdServer, GazetteBinaries
from tests.support.gazette_stream_sum import SUMS, StreamSum, Workload
from tests.support.spark_session import new_session

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install '.[spark]')")


def _committed_sums(content: bytes) -> list[tuple[int, ...]]:
    """(ID..., SeqNo, Value) of the committed Sum messages, by the message layer's rules."""
    framing = JSONFraming("UUID")
    frames, used = framing.split(content)
    assert used == len(content)
    envs: list = []
    framing.envelopes(frames, SUMS, 0, envs)
    out: list = []
    Sequencer().sequence(envs, 0, out)
    return sorted(
        (*e.message["ID"], e.message["SeqNo"], e.message["Value"])
        for e in out
        if not (e.clock and e.flags == ACK_TXN)
    )


@pytest.mark.timeout(300)
def test_spark_reads_the_committed_sums_of_gazettes_summers(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    workload = Workload(workers=2, streams=5, chunks=20)
    run = StreamSum("pygazette", binaries, etcd, tmp_path / "stream-sum", workload)
    spark = None
    try:
        run.start()
        run.run_chunker(180)
        broker = run.cluster.endpoints[0]
        with SyncJournalClient(broker) as client:
            content = b"".join(client.read(SUMS))
        expected = _committed_sums(content)
        finals = {e[:-2] for e in expected if e[-2] == workload.chunks + 1}
        assert len(finals) == workload.total_streams  # Every stream's final sum.

        spark = new_session(tmp_path / "faults", tmp_path / "spark")
        df = (
            spark.read.format("gazette")
            .schema("ID array<long>, SeqNo long, Value decimal(20,0)")
            .option("broker", broker)
            .options(journals=SUMS, framing="json", readCommitted="true", uuidField="UUID")
            .option("minPartitions", "3")
            .load()
        )
        rows = sorted((*r.ID, r.SeqNo, int(r.Value)) for r in df.collect())
        assert rows == expected
        every = (
            spark.read.format("gazette")
            .option("broker", broker)
            .options(journals=SUMS, framing="json")
            .load()
            .count()
        )
        assert every > len(rows)  # The ACKs (and any rolled-back sums) are left out.
    finally:
        if spark is not None:
            spark.stop()
        run.stop()
