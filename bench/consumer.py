"""Benchmark: the consumer framework, on Gazette's stream-sum example, each figure beside a
baseline measured in the same run.

Starts etcd, a broker joined to it and two consumer processes of the stream-sum summer
(`pygazette consumer serve --app examples.stream_sum.summer:Summer`), on loopback, with 4
shards (one per chunk partition) on SQLite stores recorded to recovery logs, 1 hot standby
each. Then:

- `throughput`: S streams x M chunks (32-byte chunks, Go's size) are published first; then
  the shards are created, and each shard's rate is its partition's chunks over the time
  from its becoming primary to its last final sum being read (read-committed) — all sums
  are checked. Baseline (the ceiling): read-committed reading and JSON-decoding the same
  chunk partitions, in this process, with no processing, one journal at a time. Beside the
  rates, CPU time per chunk (Linux): the consumer processes' over the run, the ceiling's
  over its reading — a figure that the machine's other load disturbs far less. Note that
  the four shards run at once on two processes, each a single core at most (the GIL), so
  two primaries share a core while the ceiling has one to itself: the per-shard ratio is
  bounded by about half the CPU ratio. `throughput_solo` is the like-for-like figure.
- `throughput_solo`: one shard alone (S/4 streams x M chunks in a journal of its own, a
  SQLite store recorded to its recovery log, a hot standby), its rate beside the same
  ceiling measured on its journal.
- `latency`: a live chunker run (Go's scheme: a worker waits for each completed stream's
  sum) reports final chunk published -> its sum read, p50 / p99. Baseline: the round trip
  of a committed message through a journal (publish, read-committed read) with no consumer.
- `recovery`: a SQLite store of `--recovery-mb` MiB recorded to a recovery log (in
  transactions of 4 MiB), then rebuilt in a fresh process by a recovery-log Player (from
  empty hints, through the log's write head). Baseline: a plain read of the same log's
  bytes in that process.
- `takeover`: kill -9 of a shard's primary, while its hot standby is caught up; the time
  until the standby is PRIMARY, and until its first committed transaction (the sum of a
  stream published right after the kill is read), beside the lease TTL that bounds it.

    python bench/consumer.py [--quick] [--max-txn-duration 100ms]

`--recovery` runs only `recovery_vs_history` (a broker, no consumer processes): a store of
`--history-db-mb` MiB (10) takes `--history-txns` (1,000,000) small transactions (one row
rewritten, a checkpoint; two commits in flight, as a consumer pipelines them), each its own
recorded commit. At points along the way, a fresh process builds a standby from the
store's current hints (as a recovering replica does) and reports the bytes it read from
the log and the time it took, beside the log's length (the history), and which fragments
`shards prune` would keep for those hints. Baseline, at each point: a plain read of the
whole log, what a store without compaction replays at least. Both the SQLite store and the
RocksDB store (`--recovery-stores sqlite,rocksdb`; RocksDB with a `--rocksdb-write-buffer-mb`
(4) memtable, its WAL flushed into table files that compaction merges) are measured.

    python bench/consumer.py --recovery [--history-txns 20000]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.run_consumer_demo import (  # noqa: E402
    STREAM_SUM_APP,
    STREAM_SUM_PREFIX,
    ConsumerCluster,
)
from examples.stream_sum.chunker import ChunkerConfig, barrier, generate, run_chunker  # noqa: E402
from examples.stream_sum.messages import (  # noqa: E402
    CHUNKS_SELECTOR,
    FINAL_SUMS_JOURNAL,
    FRAMING,
    Sum,
    chunks_mapping,
    new_chunk,
)
from pygazette.client import JournalClient, apply_journals  # noqa: E402
from pygazette.client.append_service import AppendService  # noqa: E402
from pygazette.client.list_apply import list_all  # noqa: E402
from pygazette.client.retry_reader import read_journal  # noqa: E402
from pygazette.consumer.runner import tune_gc  # noqa: E402
from pygazette.keyspace.layout import KeyLayout  # noqa: E402
from pygazette.message.framing import CONTENT_TYPE_JSON_LINES  # noqa: E402
from pygazette.message.publisher import Publisher  # noqa: E402
from pygazette.message.reader import ReadCommitted  # noqa: E402
from pygazette.protocol.go_duration import parse_duration  # noqa: E402
from pygazette.protocol.labels import label_set  # noqa: E402
from pygazette.protocol.pb import consumer_pb2 as cpb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import recoverylog_pb2 as rpb  # noqa: E402

MiB = 1 << 20
PARTS = [f"examples/stream-sum/chunks/part-{i:03d}" for i in range(4)]
SHARDS = [f"chunks-part-{i:03d}" for i in range(4)]
SOLO_JOURNAL = "bench/consumer/solo-chunks"
SOLO_SHARD = "bench-solo"
ECHO_JOURNAL = "bench/consumer/echo"
RECOVERY_LOG = "bench/consumer/recovery-log"
RECOVERY_LOG_CT = "application/x-gazette-recoverylog"


RECOVERY_LOG_PREFIX = "examples/stream-sum/recovery-logs"


def shards_yaml(
    standbys: int,
    max_txn_duration: str = "1s",
    shards: list[tuple[str, str]] | None = None,
) -> str:
    lines = [
        "common:",
        f"  recovery_log_prefix: {RECOVERY_LOG_PREFIX}",
        "  hint_prefix: /gazette/hints",
        "  hint_backups: 2",
        f"  max_txn_duration: {max_txn_duration}",
        f"  hot_standbys: {standbys}",
        "  labels:",
        "  - name: store",
        "    value: sqlite",
        "shards:",
    ]
    for shard, part in shards if shards is not None else list(zip(SHARDS, PARTS, strict=True)):
        lines += [f"- id: {shard}", "  sources:", f"  - journal: {part}"]
    return "\n".join(lines) + "\n"


def journal_spec(name: str, content_type: str) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name, replication=1, labels=label_set({"content-type": content_type})
    )
    spec.fragment.length = 1 << 28
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 60
    return spec


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (None where /proc doesn't say)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def consumers_cpu(cluster: ConsumerCluster) -> float | None:
    """CPU seconds used so far by the running consumer processes, together."""
    total = 0.0
    for proc in cluster.consumers:
        if proc.proc is None or proc.proc.poll() is not None:
            return None
        used = cpu_seconds(proc.proc.pid)
        if used is None:
            return None
        total += used
    return total


def us_per(seconds: float | None, n: int) -> float | None:
    return None if seconds is None or not n else round(seconds / n * 1e6, 2)


# Throughput ------------------------------------------------------------------------------


async def preload(
    client: JournalClient, streams: int, chunks: int
) -> tuple[dict[bytes, Sum], dict[str, int], dict[bytes, str]]:
    """Publish every chunk of `streams` streams; (expected sums, chunks per partition,
    partition of each stream)."""
    listing = await list_all(client, CHUNKS_SELECTOR)
    mapping = chunks_mapping(listing)
    expected: dict[bytes, Sum] = {}
    per_part: dict[str, int] = dict.fromkeys(PARTS, 0)
    part_of: dict[bytes, str] = {}
    async with AppendService(client) as service:
        pub = Publisher(service, framings={CONTENT_TYPE_JSON_LINES: FRAMING})
        batch: list[dict[str, Any]] = []
        for chunk, expect in generate(streams, chunks, random.Random(11)):
            batch.append(chunk)
            if expect is not None:
                expected[expect.stream_id] = expect
            if len(batch) >= 2000:
                for c in batch:
                    journal = mapping(c)[0]
                    per_part[journal] += 1
                    part_of[bytes(c["ID"])] = journal
                pub.publish_committed_many(mapping, batch)
                batch = []
                await asyncio.sleep(0)
        for c in batch:
            journal = mapping(c)[0]
            per_part[journal] += 1
            part_of[bytes(c["ID"])] = journal
        pub.publish_committed_many(mapping, batch)
    return expected, per_part, part_of


async def primaries_times(
    cluster: ConsumerCluster, within: float = 120.0, shards: list[str] | None = None
) -> dict[str, float]:
    """Wait until every shard (of `shards`, default SHARDS) is primary; when each was
    first seen primary."""
    wanted = set(SHARDS if shards is None else shards)
    ks = await cluster.keyspace(STREAM_SUM_PREFIX)
    layout = KeyLayout(STREAM_SUM_PREFIX)
    seen: dict[str, float] = {}
    deadline = time.monotonic() + within
    while len(seen) < len(wanted):
        now = time.monotonic()
        for kv in ks.range(layout.assign_prefix):
            key = layout.parse_assignment_key(kv.key)
            if key.item not in wanted:
                continue
            status = cpb.ReplicaStatus()
            status.ParseFromString(kv.value)
            if status.code == cpb.ReplicaStatus.PRIMARY and key.item not in seen:
                seen[key.item] = now
            if status.code == cpb.ReplicaStatus.FAILED:
                raise RuntimeError(f"shard {key.item} failed: {list(status.errors)}")
        if len(seen) == len(wanted):
            break
        if now > deadline:
            raise TimeoutError(f"shards not primary: {sorted(wanted - set(seen))}")
        with contextlib.suppress(TimeoutError):
            await ks.wait_for_change(ks.revision, 1.0)
    return seen


async def read_sums(
    client: JournalClient, offset: int, expected: dict[bytes, Sum], within: float
) -> tuple[dict[bytes, float], int, int]:
    """Read committed sums from `offset` until each expected one arrived; (arrival time of
    each, mismatches, duplicates)."""
    arrived: dict[bytes, float] = {}
    mismatches = duplicates = 0
    async with ReadCommitted(
        client, FINAL_SUMS_JOURNAL, framing=FRAMING, offset=offset, block=True
    ) as it:
        async with asyncio.timeout(within):
            while len(arrived) < len(expected):
                batch = await it.next_batch()
                now = time.monotonic()
                for env in batch:
                    doc = env.message
                    sid = bytes(doc["ID"])
                    want = expected.get(sid)
                    if want is None:
                        continue
                    if sid in arrived:
                        duplicates += 1
                        continue
                    arrived[sid] = now
                    if (doc["SeqNo"], doc["Value"]) != (want.SeqNo, want.Value):
                        mismatches += 1
    return arrived, mismatches, duplicates


async def read_ceiling(client: JournalClient, journals: list[str] | None = None) -> dict[str, Any]:
    """Read-committed + decode of every chunk partition (or `journals`), one at a time, no
    processing: chunks/s each, and this process's CPU time per chunk."""
    rates = []
    total = 0
    cpu_start = time.process_time()
    for part in PARTS if journals is None else journals:
        start = time.perf_counter()
        n = 0
        async with ReadCommitted(client, part, framing=FRAMING) as it:
            while True:
                try:
                    n += len(await it.next_batch())
                except StopAsyncIteration:
                    break
        seconds = time.perf_counter() - start
        total += n
        rates.append(n / seconds if seconds > 0 else 0.0)
    return {
        "chunks": total,
        "per_journal_chunks_per_s": round(statistics.mean(rates)),
        "journals_chunks_per_s": [round(r) for r in rates],
        "cpu_us_per_chunk": us_per(time.process_time() - cpu_start, total),
    }


def cpu_ratio(ceiling: dict[str, Any], consumer_us: float | None) -> float | None:
    ceiling_us = ceiling["cpu_us_per_chunk"]
    return None if not consumer_us or ceiling_us is None else round(ceiling_us / consumer_us, 3)


async def throughput(
    cluster: ConsumerCluster, client: JournalClient, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    expected, per_part, part_of = await preload(client, args.streams, args.chunks)
    begin = await barrier(client, FINAL_SUMS_JOURNAL)
    specs = tmp / "shards.yaml"
    specs.write_text(shards_yaml(args.standbys, args.max_txn_duration))
    sums = asyncio.create_task(read_sums(client, begin, expected, args.within))
    cpu_before = consumers_cpu(cluster)
    await cluster.apply_shards(specs, cluster.consumers[0])
    primary_at = await primaries_times(cluster)
    arrived, mismatches, duplicates = await sums
    cpu_after = consumers_cpu(cluster)
    per_shard = []
    for shard, part in zip(SHARDS, PARTS, strict=True):
        last = max(t for sid, t in arrived.items() if part_of[sid] == part)
        per_shard.append(per_part[part] / max(1e-6, last - primary_at[shard]))
    elapsed = max(arrived.values()) - min(primary_at.values())
    total_chunks = sum(per_part.values())
    ceiling = await read_ceiling(client)
    shard_rate = statistics.median(per_shard)
    consumer_us = us_per(
        None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
        total_chunks,
    )
    return {
        "streams": args.streams,
        "chunks": total_chunks,
        "shards": len(SHARDS),
        "consumer_processes": 2,
        "hot_standbys": args.standbys,
        "max_txn_duration": args.max_txn_duration,
        "store": "sqlite (recorded to a recovery log)",
        "sums_verified": len(arrived) - mismatches,
        "mismatches": mismatches,
        "duplicates": duplicates,
        "per_shard_chunks_per_s": round(shard_rate),
        "shards_chunks_per_s": [round(r) for r in per_shard],
        "total_chunks_per_s": round(total_chunks / elapsed),
        "per_process_chunks_per_s": round(total_chunks / elapsed / 2),
        "seconds": round(elapsed, 3),
        "baseline_read_committed_decode": ceiling,
        "ratio_per_shard_to_baseline": round(shard_rate / ceiling["per_journal_chunks_per_s"], 3),
        "ratio_per_process_to_baseline": round(
            total_chunks / elapsed / 2 / ceiling["per_journal_chunks_per_s"], 3
        ),
        # Both consumer processes (primaries, standbys, everything) from the shards'
        # creation to the last sum.
        "consumer_cpu_us_per_chunk": consumer_us,
        "ratio_cpu_baseline_to_consumer": cpu_ratio(ceiling, consumer_us),
    }


async def throughput_solo(
    cluster: ConsumerCluster, client: JournalClient, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """One shard alone on its own journal (see the module docstring)."""
    streams = max(1, args.streams // len(PARTS))
    expected: dict[bytes, Sum] = {}
    chunks = 0

    def to_solo(_msg: Any) -> tuple[str, str]:
        return SOLO_JOURNAL, CONTENT_TYPE_JSON_LINES

    async with AppendService(client) as service:
        pub = Publisher(service, framings={CONTENT_TYPE_JSON_LINES: FRAMING})
        batch: list[dict[str, Any]] = []
        for chunk, expect in generate(streams, args.chunks, random.Random(15)):
            batch.append(chunk)
            if expect is not None:
                expected[expect.stream_id] = expect
            if len(batch) >= 2000:
                chunks += len(batch)
                pub.publish_committed_many(to_solo, batch)
                batch = []
                await asyncio.sleep(0)
        chunks += len(batch)
        pub.publish_committed_many(to_solo, batch)
    begin = await barrier(client, FINAL_SUMS_JOURNAL)
    specs = tmp / "solo-shard.yaml"
    specs.write_text(
        shards_yaml(args.standbys, args.max_txn_duration, [(SOLO_SHARD, SOLO_JOURNAL)])
    )
    sums = asyncio.create_task(read_sums(client, begin, expected, args.within))
    before = {p.member_id: cpu_seconds(p.proc.pid) for p in cluster.consumers if p.proc}
    await cluster.apply_shards(specs, cluster.consumers[0])
    primary_at = (await primaries_times(cluster, shards=[SOLO_SHARD]))[SOLO_SHARD]
    primary = await cluster.primary_of(STREAM_SUM_PREFIX, SOLO_SHARD)
    arrived, mismatches, duplicates = await sums
    used = None
    if primary is not None and primary.proc is not None:
        start, end = before.get(primary.member_id), cpu_seconds(primary.proc.pid)
        used = None if start is None or end is None else end - start
    rate = chunks / max(1e-6, max(arrived.values()) - primary_at)
    ceiling = await read_ceiling(client, [SOLO_JOURNAL])
    primary_us = us_per(used, chunks)
    return {
        "streams": streams,
        "chunks": chunks,
        "sums_verified": len(arrived) - mismatches,
        "mismatches": mismatches,
        "duplicates": duplicates,
        "chunks_per_s": round(rate),
        "baseline_read_committed_decode": ceiling,
        "ratio_to_baseline": round(rate / ceiling["per_journal_chunks_per_s"], 3),
        # The primary's process, from the shard's creation to its last sum.
        "primary_cpu_us_per_chunk": primary_us,
        "ratio_cpu_baseline_to_primary": cpu_ratio(ceiling, primary_us),
    }


# Latency ---------------------------------------------------------------------------------


async def echo_latency(client: JournalClient, n: int) -> dict[str, Any]:
    """Round trip of a committed message through a journal: publish -> read-committed."""
    times: list[float] = []
    start_offset = await barrier(client, ECHO_JOURNAL)
    async with AppendService(client) as service:
        pub = Publisher(service, framings={CONTENT_TYPE_JSON_LINES: FRAMING})
        async with ReadCommitted(
            client, ECHO_JOURNAL, framing=FRAMING, offset=start_offset, block=True
        ) as it:
            for i in range(n):
                sent = time.monotonic()
                pub.publish_committed(
                    lambda _m: (ECHO_JOURNAL, CONTENT_TYPE_JSON_LINES),
                    new_chunk(bytes(16), i + 1, b"x" * 32),
                )
                await it.__anext__()
                times.append(time.monotonic() - sent)
    return {"p50_ms": ms(pct(times, 0.5)), "p99_ms": ms(pct(times, 0.99)), "messages": n}


async def latency(cluster: ConsumerCluster, args: argparse.Namespace) -> dict[str, Any]:
    cfg = ChunkerConfig(
        broker=cluster.broker.url,
        streams=args.latency_streams,
        chunks=args.latency_chunks,
        workers=4,
        consumer=cluster.consumers[0].url,
        seed=12,
    )
    summary = await run_chunker(cfg)
    async with JournalClient(cluster.broker.url) as client:
        echo = await echo_latency(client, 200 if args.quick else 1000)
    lat = summary["sum_latency_ms"]
    return {
        "chunker_ok": summary["ok"],
        "streams": summary["streams"],
        "chunks": summary["chunks"],
        "verified": summary["verified"],
        "chunker_chunks_per_s": summary["chunks_per_s"],
        "sum_p50_ms": lat["p50"],
        "sum_p99_ms": lat["p99"],
        "baseline_journal_round_trip": echo,
        "ratio_p50_to_baseline": round(lat["p50"] / max(0.01, echo["p50_ms"]), 1),
    }


# Recovery --------------------------------------------------------------------------------


async def record_store(client: JournalClient, directory: Path, mib: int) -> dict[str, Any]:
    """A SQLite store of `mib` MiB of rows, recorded to RECOVERY_LOG."""
    from pygazette.consumer.recoverylog import Author, Player, Recorder
    from pygazette.consumer.sqlite_store import SQLiteStore

    player = Player(client, rpb.FSMHints(log=RECOVERY_LOG), directory)
    author = Author.random()
    player.inject_handoff(author)
    fsm = await player.play()
    recorder = Recorder(client, fsm, author, directory)
    store = SQLiteStore(
        recorder, bootstrap_sql="CREATE TABLE IF NOT EXISTS kv(k INTEGER PRIMARY KEY, v BLOB);"
    )
    rng = random.Random(13)
    row_bytes = 200
    rows_per_txn = 4 * MiB // row_bytes
    k = 0
    start = time.perf_counter()
    try:
        while store.path.stat().st_size < mib * MiB:
            rows = [(k + i, rng.randbytes(row_bytes)) for i in range(rows_per_txn)]
            k += rows_per_txn
            store.db.executemany("INSERT INTO kv VALUES(?, ?)", rows)
            await store.start_commit(None, cpb.Checkpoint(), [])  # type: ignore[arg-type]
        db_bytes = store.path.stat().st_size
    finally:
        store.destroy()
    return {
        "db_bytes": db_bytes,
        "rows": k,
        "record_seconds": round(time.perf_counter() - start, 3),
    }


async def play_log(broker: str, log: str) -> dict[str, Any]:
    """In a fresh process: a plain read of the log, then a Player rebuilding the store."""
    from pygazette.consumer.recoverylog import Player

    out: dict[str, Any] = {}
    async with JournalClient(broker) as client:
        for round_ in range(2):
            start = time.perf_counter()
            n = 0
            async for chunk in read_journal(client, log):
                n += len(chunk)
            read_s = time.perf_counter() - start
            directory = Path(tempfile.mkdtemp(prefix="bench-play-"))
            try:
                start = time.perf_counter()
                player = Player(client, rpb.FSMHints(log=log), directory / "store")
                player.finish_at_write_head()
                await player.play()
                play_s = time.perf_counter() - start
                db = directory / "store" / "store.sqlite"
                db_bytes = db.stat().st_size
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            if round_ == 0 or play_s < out["play_seconds"]:
                out.update(play_seconds=play_s, db_bytes=db_bytes)
            if round_ == 0 or read_s < out["read_seconds"]:
                out.update(read_seconds=read_s, log_bytes=n)
    return out


async def recovery(cluster: ConsumerCluster, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    async with JournalClient(cluster.broker.url) as client:
        built = await record_store(client, tmp / "recorded", args.recovery_mb)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "bench" / "consumer.py"),
        "--play-log",
        RECOVERY_LOG,
        "--broker",
        cluster.broker.url,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("the playing process failed")
    played = json.loads(out)
    log_mb = played["log_bytes"] / 1e6
    return {
        "db_mb": round(built["db_bytes"] / 1e6, 1),
        "log_mb": round(log_mb, 1),
        "rows": built["rows"],
        "rebuilt_db_matches": played["db_bytes"] == built["db_bytes"],
        "player_seconds": round(played["play_seconds"], 3),
        "player_mb_per_s": round(log_mb / played["play_seconds"], 1),
        "baseline_plain_read_seconds": round(played["read_seconds"], 3),
        "baseline_plain_read_mb_per_s": round(log_mb / played["read_seconds"], 1),
        "ratio_to_baseline": round(played["read_seconds"] / played["play_seconds"], 3),
    }


# Recovery against history length (--recovery) --------------------------------------------

HISTORY_LOG_PREFIX = "bench/consumer/history-log"
HISTORY_FRAGMENT = 16 * MiB


def recovered_bytes() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("gazette_recoverylog_recovered_bytes_total") or 0.0


async def play_hints(broker: str, hints: rpb.FSMHints, plain_read: bool) -> dict[str, Any]:
    """In a fresh process: a Player from `hints` (as a recovering replica does); the bytes
    it read from the log, its time; with `plain_read`, a plain read of the whole log too
    (the baseline)."""
    from pygazette.consumer.recoverylog import Player

    out: dict[str, Any] = {}
    async with JournalClient(broker) as client:
        directory = Path(tempfile.mkdtemp(prefix="bench-play-"))
        try:
            before = recovered_bytes()
            start = time.perf_counter()
            player = Player(client, hints, directory / "store")
            player.finish_at_write_head()
            await player.play()
            out["play_seconds"] = time.perf_counter() - start
            out["play_bytes"] = int(recovered_bytes() - before)
            out["files"] = {
                str(p.relative_to(directory / "store")): p.stat().st_size
                for p in (directory / "store").rglob("*")
                if p.is_file()
            }
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        if plain_read:
            start = time.perf_counter()
            n = 0
            async for chunk in read_journal(client, hints.log):
                n += len(chunk)
            out["read_seconds"] = time.perf_counter() - start
            out["log_bytes"] = n
    return out


async def measure_hints(
    broker: str, hints: rpb.FSMHints, tmp: Path, plain_read: bool
) -> dict[str, Any]:
    from pygazette.consumer.hints import encode_hints

    path = tmp / "hints.json"
    path.write_bytes(encode_hints(hints))
    cmd = [sys.executable, str(ROOT / "bench" / "consumer.py"), "--play-hints", str(path)]
    cmd += ["--broker", broker] + (["--plain-read"] if plain_read else [])
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("the playing process failed")
    played: dict[str, Any] = json.loads(out)
    return played


async def prune_keeps(client: JournalClient, hints: rpb.FSMHints) -> tuple[int, int]:
    """(fragments, bytes) of the log that `shards prune` keeps for `hints` (it removes the
    others), by its own rule."""
    from pygazette.cli.shards_cmd import live_segments, overlaps_any_segment
    from pygazette.client.fragments import list_all_fragments

    segments = live_segments(hints)
    kept = [
        f.spec
        for f in await list_all_fragments(client, hints.log)
        if overlaps_any_segment(segments, f.spec)
    ]
    return len(kept), sum(f.end - f.begin for f in kept)


def history_points(args: argparse.Namespace) -> list[int]:
    """The transaction counts at which `--recovery` measures: `--history-points`, fractions
    of `--history-txns` (a run cut short still reports every point it passed)."""
    fractions = [float(f) for f in args.history_points.split(",")]
    return sorted({max(1, int(args.history_txns * f)) for f in fractions})


async def sqlite_history(
    client: JournalClient, broker: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """The SQLite store's rows of `recovery_vs_history` (see the module docstring)."""
    from pygazette.consumer.recoverylog import Author, Player, Recorder
    from pygazette.consumer.sqlite_store import SQLiteStore

    log = f"{HISTORY_LOG_PREFIX}/sqlite"
    spec = journal_spec(log, RECOVERY_LOG_CT)
    spec.fragment.length = HISTORY_FRAGMENT
    await apply_journals(client, [pb.ApplyRequest.Change(upsert=spec)])
    directory = tmp / "history-sqlite"
    player = Player(client, rpb.FSMHints(log=log), directory)
    author = Author.random()
    player.inject_handoff(author)
    recorder = Recorder(client, await player.play(), author, directory)
    store = SQLiteStore(
        recorder, bootstrap_sql="CREATE TABLE IF NOT EXISTS kv(k INTEGER PRIMARY KEY, v BLOB);"
    )
    rng = random.Random(15)
    row_bytes = 100
    # Fill the store, in transactions of 4 MiB (or half the store, if smaller).
    k = 0
    fill = min(4 * MiB, args.history_db_mb * MiB // 2)
    while store.path.stat().st_size < args.history_db_mb * MiB:
        batch = [(k + i, rng.randbytes(row_bytes)) for i in range(fill // row_bytes)]
        k += len(batch)
        store.db.executemany("INSERT INTO kv VALUES(?, ?)", batch)
        await store.start_commit(None, cpb.Checkpoint(), [])  # type: ignore[arg-type]
    rows_total = k
    points = history_points(args)
    out: list[dict[str, Any]] = []
    cp = cpb.Checkpoint()
    inflight: list[Any] = []
    done = 0
    start = time.perf_counter()
    try:
        for point in points:
            while done < point:
                done += 1
                store.db.execute(
                    "UPDATE kv SET v = ? WHERE k = ?",
                    (rng.randbytes(row_bytes), rng.randrange(rows_total)),
                )
                cp.sources["bench/source"].read_through = done
                inflight.append(store.start_commit(None, cp, []))  # type: ignore[arg-type]
                if len(inflight) >= 2:
                    await inflight.pop(0)
            for fut in inflight:
                await fut
            inflight.clear()
            elapsed = time.perf_counter() - start
            hints = recorder.build_hints()
            head = recorder.write_head
            played = await measure_hints(broker, hints, tmp, plain_read=True)
            kept_fragments, kept_bytes = await prune_keeps(client, hints)
            db_bytes = store.path.stat().st_size
            row: dict[str, Any] = {
                "transactions": point,
                "history_mb": round(head / 1e6, 1),
                "history_to_store": round(head / db_bytes, 1),
                "compactions": store.compactions,
                "playback_mb": round(played["play_bytes"] / 1e6, 2),
                "playback_to_store": round(played["play_bytes"] / db_bytes, 2),
                "playback_seconds": round(played["play_seconds"], 3),
                "rebuilt_matches": played["files"] == {"store.sqlite": db_bytes},
                "prune_keeps_fragments": kept_fragments,
                "prune_keeps_mb": round(kept_bytes / 1e6, 1),
                "txns_per_s": round(point / elapsed, 1),
                "baseline_plain_read_of_history_seconds": round(played["read_seconds"], 3),
                "playback_time_to_baseline": round(
                    played["play_seconds"] / played["read_seconds"], 3
                ),
            }
            out.append(row)
            print(json.dumps({"sqlite": row}), file=sys.stderr, flush=True)
        db_mb = round(store.path.stat().st_size / 1e6, 1)
    finally:
        store.destroy()
    return {"store": "sqlite", "db_mb": db_mb, "rows": rows_total, "points": out}


async def rocksdb_history(
    client: JournalClient, broker: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """The RocksDB store's rows of `recovery_vs_history`: as the SQLite store's, on a
    RocksDBStore (100-byte values under 8-byte keys, one point update per transaction) with
    a `--rocksdb-write-buffer-mb` memtable, so its WAL is flushed into table files, which
    compaction merges (deleting the old ones) and the hints then skip."""
    from pygazette.consumer.recoverylog import Author, Player, Recorder
    from pygazette.consumer.rocksdb_store import RocksDBStore, default_options

    log = f"{HISTORY_LOG_PREFIX}/rocksdb"
    spec = journal_spec(log, RECOVERY_LOG_CT)
    spec.fragment.length = HISTORY_FRAGMENT
    await apply_journals(client, [pb.ApplyRequest.Change(upsert=spec)])
    directory = tmp / "history-rocksdb"
    player = Player(client, rpb.FSMHints(log=log), directory)
    author = Author.random()
    player.inject_handoff(author)
    recorder = Recorder(client, await player.play(), author, directory)
    options = default_options()
    options.set_write_buffer_size(args.rocksdb_write_buffer_mb * MiB)
    store = RocksDBStore(recorder, options=options)

    def store_bytes() -> int:
        return sum(store.recorded_files.values())

    rng = random.Random(15)
    row_bytes = 100
    fill = min(4 * MiB, args.history_db_mb * MiB // 2)
    k = 0
    while k * row_bytes < args.history_db_mb * MiB:
        for i in range(fill // row_bytes):
            store.put((k + i).to_bytes(8, "big"), rng.randbytes(row_bytes))
        k += fill // row_bytes
        await store.start_commit(None, cpb.Checkpoint(), [])  # type: ignore[arg-type]
    rows_total = k
    points = history_points(args)
    out: list[dict[str, Any]] = []
    cp = cpb.Checkpoint()
    inflight: list[Any] = []
    done = 0
    start = time.perf_counter()
    try:
        for point in points:
            while done < point:
                done += 1
                key = rng.randrange(rows_total).to_bytes(8, "big")
                store.put(key, rng.randbytes(row_bytes))
                cp.sources["bench/source"].read_through = done
                inflight.append(store.start_commit(None, cp, []))  # type: ignore[arg-type]
                if len(inflight) >= 2:
                    await inflight.pop(0)
            for fut in inflight:
                await fut
            inflight.clear()
            elapsed = time.perf_counter() - start
            hints = recorder.build_hints()
            head = recorder.write_head
            played = await measure_hints(broker, hints, tmp, plain_read=True)
            kept_fragments, kept_bytes = await prune_keeps(client, hints)
            db_bytes = store_bytes()
            row: dict[str, Any] = {
                "transactions": point,
                "history_mb": round(head / 1e6, 1),
                "history_to_store": round(head / db_bytes, 1),
                "store_mb": round(db_bytes / 1e6, 2),
                "playback_mb": round(played["play_bytes"] / 1e6, 2),
                "playback_to_store": round(played["play_bytes"] / db_bytes, 2),
                "playback_seconds": round(played["play_seconds"], 3),
                "rebuilt_matches": played["files"] == store.recorded_files,
                "prune_keeps_fragments": kept_fragments,
                "prune_keeps_mb": round(kept_bytes / 1e6, 1),
                "txns_per_s": round(point / elapsed, 1),
                "baseline_plain_read_of_history_seconds": round(played["read_seconds"], 3),
                "playback_time_to_baseline": round(
                    played["play_seconds"] / played["read_seconds"], 3
                ),
            }
            out.append(row)
            print(json.dumps({"rocksdb": row}), file=sys.stderr, flush=True)
        db_mb = round(store_bytes() / 1e6, 1)
    finally:
        store.destroy()
    return {
        "store": "rocksdb",
        "db_mb": db_mb,
        "rows": rows_total,
        "write_buffer_mb": args.rocksdb_write_buffer_mb,
        "points": out,
    }


async def recovery_vs_history(args: argparse.Namespace) -> dict[str, Any]:
    """`--recovery`: the stores' recovery against history length (a broker, no consumers)."""
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-bench-recovery-"))
    cluster = ConsumerCluster(tmp, lease_ttl=args.lease_ttl)
    result: dict[str, Any] = {
        "benchmark": "consumer-recovery-vs-history",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "history_txns": args.history_txns,
        "history_db_mb": args.history_db_mb,
    }
    try:
        cluster.start()
        async with JournalClient(cluster.broker.url) as client:
            if "sqlite" in args.recovery_stores.split(","):
                result["sqlite"] = await sqlite_history(client, cluster.broker.url, args, tmp)
            if "rocksdb" in args.recovery_stores.split(","):
                result["rocksdb"] = await rocksdb_history(client, cluster.broker.url, args, tmp)
        result["load_average"] = os.getloadavg()
    finally:
        await cluster.close()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


# Takeover --------------------------------------------------------------------------------


async def takeover(cluster: ConsumerCluster, args: argparse.Namespace) -> dict[str, Any]:
    shard, part = SHARDS[0], PARTS[0]
    rounds: list[dict[str, float]] = []
    async with JournalClient(cluster.broker.url) as client:
        mapping = chunks_mapping(await list_all(client, CHUNKS_SELECTOR))
        rng = random.Random(14)
        for _ in range(args.takeover_rounds):
            await cluster.wait_ready(STREAM_SUM_PREFIX, SHARDS, standbys=1)
            victim = await cluster.primary_of(STREAM_SUM_PREFIX, shard)
            assert victim is not None
            begin = await barrier(client, FINAL_SUMS_JOURNAL)
            sid = rng.randbytes(16)
            while mapping(new_chunk(sid, 1, b""))[0] != part:
                sid = rng.randbytes(16)
            expect = Sum.of_stream(sid)
            chunks = [new_chunk(sid, 1, b"takeover"), new_chunk(sid, 2, None)]
            expect.update(chunks[0])
            expect.update(chunks[1])
            sums = asyncio.create_task(read_sums(client, begin, {sid: expect}, args.within))
            killed = time.monotonic()
            victim.kill()
            async with AppendService(client) as service:
                pub = Publisher(service, framings={CONTENT_TYPE_JSON_LINES: FRAMING})
                for aa in pub.publish_committed_many(mapping, chunks):
                    await aa

            promoted = 0.0
            ks = await cluster.keyspace(STREAM_SUM_PREFIX)
            while not promoted:
                slot0 = (await cluster.replicas(STREAM_SUM_PREFIX)).get(shard, {}).get(0)
                if (
                    slot0
                    and slot0[0] != victim.member_id
                    and slot0[1].code == cpb.ReplicaStatus.PRIMARY
                ):
                    promoted = time.monotonic()
                    break
                if time.monotonic() - killed > args.within:
                    raise TimeoutError("no new primary")
                with contextlib.suppress(TimeoutError):
                    await ks.wait_for_change(ks.revision, 1.0)
            arrived, mismatches, duplicates = await sums
            assert not mismatches and not duplicates
            rounds.append(
                {
                    "to_primary_s": round(promoted - killed, 3),
                    "to_first_commit_s": round(arrived[sid] - killed, 3),
                }
            )
            victim.start()  # As a supervisor would; it becomes the new standby.
    best = min(rounds, key=lambda r: r["to_first_commit_s"])
    lease = parse_duration(args.lease_ttl) / 1e9
    return {
        "lease_ttl_s": lease,
        "kill_to_primary_s": best["to_primary_s"],
        "kill_to_first_commit_s": best["to_first_commit_s"],
        "first_commit_after_lease_s": round(best["to_first_commit_s"] - lease, 3),
        "rounds": rounds,
    }


# Main ------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-bench-consumer-"))
    cluster = ConsumerCluster(tmp, lease_ttl=args.lease_ttl)
    result: dict[str, Any] = {
        "benchmark": "consumer",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "quick": args.quick,
    }
    try:
        cluster.start()
        await cluster.apply_journals(ROOT / "examples" / "stream_sum" / "journalspace.yaml")
        async with JournalClient(cluster.broker.url) as client:
            await apply_journals(
                client,
                [
                    pb.ApplyRequest.Change(
                        upsert=journal_spec(ECHO_JOURNAL, CONTENT_TYPE_JSON_LINES)
                    ),
                    pb.ApplyRequest.Change(upsert=journal_spec(RECOVERY_LOG, RECOVERY_LOG_CT)),
                    pb.ApplyRequest.Change(
                        upsert=journal_spec(SOLO_JOURNAL, CONTENT_TYPE_JSON_LINES)
                    ),
                    pb.ApplyRequest.Change(
                        upsert=journal_spec(f"{RECOVERY_LOG_PREFIX}/{SOLO_SHARD}", RECOVERY_LOG_CT)
                    ),
                ],
            )
            for i in range(2):
                cluster.add_consumer(STREAM_SUM_APP, STREAM_SUM_PREFIX, f"summer-{i}")
            result["throughput"] = await throughput(cluster, client, args, tmp)
            result["throughput_solo"] = await throughput_solo(cluster, client, args, tmp)
        result["latency"] = await latency(cluster, args)
        result["recovery"] = await recovery(cluster, args, tmp)
        result["takeover"] = await takeover(cluster, args)
        result["load_average"] = os.getloadavg()
    finally:
        await cluster.close()
        for proc in cluster.consumers:
            proc.kill()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    parser.add_argument("--streams", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=0)
    parser.add_argument("--latency-streams", type=int, default=0)
    parser.add_argument("--latency-chunks", type=int, default=0)
    parser.add_argument("--recovery-mb", type=int, default=0)
    parser.add_argument("--takeover-rounds", type=int, default=0)
    parser.add_argument("--standbys", type=int, default=1)
    parser.add_argument("--lease-ttl", default="3s")
    parser.add_argument(
        "--max-txn-duration", default="1s", help="the shards' max_txn_duration (Go duration)"
    )
    parser.add_argument("--within", type=float, default=300.0, help="seconds a phase may take")
    parser.add_argument(
        "--recovery", action="store_true", help="only recovery against history length"
    )
    parser.add_argument("--history-txns", type=int, default=1_000_000)
    parser.add_argument("--history-db-mb", type=int, default=10)
    parser.add_argument(
        "--history-points",
        default="0.01,0.1,0.3,1.0",
        help="--recovery measures at these fractions of --history-txns (comma-separated)",
    )
    parser.add_argument(
        "--recovery-stores", default="sqlite,rocksdb", help="--recovery's stores (comma-separated)"
    )
    parser.add_argument("--rocksdb-write-buffer-mb", type=int, default=4)
    parser.add_argument("--play-log", help=argparse.SUPPRESS)
    parser.add_argument("--play-hints", help=argparse.SUPPRESS)
    parser.add_argument("--plain-read", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # The consumer processes run with `tune_gc()`; so does this process's ceiling reader,
    # or the ratios would compare collector settings rather than the consumer.
    tune_gc()
    if args.play_log:
        print(json.dumps(asyncio.run(play_log(args.broker, args.play_log))))
        return
    if args.play_hints:
        from pygazette.consumer.hints import decode_hints

        hints = decode_hints(Path(args.play_hints).read_bytes())
        print(json.dumps(asyncio.run(play_hints(args.broker, hints, args.plain_read))))
        return
    if args.recovery:
        print(json.dumps(asyncio.run(recovery_vs_history(args)), indent=2))
        return
    defaults = (
        {
            "streams": 100,
            "chunks": 100,
            "latency_streams": 40,
            "latency_chunks": 20,
            "recovery_mb": 8,
            "takeover_rounds": 1,
        }
        if args.quick
        else {
            "streams": 1000,
            "chunks": 250,
            "latency_streams": 200,
            "latency_chunks": 50,
            "recovery_mb": 128,
            "takeover_rounds": 3,
        }
    )
    for key, value in defaults.items():
        if not getattr(args, key):
            setattr(args, key, value)
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
