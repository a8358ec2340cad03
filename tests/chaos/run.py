"""`make chaos`: stream-sum on a 4-broker cluster under a seeded schedule of faults.

    python -m tests.chaos.run [--minutes 10] [--seed 1] [--work DIR] [--keep]

Starts the cluster of `tests.chaos.cluster` (etcd, S3 store behind a proxy, 4 brokers at
replication 3 behind partitioning proxies, 3 summers with a hot standby per shard), then
runs, all at once: 2 chunkers in rounds (`tests.chaos.workload`), ledger writers and
availability probes (`tests.chaos.ledger`), write-head readers on every broker
(`tests.chaos.heads`), a supervisor restarting processes that exit unexpectedly
(`tests.chaos.supervisor`), and the fault schedule (`tests.chaos.faults`) for `--minutes`.
Then the chunkers finish their rounds, the cluster settles, and every acknowledged append
(the ledger's and the chunkers') is read back (`tests.chaos.audit`).

Fault events go to stderr as JSON lines; one JSON report is printed last on stdout: faults
by kind, appends acknowledged, streams verified, mismatches and lost appends (both must be
0), write-head regressions, the longest unavailability window per journal. Exits 1 unless
the run was correct (`ok`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.stream_sum.messages import FINAL_SUMS_JOURNAL
from tests.chaos.audit import audit
from tests.chaos.cluster import (
    ALL_JOURNALS,
    CHUNK_JOURNALS,
    LEDGER_JOURNALS,
    SPARSE_LEDGER_JOURNALS,
    SPARSE_PAUSE,
    ChaosCluster,
)
from tests.chaos.faults import FaultSchedule, Timing
from tests.chaos.heads import HeadMonitor
from tests.chaos.ledger import probe, write_ledger
from tests.chaos.record import Record
from tests.chaos.supervisor import Supervisor
from tests.chaos.workload import ChunkerTotals, RoundParams, read_ack_logs, run_chunker_rounds
from tests.support.broker_process import BrokerProcess

log = logging.getLogger("chaos")

CHUNKERS = ["chunker-0", "chunker-1"]


@dataclass(slots=True)
class ChaosConfig:
    seconds: float = 600.0  # Of faults.
    seed: int = 1
    timing: Timing = field(default_factory=Timing)
    lease_ttl: float = 10.0  # Of brokers and summers: etcd restarts well within it.
    rounds: RoundParams = field(default_factory=RoundParams)
    drain_timeout: float = 600.0  # For the chunkers' last rounds, after the faults.

    @classmethod
    def smoke(cls, seconds: float = 30.0, seed: int = 1) -> ChaosConfig:
        """The short schedule of `make test`: faults every 4-6 s, 6 s outages."""
        return cls(
            seconds=seconds,
            seed=seed,
            timing=Timing(gap=(4.0, 6.0), outage=6.0, restart_delay=(0.5, 1.5), past_lease=1.5),
            lease_ttl=5.0,
            rounds=RoundParams(streams=8, chunks=10, workers=4, timeout=90.0),
            # Leaves time for a broker that lost its lease to an etcd restart, and was
            # restarted by the supervisor, to take its journals back (a slow CI machine).
            drain_timeout=150.0,
        )


async def run_chaos(cfg: ChaosConfig, work: Path) -> dict[str, Any]:
    t_start = time.monotonic()
    cc = ChaosCluster(work, lease_ttl=cfg.lease_ttl)
    try:
        await cc.start()
        setup_s = time.monotonic() - t_start
        return await _run(cfg, cc, work, setup_s)
    except BaseException:
        print(cc.logs(), file=sys.stderr)
        raise
    finally:
        await cc.stop()


async def _run(cfg: ChaosConfig, cc: ChaosCluster, work: Path, setup_s: float) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    record = Record()
    lb = cc.broker_lb.url
    stop_load = asyncio.Event()
    stop_watch = asyncio.Event()
    procs: dict[str, BrokerProcess] = {b.suffix: b for b in cc.brokers}
    procs.update({c.member_id: c for c in cc.consumers})
    supervisor = Supervisor(procs)
    heads = HeadMonitor(record)
    readers = {"balancer": lb} | {b.suffix: f"http://127.0.0.1:{b.port}" for b in cc.brokers}
    totals = ChunkerTotals()

    watchers = [
        asyncio.create_task(supervisor.run(stop_watch)),
        asyncio.create_task(heads.watch(readers, ALL_JOURNALS, stop_watch)),
        asyncio.create_task(probe(lb, [*CHUNK_JOURNALS, FINAL_SUMS_JOURNAL], record, stop_watch)),
    ]
    ledgers = [
        asyncio.create_task(
            write_ledger(lb, j, record, stop_load, random.Random(rng.getrandbits(64)))
        )
        for j in LEDGER_JOURNALS
    ] + [
        asyncio.create_task(
            write_ledger(
                lb, j, record, stop_load, random.Random(rng.getrandbits(64)), pause=SPARSE_PAUSE
            )
        )
        for j in SPARSE_LEDGER_JOURNALS
    ]
    chunkers = [
        asyncio.create_task(
            run_chunker_rounds(
                name,
                lb,
                cc.consumer_lb.url,
                cfg.seed * 100 + i,
                work,
                cfg.rounds,
                totals,
                stop_load,
            )
        )
        for i, name in enumerate(CHUNKERS)
    ]
    schedule = FaultSchedule(cc, supervisor, cfg.seed, cfg.timing, work / "faults.jsonl")
    drained = True
    try:
        t_faults = time.monotonic()
        await schedule.run(cfg.seconds)
        fault_s = time.monotonic() - t_faults
        record.close_windows()  # The writers stop now: count a window still open.
        stop_load.set()
        acks = await asyncio.gather(*ledgers)
        ledger_acks = sum(acks[: len(LEDGER_JOURNALS)])
        sparse_acks = sum(acks[len(LEDGER_JOURNALS) :])
        try:
            async with asyncio.timeout(cfg.drain_timeout):
                await asyncio.gather(*chunkers)
        except TimeoutError:
            drained = False
        settled = True
        try:
            await cc.wait_ready(within=120)
        except AssertionError as exc:
            settled = False
            print(f"chaos: the cluster did not settle: {exc}"[:20000], file=sys.stderr)
    finally:
        stop_load.set()
        stop_watch.set()
        for t in [*ledgers, *chunkers]:
            t.cancel()
        await asyncio.gather(*watchers, *ledgers, *chunkers, return_exceptions=True)

    chunk_acks = list(read_ack_logs(work, CHUNKERS))
    result = await audit(lb, [*record.acks, *chunk_acks])
    faults = dict(schedule.counts)
    report: dict[str, Any] = {
        "seed": cfg.seed,
        "fault_seconds": round(fault_s, 1),
        "setup_seconds": round(setup_s, 1),
        "faults": faults,
        "faults_total": sum(faults.values()),
        "faults_by_action": dict(schedule.by_action),
        "fault_errors": schedule.errors,
        "appends_acknowledged": len(record.acks) + len(chunk_acks),
        "appends_acknowledged_by": {
            "ledger": ledger_acks,
            "sparse_ledger": sparse_acks,
            "chunkers": len(chunk_acks),
        },
        "appends_audited": result.appends,
        "bytes_audited": result.bytes_read,
        "streams_verified": totals.verified,
        "streams": totals.streams,
        "chunks": totals.chunks,
        "chunker_rounds": totals.rounds,
        "chunker_failed_rounds": totals.failed_rounds,
        "chunkers_drained": drained,
        "cluster_settled": settled,
        "mismatches": totals.mismatches,
        "duplicate_sums": totals.duplicates,
        "missing_sums": totals.missing,
        "late_sums": totals.late,
        "lost_appends": result.lost,
        "head_reads": heads.reads,
        "head_regressions": heads.regressions,
        "heads_behind_acks": heads.behind_acks,
        "unexpected_exits": [{k: v for k, v in e.items() if k != "log"} for e in supervisor.exits],
        # A broker stopped with SIGTERM must drain and exit 0, in time.
        "graceful_exit_failures": [e for e in schedule.errors if e["fault"] == "sigterm_broker"],
        "max_unavailability_s": {
            j: round(record.max_gap.get(j, 0.0), 1)
            for j in [*CHUNK_JOURNALS, FINAL_SUMS_JOURNAL, *LEDGER_JOURNALS]
        },
    }
    report["ok"] = (
        report["mismatches"] == 0
        and report["lost_appends"] == 0
        and report["duplicate_sums"] == 0
        and report["missing_sums"] == 0
        and report["chunker_failed_rounds"] == 0
        and report["head_regressions"] == 0
        and report["heads_behind_acks"] == 0
        and not report["graceful_exit_failures"]
        and not record.anomalies
        and drained
        and report["streams_verified"] == report["streams"] > 0
    )
    report["long_unavailability_windows"] = record.windows[:40]
    if record.anomalies:
        report["anomalies"] = record.anomalies[:20]
    if result.problems:
        report["audit_problems"] = result.problems
    if totals.failures:
        report["chunker_failures"] = totals.failures[:5]
    if supervisor.exits:
        report["exit_logs"] = [e.get("log", "")[-800:] for e in supervisor.exits[:3]]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of faults")
    parser.add_argument("--seed", type=int, default=None, help="fault schedule seed")
    parser.add_argument("--work", default="", help="work directory [default: a new temp dir]")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--smoke", action="store_true", help="the short schedule of `make test` (ignores --minutes)"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="pygazette-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        cfg = ChaosConfig.smoke(seed=seed)
    else:
        cfg = ChaosConfig(seconds=args.minutes * 60, seed=seed)
    print(f"chaos: seed {seed}, {args.minutes:g} minutes of faults, in {work}", file=sys.stderr)
    report: dict[str, Any] = {}
    try:
        report = asyncio.run(run_chaos(cfg, work))
    except KeyboardInterrupt:
        return 130
    finally:
        if report.get("ok") and not args.keep:
            with contextlib.suppress(OSError):
                shutil.rmtree(work)
        else:
            print(f"chaos: work directory kept: {work}", file=sys.stderr)
    print(json.dumps(report, indent=2), flush=True)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
