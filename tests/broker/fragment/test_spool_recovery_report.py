"""Recovery reports what it cut: nothing for a spool that a crash left intact."""

from __future__ import annotations

from pathlib import Path

from pygazette.broker.fragment.spool import Spool
from pygazette.protocol.pb import protocol_pb2 as pb


def test_clean_spool_reports_no_cut(tmp_path: Path) -> None:
    spool = Spool.create(tmp_path, "a/journal", 0, pb.SNAPPY, pb.LabelSet(), sync=False)
    for _ in range(2):
        pending = spool.start_append()
        pending.write(b"x" * 1013 + b"\n")
        spool.commit(pending, None)
    spool.close()
    log_size = spool.log_path.stat().st_size
    recovered, report = Spool.recover(spool.log_path, sync=False)
    assert (report.appends, report.cut_content_bytes, report.cut_log_bytes) == (2, 0, 0)
    assert recovered.end == 2028 and recovered.log_path.stat().st_size == log_size
    recovered.delete()
    spool.delete()
