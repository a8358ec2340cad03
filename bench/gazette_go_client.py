"""Benchmark: Gazette's broker and pygazette's, both driven by Gazette's own Go client.

The `--go-client` mode of `bench/vs_gazette.py`. For each topology — one broker (r=1), three
brokers at r=2 and at r=3, all on one etcd (interop/bin/etcd) — it starts Gazette's brokers
(interop/bin/gazette) and pygazette's (`pygazette serve --etcd`), one system after the other
and alternating which goes first from round to round, and runs the Go load generator
(interop/loadgen, on go.gazette.dev/core/broker/client v0.103.0) against each: appends of
4 KiB and 1 MiB with N concurrent writers, a tail read, register-checked small appends,
append → wake-up of a blocking reader on another broker, and (three brokers, r=2) a
consumer-like loop of small transactions interleaved with blocking reads.

Figures are the median over rounds; ratios are pygazette/Gazette (throughput: above 1,
pygazette is faster; latency and seconds: above 1, pygazette is slower). Every workload also
reports `broker_cpu_s`, the CPU time all brokers spent on it (from /proc). With `--py-spy DIR`
every pygazette broker is sampled by py-spy while the load generator runs, and the JSON
carries where each broker spent its samples (`hot_functions`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.broker_process import BrokerProcess  # noqa: E402
from tests.support.gazette_process import (  # noqa: E402
    EtcdServer,
    GazetteBinaries,
    GazetteBroker,
    gazette_binaries,
)
from tests.support.listening_process import start_listening  # noqa: E402

GAZETTE_VERSION = "go.gazette.dev/core v0.103.0"
LOADGEN_BUILD = ROOT / "interop" / "loadgen" / "build"
SYSTEMS = ("gazette", "pygazette")

# Which figures of each workload are compared, and whether more is better.
METRICS: dict[str, tuple[tuple[str, bool], ...]] = {
    "append_4kib": (
        ("appends_per_s", True),
        ("mb_per_s", True),
        ("p50_ms", False),
        ("p99_ms", False),
    ),
    "append_1mib": (("mb_per_s", True), ("p50_ms", False), ("p99_ms", False)),
    # Bare Append RPCs of 4 KiB, also answered by a grpc.aio server with no broker behind it.
    "raw_append_4kib": (("appends_per_s", True), ("p50_ms", False), ("p99_ms", False)),
    "tail_read": (("mb_per_s", True),),
    "register_latency": (("p50_ms", False), ("p99_ms", False)),
    "wakeup_latency": (
        ("p50_ms", False),
        ("p99_ms", False),
        ("commit_p50_ms", False),
        ("commit_p99_ms", False),
    ),
    "consumer": (("seconds", False), ("messages_per_s", True)),
}
# And of each, what the brokers spent on it: CPU seconds, all brokers together.
METRICS = {w: (*m, ("broker_cpu_s", False)) for w, m in METRICS.items()}
# Issue 13's targets, as bounds on the pygazette/Gazette ratio.
TARGETS: dict[tuple[str, str], tuple[str, float]] = {
    ("append_4kib", "mb_per_s"): (">=", 0.9),
    ("append_1mib", "mb_per_s"): (">=", 0.9),
    ("tail_read", "mb_per_s"): (">=", 1.0),
    ("register_latency", "p50_ms"): ("<=", 1.2),
    ("register_latency", "p99_ms"): ("<=", 1.2),
    ("wakeup_latency", "p50_ms"): ("<=", 1.2),
    ("wakeup_latency", "p99_ms"): ("<=", 1.2),
}
BASIC = ("append_4kib", "append_1mib", "tail_read", "register_latency", "wakeup_latency")


@dataclass(frozen=True)
class Topology:
    name: str
    brokers: int
    replication: int
    workloads: tuple[str, ...]


TOPOLOGIES = (
    Topology("single", 1, 1, (*BASIC, "raw_append_4kib")),
    Topology("r2", 3, 2, (*BASIC, "consumer")),
    Topology("r3", 3, 3, BASIC),
)


@dataclass(frozen=True)
class Sizes:
    writers: int
    small_count: int
    big_count: int
    latency_count: int
    wake_count: int
    consumer_messages: int
    txn: int

    def flags(self) -> list[str]:
        return [
            f"-writers={self.writers}",
            f"-small-count={self.small_count}",
            f"-big-count={self.big_count}",
            f"-latency-count={self.latency_count}",
            f"-wake-count={self.wake_count}",
            f"-consumer-messages={self.consumer_messages}",
            f"-txn={self.txn}",
        ]


FULL = Sizes(4, 4000, 256, 500, 500, 2000, 10)
QUICK = Sizes(4, 400, 32, 100, 100, 300, 10)
TINY = Sizes(2, 20, 4, 10, 10, 20, 5)  # The smoke test's: seconds, not figures.


def loadgen_binary() -> Path:
    """Build (once; later calls return at once) and locate interop/bin/loadgen."""
    proc = subprocess.run(
        [str(LOADGEN_BUILD)], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"interop/loadgen/build failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class Deployment:
    """One system's brokers of one topology, on the shared etcd, under a fresh prefix."""

    def __init__(
        self,
        system: str,
        topology: Topology,
        binaries: GazetteBinaries,
        etcd: EtcdServer,
        work: Path,
    ) -> None:
        self.system = system
        self.topology = topology
        self.work = work
        store = work / "store"
        store.mkdir(parents=True, exist_ok=True)
        prefix = f"/bench/{system}-{topology.name}-{uuid.uuid4().hex[:8]}"
        self.gazette: list[GazetteBroker] = []
        self.pygazette: list[BrokerProcess] = []
        for i in range(topology.brokers):
            if system == "gazette":
                self.gazette.append(
                    GazetteBroker(
                        binaries.gazette,
                        etcd,
                        work / f"broker-{i}",
                        file_root=store,
                        prefix=prefix,
                        broker_id=f"gazette-{i}",
                    )
                )
            else:
                data = work / f"broker-{i}" / "data"
                data.parent.mkdir(parents=True, exist_ok=True)
                self.pygazette.append(
                    BrokerProcess(
                        data,
                        extra_args=[
                            "--etcd",
                            etcd.url,
                            "--etcd-prefix",
                            prefix,
                            "--zone",
                            "local",
                            "--id",
                            f"pygazette-{i}",
                            "--file-root",
                            str(store),
                        ],
                    )
                )

    @property
    def endpoints(self) -> list[str]:
        return [g.url for g in self.gazette] + [p.url for p in self.pygazette]

    def pids(self) -> list[int]:
        """Process IDs of pygazette's brokers (what py-spy samples)."""
        return [b.pid for b in self.pygazette]

    def all_pids(self) -> list[int]:
        """Process IDs of every broker, Gazette's or pygazette's."""
        procs = [g.proc for g in self.gazette] + [p.proc for p in self.pygazette]
        return [p.pid for p in procs if p is not None]

    def start(self) -> None:
        for g in self.gazette:
            g.start()
        for p in self.pygazette:
            p.start(60.0)

    def stop(self) -> None:
        for g in self.gazette:
            g.kill()  # A Gazette broker waits for hand-offs on SIGTERM; nothing to keep.
        for p in self.pygazette:
            p.kill()

    def logs(self) -> str:
        tails = [(g.url, g.log()) for g in self.gazette] + [
            (p.url, p.log()) for p in self.pygazette
        ]
        return "\n".join(f"--- {url}\n{log[-2000:]}" for url, log in tails)


class Profiler:
    """py-spy sampling each given process into a collapsed-stack file until stopped."""

    def __init__(self, out_dir: Path, label: str, pids: Sequence[int]) -> None:
        self.files: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out_dir.mkdir(parents=True, exist_ok=True)
        for i, pid in enumerate(pids):
            out = out_dir / f"{label}-broker-{i}.txt"
            self.files.append(out)
            self.procs.append(
                subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "--pid",
                        str(pid),
                        "--format",
                        "raw",
                        "--rate",
                        "200",
                        "--output",
                        str(out),
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def hot_functions(collapsed: Path, top: int = 15) -> dict[str, Any]:
    """Where a collapsed-stack profile (py-spy `--format raw`) spends its samples: `self`,
    by innermost frame; `ours`, by innermost frame of pygazette's own code other than the
    `serve` entry point (so time in asyncio, grpc and the standard library is charged to
    the pygazette function that called it); `threads`, the share outside the event loop
    (the thread pool that hashes and writes spools)."""
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = threads = 0
    if not collapsed.exists():
        return {"samples": 0}
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        n = int(count_text)
        frames = [_frame(f) for f in stack.split(";")]
        total += n
        if frames[0][0].startswith("Thread."):
            threads += n
        own[_label(frames[-1])] += n
        mine = [f for f in frames if f[1].startswith("pygazette/") and not _entry(f[1])]
        ours[_label(mine[-1]) if mine else "(outside pygazette's code)"] += n
    if not total:
        return {"samples": 0}

    def share(c: Counter[str]) -> dict[str, float]:
        return {f: round(n / total, 3) for f, n in c.most_common(top)}

    return {
        "samples": total,
        "threads": round(threads / total, 3),
        "self": share(own),
        "ours": share(ours),
    }


def _frame(frame: str) -> tuple[str, str]:
    """(function, file) of a py-spy frame `function (path/file.py:line)`."""
    func, _, where = frame.partition(" (")
    return func, where.rstrip(")").rsplit(":", 1)[0]


def _label(frame: tuple[str, str]) -> str:
    func, path = frame
    return f"{func} ({'/'.join(Path(path).parts[-2:])})" if path else func


def _entry(path: str) -> bool:
    return path in ("pygazette/cli/main.py", "pygazette/cli/serve_cmd.py")


def run_loadgen(
    loadgen: Path,
    dep: Deployment,
    sizes: Sizes,
    workloads: Sequence[str],
    round_no: int,
) -> dict[str, Any]:
    """The load generator's figures of each workload, with the CPU time the brokers spent
    on it (`broker_cpu_s`, all brokers of the deployment together)."""
    return loadgen_run(
        loadgen,
        dep.endpoints,
        dep.all_pids(),
        sizes,
        workloads,
        [
            f"-replication={dep.topology.replication}",
            f"-prefix=bench/{dep.topology.name}-{round_no}/",
        ],
        f"{dep.system} {dep.topology.name}",
        dep.logs,
    )


def loadgen_run(
    loadgen: Path,
    endpoints: Sequence[str],
    pids: Sequence[int],
    sizes: Sizes,
    workloads: Sequence[str],
    extra: Sequence[str],
    what: str,
    logs: Callable[[], str],
) -> dict[str, Any]:
    cmd = [
        str(loadgen),
        "-brokers=" + ",".join(endpoints),
        "-workloads=" + ",".join(workloads),
        "-cpu-pids=" + ",".join(str(pid) for pid in pids),
        *sizes.flags(),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"loadgen against {what} failed:\n{proc.stderr[-4000:]}\n{logs()}")
    results: dict[str, Any] = json.loads(proc.stdout)["results"]
    return results


class RawServer:
    """bench/raw_grpc_server.py: the Journal service's shape in grpc.aio, with no broker
    behind it (and the broker's heap tuning), as the floor of any grpc.aio broker."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = 0  # A free one (another if it was taken), once started.
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        script = ROOT / "bench" / "raw_grpc_server.py"
        self.proc, self.port = start_listening(
            lambda port: [sys.executable, str(script), str(port), "--heap-tuning"],
            self.log,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=timeout,
            what="bench/raw_grpc_server.py",
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def raw_baseline(loadgen: Path, sizes: Sizes, log: Path) -> dict[str, Any]:
    """`raw_append_4kib` against bench/raw_grpc_server.py (its output in `log`)."""
    server = RawServer(log)
    try:
        server.start()
        assert server.proc is not None
        return loadgen_run(
            loadgen,
            [server.url],
            [server.proc.pid],
            sizes,
            ["raw_append_4kib"],
            ["-raw", "-prefix=bench/raw/"],
            "bench/raw_grpc_server.py",
            lambda: "",
        )
    finally:
        server.stop()


def median(xs: Sequence[float]) -> float:
    return round(statistics.median(xs), 3) if xs else 0.0


def compare(
    runs: dict[str, dict[str, list[dict[str, Any]]]], topologies: Sequence[Topology]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per topology and workload, each metric's rounds, medians and pygazette/Gazette ratio;
    and the flat list of ratios against issue 13's targets."""
    figures: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    for topo in topologies:
        per_topo: dict[str, Any] = {}
        for workload in topo.workloads:
            per_workload: dict[str, Any] = {}
            for metric, higher_is_better in METRICS[workload]:
                rounds = {
                    s: [r[workload][metric] for r in runs[topo.name][s] if workload in r]
                    for s in SYSTEMS
                }
                g, p = median(rounds["gazette"]), median(rounds["pygazette"])
                ratio = round(p / g, 3) if g else 0.0
                per_workload[metric] = {
                    "gazette": g,
                    "pygazette": p,
                    "ratio": ratio,
                    "better": "higher" if higher_is_better else "lower",
                    "rounds": rounds,
                }
                floor = [
                    r[workload][metric]
                    for r in runs[topo.name].get("grpc_aio", [])
                    if workload in r
                ]
                if floor:  # The same RPCs answered by grpc.aio alone.
                    per_workload[metric]["grpc_aio"] = median(floor)
                    per_workload[metric]["pygazette_vs_grpc_aio"] = (
                        round(p / median(floor), 3) if median(floor) else 0.0
                    )
                    rounds["grpc_aio"] = floor
                target = TARGETS.get((workload, metric))
                if target is not None and topo.name in ("single", "r2", "r3"):
                    op, bound = target
                    met = ratio >= bound if op == ">=" else ratio <= bound
                    checks.append(
                        {
                            "figure": f"{topo.name}.{workload}.{metric}",
                            "ratio": ratio,
                            "target": f"{op} {bound}",
                            "met": met,
                        }
                    )
            per_topo[workload] = per_workload
        figures[topo.name] = per_topo
    return figures, checks


def go_client_bench(
    *,
    sizes: Sizes,
    rounds: int,
    topologies: Sequence[Topology] = TOPOLOGIES,
    workloads: Sequence[str] | None = None,
    py_spy: Path | None = None,
) -> dict[str, Any]:
    """Run every topology's workloads against both systems, `rounds` times, alternating."""
    binaries = gazette_binaries()
    loadgen = loadgen_binary()
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-vs-gazette-go-"))
    etcd = EtcdServer(binaries.etcd, tmp / "etcd" / "data")
    etcd.data_dir.parent.mkdir(parents=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        t.name: {s: [] for s in SYSTEMS} for t in topologies
    }
    profiles: dict[str, Any] = {}
    started = time.monotonic()
    etcd.start()
    try:
        for round_no in range(rounds):
            for ti, topo in enumerate(topologies):
                chosen = [w for w in topo.workloads if workloads is None or w in workloads]
                if not chosen:
                    continue
                order = SYSTEMS if (round_no + ti) % 2 == 0 else SYSTEMS[::-1]
                for system in order:
                    work = tmp / f"{system}-{topo.name}-{round_no}"
                    dep = Deployment(system, topo, binaries, etcd, work)
                    profiler: Profiler | None = None
                    try:
                        dep.start()
                        if py_spy is not None and system == "pygazette":
                            label = f"{topo.name}-round{round_no}"
                            profiler = Profiler(py_spy, label, dep.pids())
                        runs[topo.name][system].append(
                            run_loadgen(loadgen, dep, sizes, chosen, round_no)
                        )
                    finally:
                        if profiler is not None:
                            profiler.stop()
                            profiles[f"{topo.name}-round{round_no}"] = {
                                f.name: hot_functions(f) for f in profiler.files
                            }
                        dep.stop()
                    shutil.rmtree(work, ignore_errors=True)
                if "raw_append_4kib" in chosen:
                    runs[topo.name].setdefault("grpc_aio", []).append(
                        raw_baseline(loadgen, sizes, tmp / f"raw-{topo.name}-{round_no}.log")
                    )
    finally:
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    shown = [
        Topology(
            t.name,
            t.brokers,
            t.replication,
            tuple(w for w in t.workloads if workloads is None or w in workloads),
        )
        for t in topologies
    ]
    figures, checks = compare(runs, shown)
    out: dict[str, Any] = {
        "benchmark": "vs_gazette --go-client",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg": os.getloadavg(),
        },
        "client": f"Gazette's Go client ({GAZETTE_VERSION} broker/client, message), "
        "interop/loadgen",
        "baseline": f"Gazette broker ({GAZETTE_VERSION}), same etcd, same run, alternating",
        "ratio": "pygazette / Gazette, of medians over rounds",
        "rounds": rounds,
        "sizes": sizes.__dict__,
        "topologies": {t.name: {"brokers": t.brokers, "replication": t.replication} for t in shown},
        "seconds": round(time.monotonic() - started, 1),
        "targets": checks,
        "figures": figures,
    }
    if profiles:
        out["py_spy"] = {"dir": str(py_spy), "profiles": profiles}
    return out
