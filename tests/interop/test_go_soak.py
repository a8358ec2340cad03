"""Gazette's own client under concurrency against three brokers at replication 3
(interop/soak via tests/support/go_soak.py): appenders (client.Append and AppendService) and
blocking RetryReaders at the head of the same journals — some starting new Reads all the
time — first steady, then with a broker SIGKILLed mid-run and restarted (after which late
readers read every journal from it: a replica serving content it lost).

Gazette's client validates every response; a response it rejects (e.g. "ReadResponse:
invalid WriteHead", the bug of issue 20) is counted, as is a stream a broker aborted rather
than send one (PYGAZETTE_CHECK_RESPONSES=1, which the test suite sets: INTERNAL "response
failed validation"), and every retried Read and Append.
Expected: no rejected response in either phase, no retry in the steady phase and none before
the kill, and every record each reader read exactly once and in order (a record whose append
was retried may appear twice in a row: its first attempt may have committed too).

The same test runs against three of Gazette's brokers: the baseline, and the proof that what
the soak expects is what Gazette itself does. Both systems' figures are printed at the end
of the run; `python -m tests.support.go_soak` prints all of both as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.gazette_process import EtcdServer, GazetteBinaries
from tests.support.go_soak import soak_system, summary

PHASE_SECONDS = 6.0  # Each phase (steady, kill) of each system; make test runs all four.


def assert_clean(phase: dict[str, Any], name: str) -> None:
    assert phase["validation_errors"]["total"] == 0, (
        f"{name}: responses rejected by Gazette's client or refused by the broker: "
        f"{phase['validation_errors']}, e.g. "
        f"{phase['validation_samples']}"
    )
    for op in ("read", "append"):
        # INTERNAL: a broker bug (e.g. a response it refused to send, counted above).
        errors = phase[op]["stream_errors"]
        assert "grpc_internal" not in errors, f"{name}: {op} streams ended {errors}"
    check = phase["check"]
    assert check["exactly_once_in_order"], f"{name}: {check}"
    assert phase["records_acked"] > 0, name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("system", ["pygazette", "gazette"])
def test_gazette_client_soak(
    system: str,
    binaries: GazetteBinaries,
    etcd: EtcdServer,
    tmp_path: Path,
    interop_figures: dict[str, Any],
) -> None:
    runs = soak_system(system, binaries, etcd, tmp_path, PHASE_SECONDS)
    figures = {p: summary(r) for p, r in runs.items()}
    interop_figures[f"go_soak on {system}, {PHASE_SECONDS:g} s a phase"] = figures
    print(json.dumps(runs, indent=2))
    steady, kill = runs["steady"], runs["kill"]

    assert_clean(steady, "steady")
    assert steady["read"]["retries"] == 0, steady["read"]
    assert steady["append"]["retries"] == 0, steady["append"]
    assert steady["client_warnings"] == {}, steady["client_warnings"]
    # The hopping readers did start Reads at the head while appends were in flight.
    assert steady["read"]["hopper_rpcs"] > 0

    assert "restart_error" not in kill, kill["restart_error"]
    assert kill["killed_at_s"] is not None, "the soak did not get to kill the broker"
    # Late readers read each journal from the restarted broker, from its start.
    assert kill["late_readers"] == {"readers": 4}, kill["late_readers"]
    assert_clean(kill, "kill")
    for op in ("read", "append"):
        times = kill[op]["retry_times"]
        assert times.get("before_kill", 0) == 0, f"{op} retries before the kill: {times}"
