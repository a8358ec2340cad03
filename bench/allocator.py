"""Benchmark: Gazette's simulated rolling deploy, for pygazette's allocator and Gazette's.

The scenario is Gazette's `allocator/benchmark_test.go` (`BenchmarkAll/simulated-deploy`):
N*10 members (as keys), N*2,000 items at replication 3. Half of the members (limit 1,500)
and all items exist at first, with a leader member (limit 1) that is never rolled. Then,
each time the leader's allocator goes idle, either every assignment not yet marked
"consistent" is marked so (a replica that synchronised), or, with nothing left to mark,
the next step of the deploy runs: a tenth of the members joins (limit 1,205) or the oldest
tenth is marked exiting, alternately, until all original members are replaced; then the
leader exits and its allocator returns. pygazette's allocator runs in this process on an
in-memory embedded keyspace (no etcd); Gazette's benchmark runs from the Go module cache
with its etcdtest server (a real etcd on a unix socket), at the same sizes.

Reported for both: wall time, CPU seconds, solver time (per solve: count, total, mean,
max), and assignment adds / removes / packs; and pygazette's ratios to Gazette. On a shared
machine wall times swing with load; CPU seconds are steadier. pygazette's are this process's
over the run. Gazette's test binary is compiled first, untimed (`go test -c`), and run on
its own: its CPU is the binary's and its etcd's. Go runs a benchmark at b.N = 1 before
b.N = n, so for n > 1 the CPU of a b.N = 1 run of the same binary (measured once, right
before) is taken out: `cpu_seconds` is the b.N = n run's alone, beside the whole process's
(`cpu_seconds_with_warmup`) and the warm-up's. (Before, Gazette's CPU was that of `go test`:
the toolchain's compile and link, the warm-up run and the measured run together.)

    python bench/allocator.py [--sizes 1,2,5,10] [--no-go]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pygazette.allocator.allocator import Allocator, ObservedState
from pygazette.allocator.state import AllocatorState, Assignment, Item
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import MAX_TXN_OPS, Compare, KeyValue, Put
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout

REPO = Path(__file__).resolve().parent.parent
GO_PACKAGE = "go.gazette.dev/core/allocator"
GO_BENCH = "BenchmarkAll/simulated-deploy$"


class BenchDecoder:
    """Gazette's testAllocDecoder: JSON values {"R": n, "E": exiting}; an assignment is
    consistent once its value is "consistent"."""

    def item_replication(self, item_id: str, kv: KeyValue) -> int:
        return int(_json(kv)["R"])

    def member_limit(self, zone: str, suffix: str, kv: KeyValue) -> tuple[int, bool]:
        doc = _json(kv)
        return int(doc["R"]), bool(doc.get("E", False))

    def is_consistent(self, item: Item, assignment: Assignment, all_: Sequence[Assignment]) -> bool:
        return assignment.kv.value == b"consistent"


def _json(kv: KeyValue) -> dict[str, Any]:
    try:
        doc = json.loads(kv.value)
    except ValueError as exc:
        raise KeyDecodeError(f"{kv.key}: {exc}") from exc
    if not isinstance(doc, dict):
        raise KeyDecodeError(f"{kv.key}: not an object")
    return doc


async def _write(ks: EmbeddedKeyspace, pairs: list[tuple[str, str]], insert: bool) -> None:
    """Put `pairs`, each guarded (absent if `insert`, else unchanged), in batched txns."""
    for start in range(0, len(pairs), MAX_TXN_OPS):
        batch = pairs[start : start + MAX_TXN_OPS]
        compares = []
        for key, _ in batch:
            kv = ks.get(key)
            if not insert and kv is None:
                raise RuntimeError(f"update of missing key {key}")
            compares.append(Compare(key, 0 if insert else kv.mod_revision))  # type: ignore[union-attr]
        result = await ks.txn(compares, [Put(k, v.encode()) for k, v in batch])
        if not result.succeeded:
            raise RuntimeError("benchmark fill transaction failed")


async def _mark_all_consistent(ks: EmbeddedKeyspace, layout: KeyLayout) -> bool | None:
    """Mark every assignment valued "" consistent; whether any was (None: a lost race)."""
    marked = False
    ops: list[tuple[Compare, Put]] = []
    for kv in ks.range(layout.assign_prefix):
        if kv.value == b"":
            ops.append((Compare(kv.key, kv.mod_revision), Put(kv.key, b"consistent", kv.lease)))
    for start in range(0, len(ops), MAX_TXN_OPS // 2):
        batch = ops[start : start + MAX_TXN_OPS // 2]
        result = await ks.txn([c for c, _ in batch], [p for _, p in batch])
        if not result.succeeded:
            return None
        marked = True
    return marked


def _member_key(layout: KeyLayout, i: int) -> str:
    return layout.member_key("zone-a" if i % 5 in (0, 2, 4) else "zone-b", f"m{i:05d}")


async def simulated_deploy(n: int) -> dict[str, Any]:
    layout = KeyLayout("/root")
    ks = EmbeddedKeyspace(None)
    members10, half, members = n, n * 5, n * 10
    items = members * 200
    leader = layout.member_key("zone-a", "leader")
    started, cpu_started = time.perf_counter(), time.process_time()
    await _write(ks, [(leader, '{"R": 1}')], insert=True)
    await _write(ks, [(_member_key(layout, i), '{"R": 1500}') for i in range(half)], True)
    await _write(ks, [(layout.item_key(f"i{i:05d}"), '{"R": 3}') for i in range(items)], True)
    observed = ObservedState(ks, layout, BenchDecoder(), leader)

    idle_at = asyncio.Condition()
    last_idle = [-1]  # Revision of the last idle round.

    def on_round(state: AllocatorState, idle: bool) -> None:
        if idle:
            last_idle[0] = state.revision
            asyncio.get_running_loop().create_task(_notify(idle_at))

    allocator = Allocator(ks, observed, on_round=on_round)
    task = asyncio.create_task(allocator.run())
    block, steps, marks = 0, 0, 0
    next_down = False
    waited_for = [ks.revision]  # The idle round to wait for must see this revision.
    try:
        while not task.done():
            async with idle_at:
                waiting = asyncio.ensure_future(
                    idle_at.wait_for(lambda: last_idle[0] >= waited_for[0] or task.done())
                )
                await asyncio.wait([waiting, task], return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    waiting.cancel()
                    break
            marked = await _mark_all_consistent(ks, layout)
            if marked is not False:
                marks += 1
                waited_for[0] = ks.revision
                continue
            begin, end = members10 * block, members10 * (block + 1)
            if begin == half:
                kv = ks.get(leader)
                assert kv is not None
                await ks.txn(
                    [Compare(leader, kv.mod_revision)], [Put(leader, b'{"R": 1, "E": true}')]
                )
            elif next_down:
                pairs = [
                    (_member_key(layout, i), '{"R": 1500, "E": true}') for i in range(begin, end)
                ]
                await _write(ks, pairs, insert=False)
            else:
                pairs = [
                    (_member_key(layout, i), '{"R": 1205}') for i in range(half + begin, half + end)
                ]
                await _write(ks, pairs, insert=True)
            if begin != half:
                steps += 1
                next_down = not next_down
                if not next_down:
                    block += 1
            waited_for[0] = ks.revision
        await task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    final = observed.current
    solves = allocator.solve_seconds
    return {
        "members": members,
        "items": items,
        "wall_seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "rounds": allocator.rounds,
        "deploy_steps": steps,
        "consistency_marks": marks,
        "solver": _solver_summary(solves),
        "solver_cpu": _solver_summary(allocator.solve_cpu_seconds),
        "items_solved": allocator.items_solved,
        "adds": allocator.adds,
        "removes": allocator.removes,
        "packs": allocator.packs,
        "final_assignments": len(final.assignments),
    }


def _solver_summary(solves: Sequence[float]) -> dict[str, Any]:
    return {
        "solves": len(solves),
        "total_seconds": round(sum(solves), 3),
        "mean_seconds": round(sum(solves) / len(solves), 4) if solves else 0.0,
        "max_seconds": round(max(solves), 4) if solves else 0.0,
    }


async def _notify(cond: asyncio.Condition) -> None:
    async with cond:
        cond.notify_all()


# Gazette's benchmark.
_FINAL = re.compile(r'msg="final metrics" adds=(\d+) mode=\S+ packs=(\d+) removes=(\d+)')
_SOLVED = re.compile(r'msg="solved for maximum assignment".* dur=([0-9.]+)(ms|s|µs)')
_STAMP = re.compile(r'time="([0-9T:-]+)Z"')
_NSOP = re.compile(r"^(?:\S*simulated-deploy\S*)?\s+(\d+)\s+(\d+) ns/op", re.M)


def build_gazette_bench(go: str, into: Path) -> Path:
    """Compile Gazette's allocator test binary into `into` (untimed: not the benchmark's)."""
    binary = into / "allocator.test"
    subprocess.run(
        [go, "test", "-c", "-o", str(binary), GO_PACKAGE],
        cwd=REPO / "interop",
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return binary


def measured_run_cpu(total: float, warmup: float | None, n: int) -> float:
    """CPU seconds of a benchmark's b.N = n run alone, from its process's `total` and the
    CPU of a separate b.N = 1 run (`warmup`): Go runs b.N = 1 first whenever n > 1."""
    if n == 1:
        return total
    if warmup is None:
        raise ValueError("n > 1 needs the CPU of a b.N = 1 run")
    return max(0.0, total - warmup)


def run_gazette_bench(binary: Path, n: int, work: Path) -> tuple[str, int, float, float]:
    """Run the test binary at b.N = n in `work` (etcdtest's sockets and data directory go
    into the working directory); (output, exit code, seconds, CPU seconds of the binary
    and its children: etcd)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"n{n}-", dir=work))
    started = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [str(binary), "-test.run", "^$", "-test.bench", GO_BENCH, f"-test.benchtime={n}x"],
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    total = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    shutil.rmtree(run_dir, ignore_errors=True)
    return proc.stdout + proc.stderr, proc.returncode, total, cpu


def gazette_deploy(
    n: int, binary: Path, work: Path, warmup_cpu: float | None = None
) -> dict[str, Any]:
    """Gazette's benchmark at b.N = n (Go runs b.N = 1 first; figures are of the n run).
    `warmup_cpu`: the CPU of a b.N = 1 run, taken out of this one's (needed for n > 1)."""
    out, returncode, total, cpu = run_gazette_bench(binary, n, work)
    finals = _FINAL.findall(out)
    ns_all = _NSOP.findall(out)
    runs = 2 if n > 1 else 1  # Go runs b.N = 1 first.
    note = None
    if len(finals) < runs:
        raise RuntimeError(f"go test failed ({returncode}): {out[-2000:]}")
    # The n run: after the b.N=1 run's final metrics.
    tail = out.split('msg="final metrics"')[-2] if n > 1 else out
    if ns_all and returncode == 0:
        wall = int(ns_all[-1][1]) * int(ns_all[-1][0]) / 1e9
    else:
        # It finished its run but failed after (e.g. etcd timing out on cleanup under
        # load): the run's wall time from its log's timestamps (1 s resolution).
        stamps = _STAMP.findall(out.split('msg="final metrics"')[runs - 1])
        if len(stamps) < 2:
            raise RuntimeError(f"go test failed ({returncode}): {out[-2000:]}")
        wall = (_parse_stamp(stamps[-1]) - _parse_stamp(stamps[0])).total_seconds()
        note = f"go test exited {returncode} after the run; wall time from log timestamps"
    adds, packs, removes = (int(x) for x in finals[runs - 1])
    solves = []
    for value, unit in _SOLVED.findall(tail):
        scale = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]
        solves.append(float(value) * scale)
    return {
        "members": n * 10,
        "items": n * 2000,
        "wall_seconds": round(wall, 3),
        "note": note,
        "process_seconds": round(total, 1),
        # The b.N = n run's (the test binary's and etcd's), the b.N = 1 run's taken out.
        "cpu_seconds": round(measured_run_cpu(cpu, warmup_cpu, n), 1),
        # Of the whole test binary and etcd: the b.N = 1 run too, when n > 1.
        "cpu_seconds_with_warmup": round(cpu, 1),
        "warmup_cpu_seconds": None if n == 1 else round(warmup_cpu or 0.0, 1),
        "solver": _solver_summary(solves),
        "adds": adds,
        "removes": removes,
        "packs": packs,
    }


def _parse_stamp(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def _find_go() -> str | None:
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,2,5,10", help="values of N (members = N*10)")
    parser.add_argument("--no-go", action="store_true", help="skip Gazette's benchmark")
    args = parser.parse_args(argv)
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1:
        parser.error("--sizes must be positive")
    go = None if args.no_go else _find_go()
    if not args.no_go and go is None:
        parser.error("go not found (install it, or pass --no-go)")
    work = Path(tempfile.mkdtemp(prefix="pygazette-bench-allocator-"))
    try:
        run_sizes(sizes, go, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_sizes(sizes: list[int], go: str | None, work: Path) -> None:
    binary = None if go is None else build_gazette_bench(go, work)
    warmup_cpu: float | None = None  # Of a b.N = 1 run, measured once when some n > 1.
    results = []
    for n in sizes:
        row: dict[str, Any] = {"n": n, "pygazette": asyncio.run(simulated_deploy(n))}
        print(f"N={n} pygazette: {row['pygazette']['wall_seconds']} s", file=sys.stderr)
        if binary is not None:
            try:
                if n > 1 and warmup_cpu is None:
                    warmup_cpu = run_gazette_bench(binary, 1, work)[3]
                row["gazette"] = gazette_deploy(n, binary, work, warmup_cpu)
                if n == 1:  # A b.N = 1 run: the warm-up of the larger sizes.
                    warmup_cpu = row["gazette"]["cpu_seconds"]
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                row["gazette"] = {"error": str(exc)[-1000:]}
                results.append(row)
                continue
            g, p = row["gazette"], row["pygazette"]
            print(f"N={n} gazette: {g['wall_seconds']} s", file=sys.stderr)
            row["ratios"] = {
                "wall": round(p["wall_seconds"] / g["wall_seconds"], 2),
                "cpu": round(p["cpu_seconds"] / max(g["cpu_seconds"], 1e-9), 2),
                "solver_total": round(
                    p["solver"]["total_seconds"] / max(g["solver"]["total_seconds"], 1e-9), 2
                ),
                "moves": round((p["adds"] + p["removes"]) / max(1, g["adds"] + g["removes"]), 2),
            }
        results.append(row)
    doc = {
        "benchmark": "allocator simulated rolling deploy (Gazette's benchmark_test.go)",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "pygazette_keyspace": "embedded, in memory",
        "gazette_keyspace": "etcd (etcdtest, unix socket)",
        "baseline": "Gazette's own benchmark (allocator/benchmark_test.go, v0.103.0) at the "
        "same sizes, same run; its CPU: the test binary and etcd in the b.N = n run, "
        "compile and the b.N = 1 warm-up excluded",
        "results": results,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
