"""Gazette's stream-sum example (go.gazette.dev/core v0.103.0, built by
interop/build-stream-sum) on three brokers — Gazette's or pygazette's — on etcd.

Gazette's `summer` consumers (its consumer framework; RocksDB and SQLite stores, alternating
by shard as Gazette's own deployment does, each on a recovery log; one hot standby per
shard) sum the chunks that Gazette's `chunker` writes to the chunk partitions; the chunker
reads the final sums back and verifies every stream (it exits non-zero on a wrong or late
sum). Journals and shards are applied with the released `gazctl`, as in Gazette's
kustomize deployment (examples.journalspace.yaml, generate-shards.sh), scaled down.

`run_stream_sum` deploys one system, times the chunker from start to exit (every stream
verified), counts the streams whose final sum is in `examples/stream-sum/sums`, and scans
the chunker's and summers' logs for responses Gazette's client rejected.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.broker_cluster import BrokerCluster
from tests.support.gazette_process import EtcdServer, GazetteBinaries
from tests.support.listening_process import start_listening

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "interop" / "build-stream-sum"
SUMS = "examples/stream-sum/sums"

# What in a Go client's log says it rejected a response (broker/protocol's validation
# errors, as the Reader and Appender report them), or that a checking pygazette broker
# (PYGAZETTE_CHECK_RESPONSES=1) refused to send one.
VALIDATION = re.compile(
    r"ReadResponse: |AppendResponse: |validating broker response|invalid WriteHead|"
    r"ListResponse: |ApplyResponse: |FragmentsResponse: |response failed validation"
)
RETRY = re.compile(r"\(will retry\)")


@dataclass(frozen=True)
class Workload:
    workers: int = 4  # Chunker workers; each writes `streams` streams.
    streams: int = 50
    chunks: int = 100
    partitions: int = 4
    replication: int = 2
    summers: int = 2

    @property
    def total_streams(self) -> int:
        return self.workers * self.streams


def stream_sum_binaries(bin_dir: Path | None = None) -> tuple[Path, Path]:
    """Build (once; later calls return at once) and locate `summer` and `chunker`."""
    bin_dir = Path(bin_dir or os.environ.get("INTEROP_BIN") or REPO / "interop" / "bin")
    proc = subprocess.run(
        [str(BUILD_SCRIPT)],
        env=dict(os.environ, INTEROP_BIN=str(bin_dir)),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"interop/build-stream-sum failed:\n{proc.stderr[-4000:]}")
    return bin_dir / "summer", bin_dir / "chunker"


def journal_specs(w: Workload) -> str:
    parts = "\n".join(
        f"          - name: examples/stream-sum/chunks/part-{i:03d}" for i in range(w.partitions)
    )
    logs = "\n".join(
        f"          - name: examples/stream-sum/recovery-logs/chunks-part-{i:03d}"
        for i in range(w.partitions)
    )
    return f"""name: examples/
replication: {w.replication}
fragment:
  length: 268435456
  stores: ["file:///"]
  refresh_interval: 1m0s
  compression_codec: SNAPPY
children:
  - name: examples/stream-sum/
    children:
      - name: examples/stream-sum/chunks/
        labels:
          - name: app.gazette.dev/message-type
            value: stream_sum.Chunk
          - name: content-type
            value: application/x-ndjson
        children:
{parts}
      - name: examples/stream-sum/recovery-logs/
        labels:
          - name: content-type
            value: application/x-gazette-recoverylog
        children:
{logs}
      - name: {SUMS}
        labels:
          - name: app.gazette.dev/message-type
            value: stream_sum.Sum
          - name: content-type
            value: application/x-ndjson
"""


def shard_specs(w: Workload, hint_prefix: str) -> str:
    stores = ("rocksdb", "sqlite")
    shards = "\n".join(
        f"""- id: chunks-part-{i:03d}
  sources: [journal: examples/stream-sum/chunks/part-{i:03d}]
  labels:
    - name: store
      value: {stores[i % 2]}"""
        for i in range(w.partitions)
    )
    return f"""common:
  recovery_log_prefix: examples/stream-sum/recovery-logs
  hint_prefix: {hint_prefix}
  hint_backups: 2
  max_txn_duration: 1s
  hot_standbys: 1
shards:
{shards}
"""


def _run(cmd: list[str], stdin: str = "", timeout: float = 120) -> str:
    proc = subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} {cmd[1:3]} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def _scan(text: str) -> dict[str, Any]:
    lines = text.splitlines()
    rejected = [ln for ln in lines if VALIDATION.search(ln)]
    retries = Counter(
        m.group(1)
        for ln in lines
        if RETRY.search(ln) and (m := re.search(r'msg="([^"]*)"', ln)) is not None
    )
    return {
        "validation_errors": len(rejected),
        "validation_samples": rejected[:3],
        "retry_warnings": dict(retries),
    }


class StreamSum:
    """One deployment: a cluster of `system`'s brokers, summers, journals and shards."""

    def __init__(
        self,
        system: str,
        gazette: GazetteBinaries,
        etcd: EtcdServer,
        work: Path,
        workload: Workload,
    ) -> None:
        self.summer_bin, self.chunker_bin = stream_sum_binaries(gazette.gazette.parent)
        self.gazctl = gazette.gazctl
        self.etcd = etcd
        self.work = work
        self.w = workload
        self.cluster = BrokerCluster(system, gazette, etcd, work / "brokers", "/stream-sum")
        self.consumer_prefix = f"/stream-sum-consumers/{uuid.uuid4().hex[:8]}"
        self.summers: list[subprocess.Popen[bytes]] = []
        self.summer_ports: list[int] = []
        self.summer_logs: list[Path] = []
        self.chunker_log = work / "chunker.log"

    def start(self) -> None:
        self.cluster.start()
        broker = self.cluster.endpoints[0]
        _run(
            [str(self.gazctl), "journals", "apply", f"--broker.address={broker}", "--specs=-"],
            journal_specs(self.w),
        )
        for i in range(self.w.summers):
            log = self.work / f"summer-{i}.log"
            # Gazette's RocksDB stores live in os.MkdirTemp dirs, which a SIGKILLed summer
            # never removes: under the run's own directory, they go with it (in /tmp they
            # piled up, ~76 MB a shard a run).
            tmp = self.work / f"summer-{i}-tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            # On a free port, waited for until it listens; again on another if it was taken.
            proc, port = start_listening(
                lambda port, i=i: [
                    str(self.summer_bin),
                    "serve",
                    "--consumer.zone=local",
                    "--consumer.host=127.0.0.1",
                    f"--consumer.port={port}",
                    f"--consumer.id=summer-{i}",
                    f"--broker.address={self.cluster.endpoints[i % 3]}",
                    "--broker.cache.size=256",
                    f"--broker.file-root={self.cluster.store}",
                    f"--etcd.address={self.etcd.url}",
                    f"--etcd.prefix={self.consumer_prefix}",
                    "--etcd.lease=3s",
                    "--log.level=info",
                ],
                log,
                env={**os.environ, "TMPDIR": str(tmp)},
                timeout=60,
                what=f"summer-{i}",
            )
            self.summers.append(proc)
            self.summer_ports.append(port)
            self.summer_logs.append(log)
        consumer = self._consumer_address()
        _run(
            [
                str(self.gazctl),
                "shards",
                "apply",
                f"--consumer.address={consumer}",
                f"--broker.address={broker}",
                "--specs=-",
            ],
            shard_specs(self.w, f"/stream-sum-hints/{uuid.uuid4().hex[:8]}"),
        )
        self._wait_primaries(consumer)

    def _consumer_address(self, within: float = 60) -> str:
        """The first summer's address, once it serves (it has joined etcd)."""
        deadline = time.monotonic() + within
        address = f"http://127.0.0.1:{self.summer_ports[0]}"
        while True:
            for p, log in zip(self.summers, self.summer_logs, strict=True):
                if p.poll() is not None:
                    raise RuntimeError(f"summer exited {p.returncode}:\n{log.read_text()[-3000:]}")
            proc = subprocess.run(
                [str(self.gazctl), "shards", "list", f"--consumer.address={address}"],
                capture_output=True,
                timeout=30,
                check=False,
            )
            if proc.returncode == 0:
                return address
            if time.monotonic() > deadline:
                raise TimeoutError(f"summer does not serve:\n{proc.stderr[-2000:]!r}")
            time.sleep(0.1)

    def _wait_primaries(self, consumer: str, within: float = 60) -> None:
        """Until every shard has a primary that has finished recovery (status PRIMARY)."""
        deadline = time.monotonic() + within
        while True:
            out = _run(
                [str(self.gazctl), "shards", "list", f"--consumer.address={consumer}", "-o", "json"]
            )
            shards = json.loads(out).get("shards", []) if out.strip() else []
            ready = 0
            for s in shards:
                route = s.get("route", {})
                primary = route.get("primary", -1)
                statuses = s.get("status", [])
                if primary >= 0 and primary < len(statuses):
                    if statuses[primary].get("code") == "PRIMARY":
                        ready += 1
            if ready == self.w.partitions:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ready} of {self.w.partitions} shards primary:\n{out[-3000:]}")
            time.sleep(0.1)

    def run_chunker(self, timeout: float) -> float:
        """Run the chunker to its end; its wall time (it verified every stream)."""
        cmd = [
            str(self.chunker_bin),
            "run",
            "--chunker.zone=local",
            f"--chunker.streams={self.w.streams}",
            f"--chunker.chunks={self.w.chunks}",
            f"--chunker.workers={self.w.workers}",
            f"--broker.address={self.cluster.endpoints[0]}",
            "--broker.cache.size=256",
            "--log.level=info",
        ]
        started = time.monotonic()
        with open(self.chunker_log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                raise TimeoutError(
                    f"chunker ran over {timeout} s:\n{self.chunker_log.read_text()[-3000:]}"
                ) from None
        elapsed = time.monotonic() - started
        if code != 0:
            raise RuntimeError(f"chunker exited {code}:\n{self.chunker_log.read_text()[-3000:]}")
        return elapsed

    def final_sums(self) -> int:
        """Streams whose final sum (SeqNo = chunks + 1) is in the sums journal."""
        out = _run(
            [
                str(self.gazctl),
                "journals",
                "read",
                f"--broker.address={self.cluster.endpoints[0]}",
                "-l",
                f"name={SUMS}",
            ]
        )
        done = set()
        for line in out.splitlines():
            if line.startswith("{"):
                msg = json.loads(line)
                if msg.get("SeqNo") == self.w.chunks + 1:
                    done.add(tuple(msg["ID"]))
        return len(done)

    def logs(self) -> dict[str, Any]:
        return {
            "chunker": _scan(self.chunker_log.read_text(errors="replace")),
            "summers": _scan("\n".join(p.read_text(errors="replace") for p in self.summer_logs)),
        }

    def stop(self) -> None:
        for p in self.summers:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)
        self.cluster.kill()


def run_stream_sum(
    system: str,
    gazette: GazetteBinaries,
    etcd: EtcdServer,
    work: Path,
    workload: Workload,
    timeout: float = 600,
) -> dict[str, Any]:
    """Deploy `system`, run the chunker to its end and report (see the module docstring)."""
    work.mkdir(parents=True, exist_ok=True)
    run = StreamSum(system, gazette, etcd, work, workload)
    started = time.monotonic()
    try:
        run.start()
        setup = time.monotonic() - started
        cpu_before = run.cluster.cpu_seconds()
        seconds = run.run_chunker(timeout)
        broker_cpu = run.cluster.cpu_seconds() - cpu_before
        verified = run.final_sums()
        logs = run.logs()
    except BaseException:
        for p in [run.chunker_log, *run.summer_logs]:
            if p.exists():
                print(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}")
        print(run.cluster.logs())
        raise
    finally:
        run.stop()
    return {
        "system": system,
        "brokers": len(run.cluster.brokers),
        "replication": workload.replication,
        "partitions": workload.partitions,
        "summers": workload.summers,
        "streams": workload.total_streams,
        "chunks_per_stream": workload.chunks,
        "setup_s": round(setup, 3),
        "seconds": round(seconds, 3),
        "streams_per_s": round(workload.total_streams / seconds, 3),
        "broker_cpu_s": round(broker_cpu, 2),  # All brokers' CPU while the chunker ran.
        "streams_with_final_sum": verified,
        "logs": logs,
    }
