"""Gazette's stream-sum example — its Go `summer` (consumer framework, RocksDB and SQLite
stores on recovery logs, a hot standby per shard) and its Go `chunker` — on three pygazette
brokers at replication 2 (tests/support/gazette_stream_sum.py), small: every stream's sum is
verified by the chunker and is in the sums journal, and neither the chunker's nor the
summers' log shows a response Gazette's client rejected (issue 20: "ReadResponse: invalid
WriteHead" on most reads of busy journals).

The same runs on three of Gazette's brokers (the baseline; both times are printed at the end
of the run). Timed beside each other, larger: `python bench/vs_gazette.py --stream-sum`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.gazette_process import EtcdServer, GazetteBinaries
from tests.support.gazette_stream_sum import Workload, run_stream_sum


@pytest.mark.timeout(300)
@pytest.mark.parametrize("system", ["pygazette", "gazette"])
def test_stream_sum(
    system: str,
    binaries: GazetteBinaries,
    etcd: EtcdServer,
    tmp_path: Path,
    interop_figures: dict[str, Any],
) -> None:
    workload = Workload(workers=4, streams=10, chunks=30)
    result = run_stream_sum(system, binaries, etcd, tmp_path, workload, timeout=180)
    print(json.dumps(result, indent=2))
    interop_figures[f"stream_sum on {system}"] = {
        k: result[k] for k in ("streams", "chunks_per_stream", "seconds", "streams_with_final_sum")
    }
    assert result["streams_with_final_sum"] == workload.total_streams
    for process, scan in result["logs"].items():
        assert scan["validation_errors"] == 0, (process, scan["validation_samples"])
