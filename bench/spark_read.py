"""Benchmark: the Spark connector against Spark's own sources, in the same run.

- batch: rows/s reading small JSON records from a journal's fragments with
  ``spark.read.format("gazette")``, beside Spark's native ``spark.read.json`` over the very
  same fragment files (uncompressed, so Spark can read them), both with the same schema and
  materialised into Spark's no-op sink;
- streaming: rows/s of ``readStream.format("gazette")`` with Trigger.AvailableNow, beside
  Spark's file stream source over the same files;
- latency: append-to-sink p50/p90 of a running journal -> journal query (the time from an
  append's commit until its record is readable in the output journal), beside the broker's
  own append-to-read latency (a blocking reader of the input journal).

With ``--vs-kafka``, instead: the gazette source against Spark's Kafka source
(``spark-sql-kafka-0-10``) over the same records in a journal and in a Kafka topic, batch
``read`` and ``readStream`` with Trigger.AvailableNow, raw bytes and JSON decoded into the
same schema (see bench/spark_kafka.py for exactly what is measured).

    python bench/spark_read.py [--quick] [--records N] [--runs N]
    python bench/spark_read.py --vs-kafka [--quick] [--records N] [--runs N] [--partitions N]
    python bench/spark_read.py --cluster [--quick] [--records N] [--runs N]

With ``--read-committed``, instead: batch reads of transactional records (JSON with a
``uuid`` field; each transaction of ``--txn`` messages ends with its ACK) with option
``readCommitted``, beside the same read without it (every record, ACKs included) in the same
run: what deciding each message by its UUID costs; then the same as streams (Trigger.AvailableNow,
micro-batches of 32 MiB in two partitions each).

    python bench/spark_read.py --read-committed [--quick] [--records N] [--runs N] [--txn N]

With ``--cluster``, instead: batch reads on a standalone Spark cluster (a master and two
one-core workers on loopback, tests/support/spark_cluster.py), by an application allowed one
executor core (one worker) and then two (both workers), rows/s of each, the gazette source
beside Spark's own JSON reader over the same fragment files on the same executors.

Prints one JSON document. Runs Spark local[2] (or the cluster) and a broker on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from pygazette.client import SyncJournalClient  # noqa: E402
from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from tests.support.listening_process import start_listening  # noqa: E402

SCHEMA = "id LONG, user STRING, page STRING, ms INT, ok BOOLEAN"
MiB = 1 << 20


class Broker:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.port: int | None = None  # A free one at the first start; restarts keep it.
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "not started"
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.proc, self.port = start_listening(
            lambda port: [
                sys.executable,
                "-m",
                "pygazette.cli.main",
                "serve",
                "--port",
                str(port),
                "--data-dir",
                str(self.data),
            ],
            self.data.parent / "broker.log",
            port=self.port,
            what="broker",
        )

    def stop(self) -> None:
        """SIGTERM: the broker persists its open spools before exiting."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def spec(name: str, codec: int = pb.NONE, length: int = 16 * MiB) -> pb.JournalSpec:
    s = pb.JournalSpec(name=name, replication=1)
    s.fragment.length = length
    s.fragment.compression_codec = codec  # type: ignore[assignment]
    s.fragment.stores.append("file:///")
    s.fragment.refresh_interval.seconds = 1
    return s


def create(client: SyncJournalClient, *specs: pb.JournalSpec) -> None:
    client.apply_journals([pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs])


def records(first: int, count: int) -> bytes:
    pages = ["/", "/docs", "/pricing", "/blog"]
    return b"".join(
        b'{"id":%d,"user":"user-%03d","page":"%s","ms":%d,"ok":%s}\n'
        % (i, i % 997, pages[i % 4].encode(), i % 1000, b"true" if i % 3 else b"false")
        for i in range(first, first + count)
    )


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def best_of(runs: int, fn: object) -> float:
    return min(timed(fn) for _ in range(runs))


def bench_batch(
    spark: SparkSession,
    url: str,
    journal: str,
    files: list[str],
    rows: int,
    runs: int,
    file_root: str,
) -> dict[str, float]:
    ours = (
        spark.read.format("gazette")
        .schema(SCHEMA)
        .option("broker", url)
        .option("journals", journal)
        .option("framing", "json")
        .option("fileRoot", file_root)  # Fragment files are read directly, as Spark's are.
        .load()
    )
    native = spark.read.schema(SCHEMA).json(files)
    assert ours.count() == rows and native.count() == rows
    noop(ours)
    noop(native)  # Warm both up.
    t_ours, t_native = [], []
    for _ in range(runs):  # Interleaved, so both see the same machine load.
        t_ours.append(timed(lambda: noop(ours)))
        t_native.append(timed(lambda: noop(native)))
    ours_rps, native_rps = rows / min(t_ours), rows / min(t_native)
    return {
        "gazette_rows_per_s": round(ours_rps),
        "spark_json_rows_per_s": round(native_rps),
        "ratio": round(ours_rps / native_rps, 3),
    }


def bench_stream(
    spark: SparkSession,
    url: str,
    journal: str,
    fragment_dir: str,
    rows: int,
    scratch: Path,
    file_root: str,
    runs: int = 1,
) -> dict[str, object]:
    def run(df: DataFrame, name: str) -> float:
        query = (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(scratch / f"ck-{name}-{time.monotonic_ns()}"))
            .trigger(availableNow=True)
        )
        return timed(lambda: query.start().awaitTermination())

    ours = (
        spark.readStream.format("gazette")
        .schema(SCHEMA)
        .option("broker", url)
        .option("journals", journal)
        .option("framing", "json")
        .option("startingOffsets", "earliest")
        .option("maxBytesPerTrigger", str(32 * MiB))
        .option("minPartitions", "2")  # Streams are not split by core count (see planning).
        .option("fileRoot", file_root)
        .load()
    )
    native = (
        spark.readStream.schema(SCHEMA)
        .option("maxBytesPerTrigger", str(32 * MiB))
        .option("pathGlobFilter", "*.raw")
        .json(fragment_dir)
    )
    run(ours, "warm-gazette")
    run(native, "warm-files")
    t_ours, t_native = [], []
    for i in range(runs):  # Interleaved, best of each, as the batch reads are.
        t_ours.append(run(ours, f"gazette-{i}"))
        t_native.append(run(native, f"files-{i}"))
    return {
        "gazette_rows_per_s": round(rows / min(t_ours)),
        "spark_file_stream_rows_per_s": round(rows / min(t_native)),
        "ratio": round(min(t_native) / min(t_ours), 3),
        "rounds_seconds": {
            "gazette": [round(t, 3) for t in t_ours],
            "file_stream": [round(t, 3) for t in t_native],
        },
    }


def bench_latency(spark: SparkSession, url: str, samples: int, scratch: Path) -> dict[str, float]:
    src, out = "bench/spark/latency/in", "bench/spark/latency/out"
    with SyncJournalClient(url) as client:
        create(client, spec(src, pb.SNAPPY), spec(out, pb.SNAPPY))
        query = (
            spark.readStream.format("gazette")
            .option("broker", url)
            .option("journals", src)
            .option("framing", "lines")
            .option("startingOffsets", "earliest")
            .load()
            .select("value")
            .writeStream.format("gazette")
            .option("broker", url)
            .option("journal", out)
            .option("framing", "lines")
            .option("checkpointLocation", str(scratch / "ck-latency"))
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            sink = arrivals(client, out, samples + 1)
            direct = arrivals(client, src, samples + 1)
            client.append(src, b"warm-up\n")
            sink.wait_for(1, 120)
            sent: dict[int, float] = {}
            for i in range(samples):
                sent[i] = time.perf_counter()
                client.append(src, b"%d\n" % i)
                sink.wait_for(i + 2, 30)
            sink_lat = [sink.times[i + 1] - sent[i] for i in range(samples)]
            direct_lat = [direct.times[i + 1] - sent[i] for i in range(samples)]
        finally:
            query.stop()
    sink_lat.sort()
    direct_lat.sort()
    return {
        "append_to_sink_p50_ms": round(1000 * statistics.median(sink_lat), 1),
        "append_to_sink_p90_ms": round(1000 * sink_lat[int(0.9 * (len(sink_lat) - 1))], 1),
        "append_to_read_p50_ms": round(1000 * statistics.median(direct_lat), 1),
        "ratio": round(statistics.median(sink_lat) / statistics.median(direct_lat), 1),
    }


class arrivals:
    """A blocking reader on its own thread, noting when each line arrives."""

    def __init__(self, client: SyncJournalClient, journal: str, expect: int) -> None:
        self.times: list[float] = []
        self.cond = threading.Condition()
        self.reader = SyncJournalClient(client.address)
        thread = threading.Thread(target=self._run, args=(journal, expect), daemon=True)
        thread.start()

    def _run(self, journal: str, expect: int) -> None:
        pending = b""
        for chunk in self.reader.read(journal, offset=0, block=True):
            now = time.perf_counter()
            pending += chunk
            lines = pending.count(b"\n")
            pending = pending[pending.rfind(b"\n") + 1 :]
            with self.cond:
                self.times.extend([now] * lines)
                self.cond.notify_all()
            if len(self.times) >= expect:
                return

    def wait_for(self, count: int, timeout: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.times) >= count, timeout):
                raise TimeoutError(f"{count} records did not arrive")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, fewer runs")
    parser.add_argument("--records", type=int, default=0)
    parser.add_argument(
        "--vs-kafka",
        action="store_true",
        help="instead: the gazette source against Spark's Kafka source (spark-sql-kafka-0-10)",
    )
    parser.add_argument(
        "--runs", type=int, default=0, help="timed runs of each read (best is reported)"
    )
    parser.add_argument(
        "--partitions", type=int, default=2, help="--vs-kafka: minPartitions of both sources"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="instead: batch reads on a standalone cluster with one worker, then two",
    )
    parser.add_argument(
        "--read-committed",
        action="store_true",
        help="instead: batch reads with option readCommitted beside reads without it",
    )
    parser.add_argument(
        "--txn", type=int, default=100, help="--read-committed: messages per transaction"
    )
    args = parser.parse_args()
    rows = args.records or (200_000 if args.quick else 1_000_000)
    runs = args.runs or (2 if args.quick else 3)
    if args.vs_kafka:
        sys.exit(main_vs_kafka(rows, runs, args.partitions))
    if args.cluster:
        sys.exit(main_cluster(rows, runs))
    if args.read_committed:
        sys.exit(main_read_committed(rows, runs, args.txn))

    with tempfile.TemporaryDirectory(prefix="pygazette-bench-spark-") as tmp:
        scratch = Path(tmp)
        broker = Broker(scratch / "data")
        journal = "bench/spark/events"
        load_journal(broker, journal, rows)
        file_root = str(scratch / "data" / "fragments")
        fragment_dir = scratch / "data" / "fragments" / journal
        files = sorted(str(p) for p in fragment_dir.glob("*.raw"))
        content_bytes = sum(os.path.getsize(f) for f in files)

        spark = session(scratch)
        try:
            result = {
                "benchmark": "spark_read",
                "baseline": "Spark's own sources over the same fragment files, same run: "
                "spark.read.json (batch), the file stream source (streaming); the broker's "
                "append-to-read latency (sink latency); best of runs, interleaved",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "data": {
                    "records": rows,
                    "bytes": content_bytes,
                    "fragments": len(files),
                    "record_bytes": round(content_bytes / rows, 1),
                },
                "batch_read": bench_batch(spark, broker.url, journal, files, rows, runs, file_root),
                "streaming_read": bench_stream(
                    spark, broker.url, journal, str(fragment_dir), rows, scratch, file_root, runs
                ),
                "latency": bench_latency(spark, broker.url, 15 if args.quick else 40, scratch),
            }
        finally:
            spark.stop()
            broker.stop()
    print(json.dumps(result, indent=2))


def transactional_blocks(rows: int, txn: int, step: int = 50_000) -> list[bytes]:
    """`rows` records as messages of one producer, in transactions of `txn` messages each
    followed by its ACK (a line holding only the UUID)."""
    from pygazette.message.uuid import ACK_TXN, CONTINUE_TXN, UUIDFormatter

    fmt = UUIDFormatter(b"\x01\x02\x03\x04\x05\x06")
    pages = ["/", "/docs", "/pricing", "/blog"]
    blocks: list[bytes] = []
    lines: list[bytes] = []
    for i in range(rows):
        uuid = fmt.format(i + 1, CONTINUE_TXN).encode()
        lines.append(
            b'{"uuid":"%s","id":%d,"user":"user-%03d","page":"%s","ms":%d,"ok":%s}\n'
            % (uuid, i, i % 997, pages[i % 4].encode(), i % 1000, b"true" if i % 3 else b"false")
        )
        if (i + 1) % txn == 0 or i + 1 == rows:
            lines.append(b'{"uuid":"%s"}\n' % fmt.format(i + 1, ACK_TXN).encode())
        if len(lines) >= step:
            blocks.append(b"".join(lines))
            lines = []
    if lines:
        blocks.append(b"".join(lines))
    return blocks


def plan_read_committed(url: str, journal: str, file_root: str) -> dict[str, float]:
    """Seconds (best of 5) the driver spends planning with and without readCommitted: a batch
    read's partitions() (its journal split in two by core count: the producer states at the
    cut are found by scanning the first half) and a stream's first latestOffset() from the
    earliest offset (the states at its end: a scan of the whole journal)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import LongType, StructField, StructType

    from pygazette.spark.batch_reader import GazetteBatchReader
    from pygazette.spark.framing import Framing
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.schema import layout
    from pygazette.spark.stream_reader import GazetteStreamReader

    lay = layout(StructType([StructField("id", LongType())]), Framing.JSON)
    base = {"broker": url, "journals": journal, "framing": "json", "fileRoot": file_root}

    def best(fn: object) -> float:
        fn()  # type: ignore[operator]
        return round(min(timed(fn) for _ in range(5)), 3)

    out: dict[str, float] = {}
    for committed in ("false", "true"):
        opts = parse_read_options({**base, "readCommitted": committed}, streaming=False)
        batch = GazetteBatchReader(opts, lay)
        out[f"batch_partitions_read_committed_{committed}"] = best(batch.partitions)
        sopts = parse_read_options(
            {**base, "readCommitted": committed, "startingOffsets": "earliest"}, streaming=True
        )
        stream = GazetteStreamReader(sopts, lay)
        start = stream.initialOffset()
        out[f"stream_latest_offset_read_committed_{committed}"] = best(
            lambda: stream.latestOffset(start, ReadAllAvailable())  # noqa: B023
        )
    return out


def main_read_committed(rows: int, runs: int, txn: int) -> int:
    """Batch reads with readCommitted beside reads without it; one JSON document."""
    with tempfile.TemporaryDirectory(prefix="pygazette-bench-spark-rc-") as tmp:
        scratch = Path(tmp)
        broker = Broker(scratch / "data")
        journal = "bench/spark/transactions"
        broker.start()
        with SyncJournalClient(broker.url) as client:
            create(client, spec(journal))
            for block in transactional_blocks(rows, txn):
                client.append(journal, block)
        broker.stop()  # Persists the last spool: every record is in a fragment file.
        broker.start()
        file_root = str(scratch / "data" / "fragments")
        acks = -(-rows // txn)
        planning = plan_read_committed(broker.url, journal, file_root)
        spark = session(scratch)
        try:

            def read(committed: bool) -> DataFrame:
                return (
                    spark.read.format("gazette")
                    .schema(SCHEMA)
                    .option("broker", broker.url)
                    .option("journals", journal)
                    .option("framing", "json")
                    .option("fileRoot", file_root)
                    .option("readCommitted", str(committed).lower())
                    .load()
                )

            committed, every = read(True), read(False)
            assert committed.count() == rows and every.count() == rows + acks
            partitions = committed.rdd.getNumPartitions()
            noop(committed)
            noop(every)  # Warm both up.
            t_committed, t_every = [], []
            for _ in range(runs):  # Interleaved, so both see the same machine load.
                t_committed.append(timed(lambda: noop(committed)))
                t_every.append(timed(lambda: noop(every)))

            def stream(committed: bool) -> float:
                """An availableNow query of the whole journal into the noop sink, as
                bench_stream's: micro-batches of 32 MiB, each of two partitions."""
                df = (
                    spark.readStream.format("gazette")
                    .schema(SCHEMA)
                    .option("broker", broker.url)
                    .option("journals", journal)
                    .option("framing", "json")
                    .option("fileRoot", file_root)
                    .option("startingOffsets", "earliest")
                    .option("maxBytesPerTrigger", str(32 * MiB))
                    .option("minPartitions", "2")
                    .option("readCommitted", str(committed).lower())
                    .load()
                )
                checkpoint = scratch / f"ck-{committed}-{time.monotonic_ns()}"
                query = (
                    df.writeStream.format("noop")
                    .option("checkpointLocation", str(checkpoint))
                    .trigger(availableNow=True)
                )
                return timed(lambda: query.start().awaitTermination())

            stream(True)
            stream(False)  # Warm both up.
            s_committed, s_every = [], []
            for _ in range(runs):
                s_committed.append(stream(True))
                s_every.append(stream(False))
        finally:
            spark.stop()
            broker.stop()
    committed_rps = rows / min(t_committed)
    every_rps = (rows + acks) / min(t_every)
    print(
        json.dumps(
            {
                "benchmark": "spark_read --read-committed",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "data": {"messages": rows, "transaction_messages": txn, "acks": acks},
                "baseline": "the same journal read without readCommitted, same run",
                "batch_partitions": partitions,
                "read_committed_rows_per_s": round(committed_rps),
                "every_record_rows_per_s": round(every_rps),
                "ratio": round(committed_rps / every_rps, 3),
                "stream_read_committed_rows_per_s": round(rows / min(s_committed)),
                "stream_every_record_rows_per_s": round((rows + acks) / min(s_every)),
                "stream_ratio": round(min(s_every) * rows / (rows + acks) / min(s_committed), 3),
                "planning_seconds": planning,
            },
            indent=2,
        )
    )
    return 0


def main_cluster(rows: int, runs: int) -> int:
    """Batch reads on a standalone cluster by one executor core, then two; one JSON document.

    The journal's fragments are 4 MiB, so a read plans several fragment-aligned partitions
    and both workers' executors get tasks. Each worker count is its own application on the
    same cluster (`spark.cores.max` 1: one worker's executor; 2: both workers')."""
    from tests.support.spark_cluster import SparkCluster, cluster_conf

    with tempfile.TemporaryDirectory(prefix="pygazette-bench-spark-cluster-") as tmp:
        scratch = Path(tmp)
        broker = Broker(scratch / "data")
        journal = "bench/spark/cluster-events"
        load_journal(broker, journal, rows, length=4 * MiB)
        file_root = str(scratch / "data" / "fragments")
        files = sorted(str(p) for p in (scratch / "data" / "fragments" / journal).glob("*.raw"))
        content_bytes = sum(os.path.getsize(f) for f in files)
        cluster = SparkCluster(scratch / "cluster", workers=2)
        by_workers: dict[str, dict[str, float]] = {}
        try:
            cluster.start()
            for workers in (1, 2):
                conf = cluster_conf(cluster, f"pygazette-bench-{workers}-workers")
                conf["spark.cores.max"] = str(workers)
                t0 = time.perf_counter()
                spark = session(scratch / f"app-{workers}", conf=conf)
                try:
                    wait_executors(spark, workers)
                    started = time.perf_counter() - t0
                    parts = (
                        spark.read.format("gazette")
                        .option("broker", broker.url)
                        .option("journals", journal)
                        .option("framing", "json")
                        .schema(SCHEMA)
                        .load()
                        .rdd.getNumPartitions()
                    )
                    result = bench_batch(spark, broker.url, journal, files, rows, runs, file_root)
                finally:
                    spark.stop()
                by_workers[f"{workers}_worker{'s' if workers > 1 else ''}"] = {
                    **result,
                    "partitions": parts,
                    "app_start_seconds": round(started, 1),
                }
        finally:
            cluster.stop()
            broker.stop()
    one, two = by_workers["1_worker"], by_workers["2_workers"]
    out = {
        "benchmark": "spark_read_cluster",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "cluster": {
            "master": "standalone, loopback",
            "workers": 2,
            "cores_per_worker": 1,
            "start_seconds": round(cluster.started_in, 1),
        },
        "data": {"records": rows, "bytes": content_bytes, "fragments": len(files)},
        "batch_read": by_workers,
        "two_workers_over_one": {
            "gazette": round(two["gazette_rows_per_s"] / one["gazette_rows_per_s"], 2),
            "spark_json": round(two["spark_json_rows_per_s"] / one["spark_json_rows_per_s"], 2),
        },
    }
    print(json.dumps(out, indent=2))
    return 0


def wait_executors(spark: SparkSession, count: int, timeout: float = 300.0) -> None:
    """Until `count` executors have registered with the driver (each a JVM start-up)."""
    tracker = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while tracker.size() - 1 < count:  # The driver is one entry.
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} executors did not register")
        time.sleep(0.5)
        tracker = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()  # type: ignore[union-attr]


def load_journal(broker: Broker, journal: str, rows: int, length: int = 16 * MiB) -> None:
    """Start `broker`, append `rows` records to a new journal (fragments of `length`), and
    restart the broker so that every record is in a persisted fragment file; the broker is
    left running."""
    broker.start()
    with SyncJournalClient(broker.url) as client:
        create(client, spec(journal, length=length))
        for block in record_blocks(rows):
            client.append(journal, block)
    broker.stop()  # Persists the last spool: every record is in a fragment file.
    broker.start()


def record_blocks(rows: int, step: int = 50_000) -> list[bytes]:
    return [records(first, min(step, rows - first)) for first in range(0, rows, step)]


def session(
    scratch: Path, jars: list[str] | None = None, conf: dict[str, str] | None = None
) -> SparkSession:
    builder = SparkSession.builder.master("local[2]")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    builder = (
        builder.appName("pygazette-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(scratch / "spark"))
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


UNAVAILABLE = 3  # Exit status when --vs-kafka cannot run here (the JSON says why).


def main_vs_kafka(rows: int, runs: int, partitions: int) -> int:
    """The gazette source against Spark's Kafka source over the same records; see
    bench/spark_kafka.py for exactly what is measured. Prints one JSON document."""
    import pyspark
    from spark_kafka import ARTIFACT, KafkaTopic, compare, connector_jars

    head: dict[str, object] = {"benchmark": "spark_vs_kafka"}
    with tempfile.TemporaryDirectory(prefix="pygazette-bench-spark-kafka-") as tmp:
        scratch = Path(tmp)
        kafka = KafkaTopic(scratch / "kafka", "bench-spark-events")
        reason = kafka.prepare()
        found = connector_jars()
        if isinstance(found, str) or reason is not None:
            head["unavailable"] = reason or found
            print(json.dumps(head, indent=2))
            return UNAVAILABLE
        connector_version, jars = found
        broker = Broker(scratch / "data")
        journal = "bench/spark/events"
        spark: SparkSession | None = None
        try:
            t0 = time.perf_counter()
            load_journal(broker, journal, rows)
            t_journal = time.perf_counter() - t0
            kafka.start()
            t0 = time.perf_counter()
            produced = kafka.load(lambda: record_blocks(rows))
            t_topic = time.perf_counter() - t0
            assert produced == rows, (produced, rows)
            file_root = scratch / "data" / "fragments"
            files = sorted((file_root / journal).glob("*.raw"))
            content_bytes = sum(os.path.getsize(f) for f in files)
            spark = session(scratch, jars)
            result = {
                **head,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "spark": {
                    "pyspark": pyspark.__version__,
                    "master": "local[2]",
                    "kafka_connector": f"org.apache.spark:{ARTIFACT}:{connector_version}",
                    "kafka_connector_jars": [Path(j).name for j in jars],
                },
                "kafka": {"version": kafka.version, "brokers": 1, "topic_partitions": 1},
                "data": {
                    "records": rows,
                    "bytes": content_bytes,
                    "record_bytes": round(content_bytes / rows, 1),
                    "fragments": len(files),
                    "schema": SCHEMA,
                    "load_seconds": {"journal": round(t_journal, 2), "topic": round(t_topic, 2)},
                },
                "settings": {
                    "runs": runs,
                    "min_partitions": partitions,
                    "stream_batch_bytes": 32 * MiB,
                    "sink": "noop",
                    "statistic": "best of runs after one warm-up run, interleaved",
                },
                "reads": compare(
                    spark,
                    url=broker.url,
                    journal=journal,
                    file_root=str(file_root),
                    kafka=kafka,
                    rows=rows,
                    record_bytes=content_bytes / rows,
                    schema=SCHEMA,
                    runs=runs,
                    partitions=partitions,
                    stream_batch_bytes=32 * MiB,
                    scratch=scratch,
                ),
            }
        finally:
            if spark is not None:
                spark.stop()
            broker.stop()
            kafka.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    main()
