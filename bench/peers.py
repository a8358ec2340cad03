"""Benchmark: pygazette beside what users would pick instead, Apache Kafka, NATS JetStream
and Redis Streams; each in one run, on this machine, with the same workloads, its usual
durable setting and its maintained Python client.

    python bench/peers.py [--quick] [--systems a,b,...] [--rounds R] [--messages N]
                          [--large-records N] [--latency-rate R] [--latency-seconds S]

Systems (`bench/peer_systems/`): `pygazette-r1` (one `pygazette serve`), `pygazette-r3`
(three brokers on etcd, replication 3), `kafka-1` and `kafka-3` (KRaft; three brokers at
replication factor 3, `acks=all`, `min.insync.replicas=2`; jars fetched from Maven Central
into ~/.cache/pygazette/kafka with mvn when missing), `nats` (`nats-server -js`, file
storage) and `redis` (`redis-server`, `appendonly yes`, `appendfsync everysec`). A system
whose server is not installed is skipped, and the JSON says why.

Workloads, each on a fresh log (journal, topic, stream) with one partition:

- `publish_small`: N 200-byte JSON messages published as fast as the client allows, until
  all are acknowledged (msgs/s);
- `consume_small`: the same N messages read back from the start and decoded (msgs/s);
- `publish_large` / `consume_large`: 1 MiB JSON records (MB/s);
- `latency`: a publisher paced at a fixed moderate rate (1,000 msgs/s) while a consumer tails
  the log; publish -> delivery to the consumer, p50/p99 (ms), in one process; `*_from_schedule`
  counts a message the publisher sent more than 2 ms late from when it was due instead
  (coordinated omission: Redis' send awaits its reply, and a stall delays what follows).

Every throughput figure is the best of R rounds (all rounds listed: the machine is shared,
and a slow round measures the neighbours); latency is the round with the lowest p99. Each
throughput figure also carries the CPU time the system's server processes (with their
reaped children: e.g. Redis' AOF rewrite) and this process (the client, its library's
threads included) spent on it, per message and per GB; `cpu_comparison` sets those side by
side, which the load of other processes on a shared machine disturbs far less. The
`comparison` section puts each workload's figures side by side, with pygazette's ratio to
every peer (throughput: pygazette / peer, higher is better; latency: pygazette / peer,
lower is better), and `targets` checks issue 13's: pygazette >= 1.0x every peer's publish
and consume throughput (r=1 against the single-node peers, r=3 against Kafka at
replication 3) and p99 latency no worse than Kafka's. Prints one JSON document; progress
goes to stderr. Exits non-zero if a system that should run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import string
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peer_systems.kafka_system import KafkaSystem  # noqa: E402
from peer_systems.nats_system import NatsSystem  # noqa: E402
from peer_systems.pygazette_system import PygazetteSystem  # noqa: E402
from peer_systems.redis_system import RedisSystem  # noqa: E402
from peer_systems.system import Message, System  # noqa: E402

MESSAGE_BYTES = 200
MiB = 1 << 20
LARGE_BYTES = MiB
UUID_PLACEHOLDER = "00000000-0000-1000-8000-000000000000"
ALL_SYSTEMS = ["pygazette-r1", "pygazette-r3", "kafka-1", "kafka-3", "nats", "redis"]
PYGAZETTE = ["pygazette-r1", "pygazette-r3"]
# Which peers each pygazette configuration's targets are checked against.
TARGET_PEERS = {"pygazette-r1": ["kafka-1", "nats", "redis"], "pygazette-r3": ["kafka-3"]}
THROUGHPUT = ["publish_small", "consume_small", "publish_large", "consume_large"]


def make_system(name: str) -> System:
    if name.startswith("pygazette-r"):
        return PygazetteSystem(int(name.removeprefix("pygazette-r")))
    if name.startswith("kafka-"):
        return KafkaSystem(int(name.removeprefix("kafka-")))
    if name == "nats":
        return NatsSystem()
    if name == "redis":
        return RedisSystem()
    raise SystemExit(f"unknown system {name!r} (one of {', '.join(ALL_SYSTEMS)})")


def progress(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# Messages --------------------------------------------------------------------------------


def small_messages(n: int, seed: int) -> list[Message]:
    """Distinct JSON messages of MESSAGE_BYTES bytes once encoded as a line with a UUID."""
    rng = random.Random(seed)
    pages = [f"/products/{c}/{rng.randrange(10**6):06d}" for c in ("phones", "books", "tv")]
    msgs: list[Message] = []
    for i in range(n):
        m: Message = {
            "uuid": UUID_PLACEHOLDER,
            "user": f"user-{rng.randrange(10**8):08d}",
            "event": "click",
            "page": pages[i % 3],
            "ts": 1712345678.123 + i,
            "n": i,
            "pad": "",
        }
        m["pad"] = "x" * (MESSAGE_BYTES - len(orjson.dumps(m)) - 1)
        msgs.append(m)
    return msgs


def large_messages(n: int, seed: int) -> list[Message]:
    """JSON records of LARGE_BYTES bytes once encoded as a line with a UUID; they share one
    random payload string (no system compresses, so its content does not matter)."""
    rng = random.Random(seed)
    overhead = len(orjson.dumps({"uuid": UUID_PLACEHOLDER, "n": n, "data": ""})) + 1
    data = "".join(rng.choices(string.ascii_letters + string.digits, k=LARGE_BYTES - overhead))
    return [{"uuid": UUID_PLACEHOLDER, "n": i, "data": data} for i in range(n)]


# Workloads -------------------------------------------------------------------------------


def process_cpu(pid: int) -> float:
    """CPU seconds process `pid` and its reaped children have used (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The CPU a system's servers and this process (the client) spend from `start()`."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.server0 = self.client0 = 0.0

    def _server(self) -> float:
        return sum(process_cpu(pid) for pid in self.system.server_pids())

    def start(self) -> None:
        self.server0, self.client0 = self._server(), time.process_time()

    def figures(self, count: int, nbytes: int) -> dict[str, float]:
        server = self._server() - self.server0
        return cpu_figures(server, time.process_time() - self.client0, count, nbytes)


def cpu_figures(server: float, client: float, count: int, nbytes: int) -> dict[str, float]:
    total = server + client
    return {
        "server_cpu_s": round(server, 3),
        "client_cpu_s": round(client, 3),
        "cpu_us_per_msg": round(total * 1e6 / count, 2) if count else 0.0,
        "cpu_s_per_gb": round(total * 1e9 / nbytes, 3) if nbytes else 0.0,
    }


def rate(count: int, nbytes: int, seconds: float) -> dict[str, float]:
    return {
        "msgs_per_s": round(count / seconds, 1),
        "mb_per_s": round(nbytes / seconds / 1e6, 2),
        "seconds": round(seconds, 3),
    }


async def throughput(
    system: System, log: str, msgs: Sequence[Message], large: bool, size: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Publish `msgs` to a new log, then read them back from its start."""
    await system.create(log, large)
    # Untimed warm-up: connections, metadata and routes of the new log.
    warmup = msgs[: 1 if large else 100]
    await system.publish(log, warmup)
    cpu = CpuMeter(system)
    cpu.start()
    t0 = time.perf_counter()
    await system.publish(log, msgs)
    published = rate(len(msgs), len(msgs) * size, time.perf_counter() - t0)
    published.update(cpu.figures(len(msgs), len(msgs) * size))
    total = len(warmup) + len(msgs)
    # Untimed, as the publish's warm-up: a consumer's connection (Kafka's is a new client;
    # the other systems' readers use clients connected already).
    await system.prepare_consume(log)
    cpu.start()
    t0 = time.perf_counter()
    nbytes = await system.consume(log, total)
    consumed = rate(total, nbytes, time.perf_counter() - t0)
    consumed.update(cpu.figures(total, nbytes))
    return published, consumed


async def latency(system: System, log: str, per_s: float, seconds: float) -> dict[str, Any]:
    """Publish at `per_s` for `seconds` while a consumer tails; publish -> delivery.

    A warm-up at the same rate comes first (half a second, at least 50 messages), and the
    measured messages start only once the consumer has received every warm-up message, so
    that connection and metadata set-up and a cold JIT are not measured."""
    await system.create(log, False)
    warmup = max(50, int(per_s * 0.5))
    count = warmup + max(20, int(per_s * seconds))
    template = small_messages(1, seed=7)[0]
    sent = [0.0] * count
    scheduled = [0.0] * count  # When the pacing meant each message to go.
    received = [0.0] * count
    got = 0
    loop = asyncio.get_running_loop()
    waiters: dict[int, asyncio.Future[None]] = {
        warmup: loop.create_future(),
        count: loop.create_future(),
    }

    def reached(n: int) -> None:
        if not waiters[n].done():
            waiters[n].set_result(None)

    def on_message(msg: Message) -> None:
        nonlocal got
        now = time.perf_counter()
        n = msg["n"]
        if received[n] == 0.0:
            received[n] = now
            got += 1
            if got in waiters:
                loop.call_soon_threadsafe(reached, got)

    async def paced(first: int, end: int) -> float:
        t0 = time.perf_counter()
        for i in range(first, end):
            scheduled[i] = t0 + (i - first) / per_s
            delay = scheduled[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            msg = dict(template, n=i)
            sent[i] = time.perf_counter()
            await system.send(log, msg)
        return (end - first) / (time.perf_counter() - t0)

    stop = await system.tail(log, on_message)
    try:
        await paced(0, warmup)
        await asyncio.wait_for(waiters[warmup], timeout=60)
        achieved = await paced(warmup, count)
        await system.flush(log)
        await asyncio.wait_for(waiters[count], timeout=60)
    finally:
        await stop()
    ms = sorted((received[i] - sent[i]) * 1000 for i in range(warmup, count))
    return {
        "rate_per_s": per_s,
        "achieved_rate_per_s": round(achieved, 1),
        "messages": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "p999_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.999))], 3),
        "max_ms": round(ms[-1], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        **from_schedule(scheduled[warmup:], sent[warmup:], received[warmup:]),
    }


def from_schedule(
    scheduled: Sequence[float], sent: Sequence[float], received: Sequence[float]
) -> dict[str, Any]:
    """Latencies counted from when each message was due to be sent, for messages the
    publisher sent late (coordinated omission: a send that blocks, as Redis' XADD awaits its
    reply, or a stalled loop, delays the messages after it, and timing from the late send
    hides that wait); a message sent on time (after a sleep's small overshoot) counts from
    its send as above."""
    ms = sorted(
        (r - (d if s - d > LATE_S else s)) * 1000
        for d, s, r in zip(scheduled, sent, received, strict=True)
    )
    late = sum(1 for d, s in zip(scheduled, sent, strict=True) if s - d > LATE_S)
    return {
        "sent_late": late,
        "p50_ms_from_schedule": round(statistics.median(ms), 3),
        "p99_ms_from_schedule": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
    }


# A send more than this after its due time was held up (more than a sleep's overshoot).
LATE_S = 0.002


def best(rounds: list[dict[str, Any]], key: str, lowest: bool = False) -> dict[str, Any]:
    top = (min if lowest else max)(rounds, key=lambda r: r[key])
    return dict(top, **{f"rounds_{key}": [r[key] for r in rounds]})


async def run_system(
    system: System, args: argparse.Namespace, small: list[Message], large: list[Message]
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"pygazette-bench-peers-{system.name}-"))
    out: dict[str, Any] = {"settings": system.settings()}
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in [*THROUGHPUT, "latency"]}
    try:
        t0 = time.perf_counter()
        await system.start(tmp)
        out["start_seconds"] = round(time.perf_counter() - t0, 2)
        for r in range(args.rounds):
            progress(f"{system.name}: round {r + 1}/{args.rounds}")
            if "small" in args.workloads:
                pub, con = await throughput(system, f"r{r}-small", small, False, MESSAGE_BYTES)
                rounds["publish_small"].append(pub)
                rounds["consume_small"].append(con)
            if "large" in args.workloads:
                pub, con = await throughput(system, f"r{r}-large", large, True, LARGE_BYTES)
                rounds["publish_large"].append(pub)
                rounds["consume_large"].append(con)
            if "latency" in args.workloads:
                rounds["latency"].append(
                    await latency(system, f"r{r}-latency", args.latency_rate, args.latency_seconds)
                )
            progress(
                f"{system.name}: "
                + ", ".join(
                    f"{k} {v[-1]['msgs_per_s']:.0f} msgs/s {v[-1]['mb_per_s']:.1f} MB/s"
                    for k, v in rounds.items()
                    if k != "latency" and v
                )
                + "".join(
                    f", latency p50 {v[-1]['p50_ms']} ms p99 {v[-1]['p99_ms']} ms"
                    for k, v in rounds.items()
                    if k == "latency" and v
                )
            )
    finally:
        await system.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for k in ("publish_small", "consume_small"):
        if rounds[k]:
            out[k] = best(rounds[k], "msgs_per_s")
    for k in ("publish_large", "consume_large"):
        if rounds[k]:
            out[k] = best(rounds[k], "mb_per_s")
    if rounds["latency"]:
        out["latency"] = best(rounds["latency"], "p99_ms", lowest=True)
    return out


# Comparison ------------------------------------------------------------------------------

FIGURES = {
    "publish_small": ("msgs_per_s", False),
    "consume_small": ("msgs_per_s", False),
    "publish_large": ("mb_per_s", False),
    "consume_large": ("mb_per_s", False),
    "latency_p50": ("p50_ms", True),
    "latency_p99": ("p99_ms", True),
}


def figure(result: dict[str, Any], workload: str) -> float | None:
    if "error" in result or "skipped" in result:
        return None
    key, _ = FIGURES[workload]
    section = "latency" if workload.startswith("latency") else workload
    if section not in result:
        return None
    value: float = result[section][key]
    return value


def compare(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each workload's figures side by side, and pygazette's ratio to every peer."""
    table: dict[str, Any] = {}
    for workload, (key, lower_better) in FIGURES.items():
        row: dict[str, Any] = {
            "unit": key,
            "better": "lower" if lower_better else "higher",
            "figures": {name: figure(r, workload) for name, r in results.items()},
        }
        ratios: dict[str, dict[str, float | None]] = {}
        for ours in PYGAZETTE:
            mine = row["figures"].get(ours)
            if mine is None:
                continue
            ratios[ours] = {}
            for peer, theirs in row["figures"].items():
                if peer in PYGAZETTE:
                    continue
                ratios[ours][peer] = round(mine / theirs, 3) if mine and theirs else None
        row["pygazette_over_peer"] = ratios
        table[workload] = row
    return table


CPU_FIGURES = {
    "publish_small": "cpu_us_per_msg",
    "consume_small": "cpu_us_per_msg",
    "publish_large": "cpu_s_per_gb",
    "consume_large": "cpu_s_per_gb",
}


def compare_cpu(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each throughput workload's CPU (servers and client) per message or per GB, side by
    side, with pygazette's ratio to every peer (lower is better: < 1 costs less CPU)."""
    table: dict[str, Any] = {}
    for workload, key in CPU_FIGURES.items():
        figures: dict[str, float | None] = {}
        for name, r in results.items():
            section = r.get(workload) if "error" not in r and "skipped" not in r else None
            figures[name] = section.get(key) if section else None
        ratios: dict[str, dict[str, float | None]] = {}
        for ours in PYGAZETTE:
            mine = figures.get(ours)
            if mine is None:
                continue
            ratios[ours] = {
                peer: round(mine / theirs, 3) if mine and theirs else None
                for peer, theirs in figures.items()
                if peer not in PYGAZETTE
            }
        table[workload] = {
            "unit": key,
            "better": "lower",
            "figures": figures,
            "pygazette_over_peer": ratios,
        }
    return table


def targets(table: dict[str, Any]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    for ours, peers in TARGET_PEERS.items():
        for peer in peers:
            for workload in THROUGHPUT:
                r = table[workload]["pygazette_over_peer"].get(ours, {}).get(peer)
                checks.append(
                    {
                        "check": f"{ours} {workload} >= 1.0x {peer}",
                        "ratio": r,
                        "met": None if r is None else r >= 1.0,
                    }
                )
            if peer.startswith("kafka"):
                r = table["latency_p99"]["pygazette_over_peer"].get(ours, {}).get(peer)
                checks.append(
                    {
                        "check": f"{ours} latency p99 <= {peer}'s",
                        "ratio": r,
                        "met": None if r is None else r <= 1.0,
                    }
                )
    return checks


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    names = args.systems.split(",") if args.systems else ALL_SYSTEMS
    systems = [make_system(n) for n in names]
    small = small_messages(args.messages, seed=1)
    large = large_messages(args.large_records, seed=2)
    doc: dict[str, Any] = {
        "benchmark": "peers",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "workloads": {
            "messages": args.messages,
            "message_bytes": MESSAGE_BYTES,
            "large_records": args.large_records,
            "large_record_bytes": LARGE_BYTES,
            "latency_rate_per_s": args.latency_rate,
            "latency_seconds": args.latency_seconds,
            "rounds": args.rounds,
            "run": sorted(args.workloads),
            "partitions": 1,
            "json": "publishers encode each message (orjson, or pygazette's Publisher), "
            "consumers decode each one",
        },
        "note": "one run on a shared 2-core machine: figures are noisy; client and servers "
        "share the same cores",
    }
    results: dict[str, dict[str, Any]] = {}
    ok = True
    for system in systems:
        reason = await asyncio.to_thread(system.prepare)
        if reason is not None:
            progress(f"{system.name}: skipped: {reason}")
            results[system.name] = {"skipped": reason}
            continue
        progress(f"{system.name}: starting")
        try:
            results[system.name] = await run_system(system, args, small, large)
        except Exception as exc:  # reported in the JSON, the run goes on
            ok = False
            progress(traceback.format_exc())
            results[system.name] = {"error": f"{type(exc).__name__}: {exc}"}
    doc["systems"] = results
    doc["comparison"] = compare(results)
    doc["cpu_comparison"] = compare_cpu(results)
    doc["targets"] = targets(doc["comparison"])
    doc["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return doc, ok


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run of every workload")
    parser.add_argument("--systems", default="", help=f"comma-separated: {','.join(ALL_SYSTEMS)}")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--large-records", type=int, default=None)
    parser.add_argument("--latency-rate", type=float, default=1000.0)
    parser.add_argument("--latency-seconds", type=float, default=None)
    parser.add_argument(
        "--workloads", default="small,large,latency", help="comma-separated: small,large,latency"
    )
    args = parser.parse_args()
    args.workloads = set(args.workloads.split(","))
    if not args.workloads <= {"small", "large", "latency"}:
        raise SystemExit(f"unknown workloads in {args.workloads}")
    quick = args.quick
    if args.rounds is None:
        args.rounds = 1 if quick else 3
    if args.messages is None:
        args.messages = 2_000 if quick else 500_000
    if args.large_records is None:
        args.large_records = 4 if quick else 200
    if args.latency_seconds is None:
        args.latency_seconds = 0.5 if quick else 10.0
    doc, ok = asyncio.run(run(args))
    print(json.dumps(doc, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
