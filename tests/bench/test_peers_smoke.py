"""`bench/peers.py --quick` end to end: every installed system (pygazette at r=1 and r=3,
Kafka with one and three brokers, NATS JetStream, Redis) starts as a real process, runs a
tiny version of every workload, and the JSON has every figure side by side with
pygazette's ratios; a system is skipped only when its server is not installed."""

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
SYSTEMS = ["pygazette-r1", "pygazette-r3", "kafka-1", "kafka-3", "nats", "redis"]
WORKLOADS = {
    "publish_small": "msgs_per_s",
    "consume_small": "msgs_per_s",
    "publish_large": "mb_per_s",
    "consume_large": "mb_per_s",
}
COMPARED = [*WORKLOADS, "latency_p50", "latency_p99"]


def installed(system: str) -> bool:
    """Whether the system's server can run here (what alone may make the bench skip it)."""
    if system == "pygazette-r3":
        return shutil.which("etcd") is not None
    if system.startswith("kafka"):
        return shutil.which("java") is not None
    if system == "nats":
        return bool(shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin"))
    if system == "redis":
        return shutil.which("redis-server") is not None
    return True


def run_quick(tmp_path: Path) -> tuple[int, dict[str, Any], str]:
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        # Its own process group: whatever happens, no server it started outlives the test.
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "peers.py"), "--quick"],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=840)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    stderr = err_path.read_text(errors="replace")
    try:
        doc = json.loads(out)
    except json.JSONDecodeError:
        pytest.fail(f"bench/peers.py printed no JSON (exit {proc.returncode}):\n{stderr[-5000:]}")
    return proc.returncode, doc, stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_run_of_every_system_has_every_figure(tmp_path: Path) -> None:
    code, doc, stderr = run_quick(tmp_path)
    assert code == 0, stderr[-5000:]
    assert doc["benchmark"] == "peers"
    assert doc["workloads"]["message_bytes"] == 200
    assert doc["workloads"]["large_record_bytes"] == 1 << 20
    systems = doc["systems"]
    assert sorted(systems) == sorted(SYSTEMS)

    ran = []
    for name in SYSTEMS:
        result = systems[name]
        assert "error" not in result, (name, result)
        if "skipped" in result:
            assert not installed(name), f"{name} is installed but was skipped: {result}"
            assert result["skipped"], name
            continue
        ran.append(name)
        assert result["settings"]["durability"], name
        for workload, unit in WORKLOADS.items():
            figures = result[workload]
            assert figures[unit] > 0, (name, workload, figures)
            assert figures["msgs_per_s"] > 0, (name, workload, figures)
        latency = result["latency"]
        assert latency["messages"] > 0, name
        assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"], (name, latency)
    assert "pygazette-r1" in ran and "pygazette-r3" in ran

    comparison = doc["comparison"]
    assert sorted(comparison) == sorted(COMPARED)
    for workload in COMPARED:
        row = comparison[workload]
        assert sorted(row["figures"]) == sorted(SYSTEMS)
        for name in SYSTEMS:
            assert (row["figures"][name] is not None) == (name in ran), (workload, name)
        for ours in ("pygazette-r1", "pygazette-r3"):
            ratios = row["pygazette_over_peer"][ours]
            for peer in SYSTEMS:
                if peer.startswith("pygazette"):
                    continue
                if peer in ran:
                    assert ratios[peer] is not None and ratios[peer] > 0, (workload, ours, peer)
                else:
                    assert ratios[peer] is None

    checks = {t["check"]: t for t in doc["targets"]}
    assert "pygazette-r1 publish_small >= 1.0x kafka-1" in checks
    assert "pygazette-r3 latency p99 <= kafka-3's" in checks
    for check in checks.values():
        assert check["met"] in (True, False, None)
