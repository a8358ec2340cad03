"""The Go soak (interop/soak) on a real cluster: three brokers, Gazette's or pygazette's, on
etcd at replication 3, driven by Gazette's own client under concurrency — first steady, then
with one broker SIGKILLed mid-run (the soak kills it; this harness restarts it, as a
supervisor would, once it is dead).

`soak_system` runs both phases on one system and returns the soak's JSON for each; `main`
runs both systems and prints one JSON document:

    python -m tests.support.go_soak [--duration 10] [--systems pygazette gazette]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.broker_cluster import SYSTEMS, Broker, BrokerCluster
from tests.support.gazette_process import EtcdServer, GazetteBinaries, gazette_binaries

REPO = Path(__file__).resolve().parents[2]
SOAK_BUILD = REPO / "interop" / "soak" / "build"


def soak_binary() -> Path:
    """Build (once; later calls return at once) and locate interop/bin/soak."""
    proc = subprocess.run(
        [str(SOAK_BUILD)], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"interop/soak/build failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _pid(broker: Broker) -> int:
    assert broker.proc is not None
    return broker.proc.pid


def run_soak(
    binary: Path, cluster: BrokerCluster, phase: str, duration: float, victim: Broker | None
) -> dict[str, Any]:
    """One phase: the soak against the cluster; with `victim`, the soak kills it a third of
    the way in and this restarts it once it is dead; once the appenders stop, late readers
    read every journal from it (a replica that lost what it held)."""
    cmd = [
        str(binary),
        f"-brokers={','.join(cluster.endpoints)}",
        "-replication=3",
        f"-prefix=soak/{phase}/",
        f"-duration={duration}s",
        f"-file-root={cluster.store}",
    ]
    if victim is not None:
        cmd += [
            f"-kill-pid={_pid(victim)}",
            f"-kill-after={duration / 3:.3f}s",
            f"-victim={victim.url}",
        ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    restart_error: list[BaseException] = []

    def supervise() -> None:
        assert victim is not None and victim.proc is not None
        try:
            victim.proc.wait(duration + 120)  # Killed by the soak.
            victim.start(60.0)
        except BaseException as exc:  # Reported with the phase's result.
            restart_error.append(exc)

    supervisor = None
    if victim is not None:
        supervisor = threading.Thread(target=supervise, daemon=True)
        supervisor.start()
    try:
        out, err = proc.communicate(timeout=duration + 180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if supervisor is not None:
        supervisor.join(90)
    if proc.returncode != 0:
        raise RuntimeError(
            f"soak ({cluster.system}, {phase}) exited {proc.returncode}:\n"
            f"{err.decode(errors='replace')[-4000:]}\n{cluster.logs()}"
        )
    result: dict[str, Any] = json.loads(out)
    if restart_error:
        result["restart_error"] = repr(restart_error[0])
    return result


def soak_system(
    system: str, binaries: GazetteBinaries, etcd: EtcdServer, work: Path, duration: float
) -> dict[str, Any]:
    """Both phases on a fresh cluster of `system`: steady, then one broker killed."""
    binary = soak_binary()
    cluster = BrokerCluster(system, binaries, etcd, work, "/soak")
    cluster.start()
    try:
        steady = run_soak(binary, cluster, "steady", duration, None)
        # Not the broker the soak's clients dial first (the soak's default address).
        killed = run_soak(binary, cluster, "kill", duration, cluster.brokers[2])
    finally:
        cluster.kill()
    return {"steady": steady, "kill": killed}


def summary(phase: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader compares: errors, retries, the exactly-once check, throughput."""
    return {
        "validation_errors": phase["validation_errors"]["total"],
        "read_retries": phase["read"]["retries"],
        "append_retries": phase["append"]["retries"],
        "exactly_once_in_order": phase["check"]["exactly_once_in_order"],
        "records_acked": phase["records_acked"],
        "records_per_s": phase["records_per_s"],
        "drain_s": phase["drain_s"],
    }


def soak_both(duration: float, systems: list[str] | tuple[str, ...] = SYSTEMS) -> dict[str, Any]:
    """Both phases on each system, one etcd: the JSON document `main` prints."""
    binaries = gazette_binaries()
    with tempfile.TemporaryDirectory(prefix="pygazette-go-soak-") as tmp:
        etcd = EtcdServer(binaries.etcd, Path(tmp) / "etcd" / "data")
        etcd.data_dir.parent.mkdir(parents=True)
        etcd.start()
        try:
            runs = {s: soak_system(s, binaries, etcd, Path(tmp) / s, duration) for s in systems}
        finally:
            etcd.stop()
    return {
        "benchmark": "go_soak",
        "baseline": "Gazette's brokers (go.gazette.dev/core v0.103.0), same run",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds_per_phase": duration,
        "summary": {s: {p: summary(r) for p, r in phases.items()} for s, phases in runs.items()},
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS), choices=SYSTEMS)
    args = parser.parse_args()
    json.dump(soak_both(args.duration, args.systems), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
