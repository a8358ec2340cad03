"""Benchmark: pygazette against the released Gazette broker (Go), in the same run.

The workloads of `bench/append_read.py` — 1 MiB appends (throughput), 4 KiB appends (commit
latency), a read of spooled content and a read of persisted fragments — run against a
pygazette broker and against Gazette's own broker (with etcd, built by
interop/build-binaries), each on a fresh data directory, one after the other, in `--rounds`
rounds (2 by default) that alternate which system goes first, so that load from other
processes that comes and goes does not weigh on one system only. Each figure is the median
over the rounds (every round's is listed), with pygazette/Gazette ratios (above 1:
pygazette is faster, or for latencies, slower), and beside it the CPU time the broker
process spent on each workload (per append, or per GB read), which the machine's other load
disturbs far less.

    python bench/vs_gazette.py [--quick] [--rounds 2]

With `--go-client` both brokers are driven by Gazette's own Go client instead
(`bench/gazette_go_client.py`, `interop/loadgen`): single broker and 3 brokers at r=2 and r=3,
appends, tail reads, register-checked and append → blocking-read latencies, a consumer-like
loop; `--rounds`, `--topologies`, `--workloads`, `--py-spy DIR`.

    python bench/vs_gazette.py --go-client [--quick] [--rounds 2]

With `--stream-sum`, Gazette's own stream-sum example (Go summer and chunker,
tests/support/gazette_stream_sum.py) runs on three brokers of each system at r=2: the
chunker's time from start to exit (every stream verified), Gazette's time over
pygazette's (`speed_vs_gazette`; issue 20's target is at least 0.5), and the brokers' CPU
seconds meanwhile. `--streams` per chunker
worker (4 workers), `--chunks` per stream, `--rounds` (systems alternate which goes first).

    python bench/vs_gazette.py --stream-sum [--streams 50] [--chunks 100] [--rounds 1]

With `--go-soak`, the Go soak (interop/soak, tests/support/go_soak.py): Gazette's client
under concurrency on three brokers of each system at r=3, steady and with a broker killed;
rejected responses, retries, the exactly-once check and throughput. `--soak-seconds`.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from append_read import (  # noqa: E402
    OPTIONS,
    MiB,
    append_once,
    append_run,
    ratio,
    read_run,
    spec,
)

from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402
from tests.support.gazette_process import (  # noqa: E402
    EtcdServer,
    GazetteBinaries,
    GazetteBroker,
    gazette_binaries,
)
from tests.support.process_cpu import cpu_seconds  # noqa: E402

GAZETTE_VERSION = "go.gazette.dev/core v0.103.0"


async def wait_assigned(stub: pb_grpc.JournalStub, names: list[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        routes = {
            j.spec.name: j.route.primary
            async for r in stub.List(pb.ListRequest())
            for j in r.journals
        }
        if all(routes.get(n, -1) >= 0 for n in names):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("journals not assigned")


async def workloads(address: str, sizes: tuple[int, int, int, int], pid: int) -> dict[str, Any]:
    """Every workload against the broker at `address` (process `pid`, whose CPU each workload
    is charged)."""
    n_big, n_small, read_mib, persist_mib = sizes
    cpu: dict[str, float] = {}

    async def metered(name: str, run: Any) -> Any:
        before = cpu_seconds(pid)
        result = await run
        cpu[name] = cpu_seconds(pid) - before
        return result

    async with grpc.aio.insecure_channel(address, options=OPTIONS) as channel:
        stub = pb_grpc.JournalStub(channel)
        persisted_spec = spec("bench/persisted", 16 * MiB, pb.NONE)
        persisted_spec.fragment.refresh_interval.seconds = 1  # Learn of persisted fragments.
        specs = [
            spec("bench/tail", 1 << 34, pb.NONE),
            spec("bench/small", 1 << 34, pb.NONE),
            persisted_spec,
        ]
        await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in specs]))
        await wait_assigned(stub, [s.name for s in specs])

        # (append_run's 20 warm-up appends are charged too: 7% of the quick 4 KiB run.)
        big = await metered("big", append_run(stub, "bench/tail", MiB, n_big))
        small = await metered("small", append_run(stub, "bench/small", 4096, n_small))
        tail_read = await metered("tail_read", read_run(stub, "bench/tail", 0, read_mib * MiB))

        chunk = os.urandom(MiB)
        for _ in range(persist_mib):
            await append_once(stub, "bench/persisted", chunk)
        await append_once(stub, "bench/persisted", b"roll\n")  # Gazette rolls on an append.
        deadline = time.monotonic() + 120
        while True:  # Until every full fragment is listed as persisted.
            resp = await stub.ListFragments(pb.FragmentsRequest(journal="bench/persisted"))
            stored = [f.spec for f in resp.fragments if f.spec.backing_store]
            if sum(f.end - f.begin for f in stored) >= (persist_mib - 16) * MiB:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("fragments were not persisted")
            await asyncio.sleep(0.1)
        persisted_end = max(f.end for f in stored)
        persisted_read = await metered(
            "persisted_read", read_run(stub, "bench/persisted", 0, persisted_end)
        )
    warm = min(20, n_big), min(20, n_small)
    return {
        "big": big,
        "small": small,
        "tail_read": tail_read,
        "persisted_read": persisted_read,
        "broker_cpu_ms_per_append_1mib": round(cpu["big"] * 1e3 / (n_big + warm[0]), 3),
        "broker_cpu_ms_per_append_4kib": round(cpu["small"] * 1e3 / (n_small + warm[1]), 3),
        "broker_cpu_s_per_gb_tail_read": round(cpu["tail_read"] * 1e9 / (read_mib * MiB), 3),
        "broker_cpu_s_per_gb_persisted_read": round(cpu["persisted_read"] * 1e9 / persisted_end, 3),
    }


async def main(quick: bool, rounds: int = 2) -> dict[str, object]:
    sizes = (50, 500, 64, 48) if quick else (300, 3000, 256, 128)
    binaries = gazette_binaries()
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-vs-gazette-"))
    try:
        return await run_both(binaries, tmp, sizes, rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run_pygazette(tmp: Path, sizes: tuple[int, int, int, int]) -> dict[str, Any]:
    ours = BrokerProcess(tmp / "data")
    ours.data_dir.parent.mkdir(parents=True)
    ours.start()
    try:
        assert ours.proc is not None
        return await workloads(ours.address, sizes, ours.proc.pid)
    finally:
        ours.stop()


async def run_gazette(
    binaries: GazetteBinaries, tmp: Path, sizes: tuple[int, int, int, int]
) -> dict[str, Any]:
    etcd = EtcdServer(binaries.etcd, tmp / "etcd" / "data")
    etcd.data_dir.parent.mkdir(parents=True)
    etcd.start()
    theirs = GazetteBroker(binaries.gazette, etcd, tmp / "gazette")
    try:
        theirs.start()
        assert theirs.proc is not None
        return await workloads(theirs.address, sizes, theirs.proc.pid)
    finally:
        theirs.kill()
        etcd.stop()


def round_orders(rounds: int) -> list[tuple[str, str]]:
    """Which system goes first in each round: pygazette, then Gazette, alternately."""
    return [
        ("pygazette", "gazette") if r % 2 == 0 else ("gazette", "pygazette") for r in range(rounds)
    ]


FIGURES: dict[str, Callable[[dict[str, Any]], float]] = {
    "append_1mib_mb_per_s": lambda d: d["big"]["mb_per_s"],
    "append_4kib_per_s": lambda d: d["small"]["appends_per_s"],
    "commit_latency_4kib_p50_ms": lambda d: d["small"]["p50_ms"],
    "commit_latency_4kib_p99_ms": lambda d: d["small"]["p99_ms"],
    "tail_read_mb_per_s": lambda d: d["tail_read"],
    "persisted_read_mb_per_s": lambda d: d["persisted_read"],
    "broker_cpu_ms_per_append_1mib": lambda d: d["broker_cpu_ms_per_append_1mib"],
    "broker_cpu_ms_per_append_4kib": lambda d: d["broker_cpu_ms_per_append_4kib"],
    "broker_cpu_s_per_gb_tail_read": lambda d: d["broker_cpu_s_per_gb_tail_read"],
    "broker_cpu_s_per_gb_persisted_read": lambda d: d["broker_cpu_s_per_gb_persisted_read"],
}


def compare_rounds(py: list[dict[str, Any]], go: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds for both systems, the ratio pygazette/Gazette of
    the medians, and every round's figure."""
    out: dict[str, Any] = {}
    for name, get in FIGURES.items():
        p = [get(d) for d in py]
        g = [get(d) for d in go]
        mp, mg = round(statistics.median(p), 3), round(statistics.median(g), 3)
        out[name] = {
            "pygazette": mp,
            "gazette": mg,
            "ratio": ratio(mp, mg),
            "rounds": {"pygazette": p, "gazette": g},
        }
    return out


async def run_both(
    binaries: GazetteBinaries, tmp: Path, sizes: tuple[int, int, int, int], rounds: int
) -> dict[str, object]:
    runs: dict[str, list[dict[str, Any]]] = {"pygazette": [], "gazette": []}
    for r, order in enumerate(round_orders(rounds)):
        for system in order:
            where = tmp / f"{system}-{r}"
            if system == "pygazette":
                runs[system].append(await run_pygazette(where, sizes))
            else:
                runs[system].append(await run_gazette(binaries, where, sizes))
    return {
        "benchmark": "vs_gazette",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "baseline": f"Gazette broker ({GAZETTE_VERSION}, etcd 3.6), same run, same workloads",
        "rounds": rounds,
        "order": "alternating: pygazette first in even rounds, Gazette first in odd ones",
        "statistic": "median over rounds; ratio pygazette/Gazette of the medians",
        **compare_rounds(runs["pygazette"], runs["gazette"]),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "details": runs,
    }


def go_client_main(args: argparse.Namespace) -> dict[str, object]:
    """`--go-client`: both brokers driven by Gazette's Go client (bench/gazette_go_client.py)."""
    from gazette_go_client import FULL, QUICK, TINY, TOPOLOGIES, go_client_bench

    topologies = [t for t in TOPOLOGIES if not args.topologies or t.name in args.topologies]
    return go_client_bench(
        sizes=TINY if args.smoke else QUICK if args.quick else FULL,
        rounds=args.rounds or 2,
        topologies=topologies,
        workloads=args.workloads or None,
        py_spy=args.py_spy,
    )


def stream_sum_main(args: argparse.Namespace) -> dict[str, object]:
    """`--stream-sum`: Gazette's stream-sum example on each system's brokers, same workload."""
    from tests.support.gazette_stream_sum import Workload, run_stream_sum

    workload = Workload(workers=4, streams=args.streams, chunks=args.chunks)
    binaries = gazette_binaries()
    rounds: dict[str, list[dict[str, Any]]] = {"pygazette": [], "gazette": []}
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-vs-gazette-stream-sum-"))
    etcd = EtcdServer(binaries.etcd, tmp / "etcd" / "data")
    etcd.data_dir.parent.mkdir(parents=True)
    etcd.start()
    try:
        for r in range(args.rounds or 1):
            order = ("gazette", "pygazette") if r % 2 == 0 else ("pygazette", "gazette")
            for system in order:
                rounds[system].append(
                    run_stream_sum(system, binaries, etcd, tmp / f"{system}-{r}", workload)
                )
    finally:
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def median(system: str) -> float:
        times = sorted(run["seconds"] for run in rounds[system])
        return float(times[len(times) // 2])

    py, go = median("pygazette"), median("gazette")
    return {
        "benchmark": "vs_gazette --stream-sum",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "baseline": f"Gazette brokers ({GAZETTE_VERSION}, etcd 3.6), same run, same workload",
        "workload": {
            "brokers": 3,
            "replication": workload.replication,
            "chunk_partitions": workload.partitions,
            "summers": workload.summers,
            "hot_standbys": 1,
            "streams": workload.total_streams,
            "chunks_per_stream": workload.chunks,
        },
        "seconds": {"pygazette": py, "gazette": go},
        "speed_vs_gazette": round(go / py, 3),
        # All three brokers' CPU while the chunker ran (median run), and the load average
        # after the last run: other processes on the machine slow both systems.
        "broker_cpu_s": {
            s: sorted(r["broker_cpu_s"] for r in runs)[len(runs) // 2] for s, runs in rounds.items()
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "target": {"speed_vs_gazette": ">= 0.5", "met": go / py >= 0.5},
        "validation_errors": {
            s: sum(r["logs"][p]["validation_errors"] for r in runs for p in r["logs"])
            for s, runs in rounds.items()
        },
        "every_stream_verified": all(
            r["streams_with_final_sum"] == workload.total_streams
            for runs in rounds.values()
            for r in runs
        ),
        "rounds": rounds,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument(
        "--go-client",
        action="store_true",
        help="drive both brokers with Gazette's Go client (interop/loadgen): single broker, "
        "and 3 brokers at r=2 and r=3",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds: 2 (alternating which system goes first); --stream-sum: 1",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="--go-client: a run of seconds that only checks everything works (no figures)",
    )
    parser.add_argument(
        "--topologies", nargs="*", default=[], help="--go-client: of single, r2, r3 (default all)"
    )
    parser.add_argument(
        "--workloads",
        nargs="*",
        default=[],
        help="--go-client: of append_4kib, append_1mib, raw_append_4kib, tail_read, "
        "register_latency, wakeup_latency, consumer (default all)",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="--go-client: sample pygazette's brokers with py-spy into DIR",
    )
    parser.add_argument(
        "--stream-sum",
        action="store_true",
        help="Gazette's stream-sum example (Go summer and chunker) on both systems' brokers",
    )
    parser.add_argument("--streams", type=int, default=50, help="--stream-sum: per worker (4)")
    parser.add_argument("--chunks", type=int, default=100, help="--stream-sum: per stream")
    parser.add_argument(
        "--go-soak",
        action="store_true",
        help="the Go soak (Gazette's client under concurrency, a broker killed) on both",
    )
    parser.add_argument(
        "--soak-seconds", type=float, default=10.0, help="--go-soak: seconds per phase"
    )
    args = parser.parse_args()
    if args.stream_sum:
        print(json.dumps(stream_sum_main(args), indent=2))
    elif args.go_soak:
        from tests.support.go_soak import soak_both

        print(json.dumps(soak_both(args.soak_seconds), indent=2))
    elif args.go_client:
        print(json.dumps(go_client_main(args), indent=2))
    else:
        print(json.dumps(asyncio.run(main(args.quick, args.rounds or 2)), indent=2))
