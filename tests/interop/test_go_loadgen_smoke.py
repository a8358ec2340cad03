"""`bench/vs_gazette.py --go-client --smoke` end to end: the Go load generator
(interop/loadgen, on Gazette's own client package) runs a tiny version of every workload
against Gazette's brokers and pygazette's — one broker (and bare Append RPCs against a
grpc.aio server with no broker behind it), and three brokers at r=2 with the consumer-like
loop — and the JSON has both systems' figures and their ratios, so that the benchmark cannot
rot. The figures of so short a run mean nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ["append_4kib", "append_1mib", "tail_read", "register_latency", "wakeup_latency"]


def py_spy() -> str | None:
    venv = Path(sys.executable).parent / "py-spy"
    return str(venv) if venv.exists() else shutil.which("py-spy")


def run_smoke(tmp_path: Path, extra: list[str]) -> tuple[int, dict[str, Any], str]:
    err_path = tmp_path / "stderr.txt"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "vs_gazette.py"),
        "--go-client",
        "--smoke",
        "--rounds",
        "1",
        "--topologies",
        "single",
        "r2",
        *extra,
    ]
    with open(err_path, "wb") as err:
        # Its own process group: whatever happens, no broker it started outlives the test.
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=540)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    stderr = err_path.read_text(errors="replace")
    try:
        doc = json.loads(out)
    except json.JSONDecodeError:
        pytest.fail(f"vs_gazette.py printed no JSON (exit {proc.returncode}):\n{stderr[-5000:]}")
    return proc.returncode, doc, stderr


@pytest.mark.timeout(600)
def test_go_client_smoke_run_has_both_systems_figures(tmp_path: Path) -> None:
    profile_dir = tmp_path / "profiles"
    extra = ["--py-spy", str(profile_dir)] if py_spy() else []
    code, doc, stderr = run_smoke(tmp_path, extra)
    assert code == 0, stderr[-5000:]
    assert doc["benchmark"] == "vs_gazette --go-client"
    assert doc["topologies"] == {
        "single": {"brokers": 1, "replication": 1},
        "r2": {"brokers": 3, "replication": 2},
    }
    figures = doc["figures"]
    assert sorted(figures["single"]) == sorted([*WORKLOADS, "raw_append_4kib"])
    assert sorted(figures["r2"]) == sorted([*WORKLOADS, "consumer"])
    for topology, workloads in figures.items():
        for workload, metrics in workloads.items():
            for metric, fig in metrics.items():
                where = f"{topology}.{workload}.{metric}"
                assert len(fig["rounds"]["gazette"]) == len(fig["rounds"]["pygazette"]) == 1, where
                if metric == "broker_cpu_s":  # In clock ticks: a tiny run may take none.
                    assert fig["gazette"] >= 0 and fig["pygazette"] >= 0, where
                    continue
                assert fig["gazette"] > 0, where
                assert fig["pygazette"] > 0, where
                assert fig["ratio"] == pytest.approx(
                    fig["pygazette"] / fig["gazette"], rel=0.01, abs=0.001
                )
    # The same bare Append RPCs answered by grpc.aio with no broker behind it.
    raw = figures["single"]["raw_append_4kib"]["appends_per_s"]
    assert raw["grpc_aio"] > 0 and raw["pygazette_vs_grpc_aio"] > 0
    assert len(raw["rounds"]["grpc_aio"]) == 1
    targets = {t["figure"] for t in doc["targets"]}
    assert "r2.wakeup_latency.p99_ms" in targets
    assert "single.append_1mib.mb_per_s" in targets
    if extra:
        # One profile per pygazette broker, summarised by function.
        profiles = doc["py_spy"]["profiles"]
        assert len(profiles["single-round0"]) == 1
        assert len(profiles["r2-round0"]) == 3
