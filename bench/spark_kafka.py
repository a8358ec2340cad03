"""Spark's own Kafka source (`spark-sql-kafka-0-10`) beside the gazette source, for
``bench/spark_read.py --vs-kafka``: the connector's jars, a Kafka topic holding the same
records as a journal, and the timed reads of both.

The connector comes from Maven Central (bench/kafka-spark/pom.xml, `mvn
dependency:copy-dependencies`) into a cache outside the repository
(``~/.cache/pygazette/spark-kafka/<version>``, or $PYGAZETTE_SPARK_KAFKA_JARS) and reaches
Spark through ``spark.jars``; nothing is fetched while Spark runs. Its version is PySpark's
when Maven Central has it, else the newest one this module knows to be published
(`FALLBACK_VERSIONS`); the JSON says which. The Kafka broker is the peer benchmark's
(`peer_systems.kafka_system`: Kafka 4.x, KRaft, one node).

What is measured, for each source, rows/s of one query materialised into Spark's `noop`
sink, best of N interleaved runs:

- ``raw``: each record's bytes as a binary column (`value`): gazette ``framing=lines``
  with schema ``value BINARY``; Kafka ``select("value")``;
- ``json``: each record decoded into the same five-column schema: gazette
  ``framing=json`` with that schema; Kafka ``from_json(CAST(value AS STRING), schema)``,
  as a Spark user of the Kafka source writes it.

Both sources read every record from the same one-journal / one-partition log, asked for
the same parallelism (``minPartitions``). The gazette source is measured twice: reading
through the broker (as Kafka's source does), and reading fragment files directly
(``fileRoot``, as it does against a shared store). Streams run with Trigger.AvailableNow
and the same micro-batch sizes (gazette ``maxBytesPerTrigger``, Kafka
``maxOffsetsPerTrigger`` of as many records); every run's row count is checked. A stream
run's time includes starting the query; `seconds_outside_batches` and `ratio_in_batches`
split that start-up off (for a Python source it includes Spark launching a fresh source
runner interpreter, about a second here whatever the source does).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from peer_systems.kafka_system import KafkaSystem  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql.functions import col, from_json  # noqa: E402

POM = BENCH / "kafka-spark" / "pom.xml"
ARTIFACT = "spark-sql-kafka-0-10_2.13"
# Published connector versions to fall back on, newest first, when PySpark's own version
# is not on Maven Central (a PySpark release can precede its Maven artifacts).
FALLBACK_VERSIONS = ("4.2.0", "4.1.1", "4.0.1")
FETCH_TIMEOUT = 300.0


def _cache_root() -> Path:
    env = os.environ.get("PYGAZETTE_SPARK_KAFKA_JARS")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "pygazette" / "spark-kafka"


def _candidates() -> list[str]:
    import pyspark

    own = pyspark.__version__
    out = [own]
    major_minor = tuple(int(x) for x in own.split(".")[:2])
    for v in FALLBACK_VERSIONS:  # Only the same major version: Spark 3's connector won't load.
        if v not in out and int(v.split(".")[0]) == major_minor[0]:
            out.append(v)
    return out


def _jars_in(d: Path, version: str) -> list[str] | None:
    if not (d / f"{ARTIFACT}-{version}.jar").is_file():
        return None
    return sorted(str(p) for p in d.glob("*.jar"))


def connector_jars(timeout: float = FETCH_TIMEOUT) -> tuple[str, list[str]] | str:
    """(version, jar paths) of the Kafka connector, fetched with mvn into the cache if need
    be; or why they could not be had."""
    root = _cache_root()
    candidates = _candidates()
    for version in candidates:
        jars = _jars_in(root / version, version)
        if jars:
            return version, jars
    mvn = shutil.which("mvn")
    if mvn is None:
        return f"no Spark Kafka connector jars in {root} and no mvn to fetch them"
    reasons = []
    for version in candidates:
        target = root / version
        partial = target.with_name(version + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            done = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(POM),
                    f"-Dspark.kafka.version={version}",
                    "-DincludeScope=runtime",
                    f"-DoutputDirectory={partial}",
                    "dependency:copy-dependencies",
                ],
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"mvn did not fetch {ARTIFACT}:{version} within {timeout:.0f}s"
        if done.returncode != 0:
            tail = done.stdout.decode(errors="replace").strip().splitlines()[-1:] or [""]
            reasons.append(f"{version}: {tail[0][:300]}")
            shutil.rmtree(partial, ignore_errors=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        jars = _jars_in(target, version)
        if jars:
            return version, jars
    return "mvn could not fetch the Spark Kafka connector: " + "; ".join(reasons)


class KafkaTopic:
    """A one-node Kafka broker (the peer benchmark's) with one single-partition topic."""

    def __init__(self, scratch: Path, topic: str) -> None:
        self.scratch = scratch
        self.topic = topic
        self.system = KafkaSystem(1)
        self.version = ""

    def prepare(self) -> str | None:
        """Why Kafka cannot run here, or None (fetches the broker's jars if need be)."""
        return self.system.prepare()

    def start(self) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True)
        asyncio.run(self.system.start(self.scratch))
        asyncio.run(self.system.create(self.topic, large=False))
        self.version = str(self.system.settings()["version"])

    @property
    def bootstrap(self) -> str:
        return self.system.bootstrap

    def load(self, blocks: Callable[[], Any]) -> int:
        """Produce every line of every block (bytes of newline-ended records) as one
        message, in order; the number of messages."""
        producer = self.system.producer
        produce, poll = producer.produce, producer.poll
        topic = self.topic
        n = 0
        for block in blocks():
            lines = block.split(b"\n")
            if lines and not lines[-1]:
                lines.pop()
            for line in lines:
                while True:
                    try:
                        produce(topic, line)
                        break
                    except BufferError:
                        poll(0.005)
            n += len(lines)
            poll(0)
        remaining = producer.flush(60)
        if remaining or self.system.errors:
            raise RuntimeError(f"kafka: {remaining} unsent, errors {self.system.errors[:1]}")
        return n

    def stop(self) -> None:
        asyncio.run(self.system.stop())


# Readers -------------------------------------------------------------------------------------


def gazette_reader(
    spark: SparkSession,
    *,
    url: str,
    journal: str,
    decode: str,
    schema: str,
    partitions: int,
    file_root: str | None,
    stream_batch_bytes: int | None = None,
) -> DataFrame:
    reader = spark.readStream if stream_batch_bytes else spark.read
    r = (
        reader.format("gazette")
        .schema(schema if decode == "json" else "value BINARY")
        .option("broker", url)
        .option("journals", journal)
        .option("framing", "json" if decode == "json" else "lines")
        .option("minPartitions", str(partitions))
    )
    if file_root:
        r = r.option("fileRoot", file_root)
    if stream_batch_bytes:
        r = r.option("startingOffsets", "earliest").option(
            "maxBytesPerTrigger", str(stream_batch_bytes)
        )
    return r.load()


def kafka_reader(
    spark: SparkSession,
    *,
    bootstrap: str,
    topic: str,
    decode: str,
    schema: str,
    partitions: int,
    stream_batch_records: int | None = None,
) -> DataFrame:
    reader = spark.readStream if stream_batch_records else spark.read
    r = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("minPartitions", str(partitions))
    )
    if stream_batch_records:
        r = r.option("maxOffsetsPerTrigger", str(stream_batch_records))
    else:
        r = r.option("endingOffsets", "latest")
    df = r.load()
    if decode == "json":
        return df.select(from_json(col("value").cast("string"), schema).alias("r")).select("r.*")
    return df.select("value")


# Timing --------------------------------------------------------------------------------------


def _batch_run(df: DataFrame) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def _stream_run(df: DataFrame, checkpoint: Path, rows: int) -> tuple[float, float]:
    """(seconds from start() to termination, seconds of them outside micro-batches:
    starting the query and its source, and stopping)."""
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    q = query.start()
    q.awaitTermination()
    took = time.perf_counter() - t0
    progress = q.recentProgress
    seen = sum(int(p["numInputRows"]) for p in progress)
    if seen != rows:
        raise RuntimeError(f"stream read {seen} rows, expected {rows}")
    in_triggers = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in progress) / 1000
    return took, max(0.0, took - in_triggers)


def compare(
    spark: SparkSession,
    *,
    url: str,
    journal: str,
    file_root: str,
    kafka: KafkaTopic,
    rows: int,
    record_bytes: float,
    schema: str,
    runs: int,
    partitions: int,
    stream_batch_bytes: int,
    scratch: Path,
) -> dict[str, Any]:
    """Every workload's rows/s through each source, with gazette/Kafka ratios."""
    batch_records = max(1, math.floor(stream_batch_bytes / record_bytes))
    out: dict[str, Any] = {}
    for mode in ("batch", "stream"):
        for decode in ("raw", "json"):
            stream = mode == "stream"

            def gz(root: str | None, decode: str = decode, stream: bool = stream) -> DataFrame:
                return gazette_reader(
                    spark,
                    url=url,
                    journal=journal,
                    decode=decode,
                    schema=schema,
                    partitions=partitions,
                    file_root=root,
                    stream_batch_bytes=stream_batch_bytes if stream else None,
                )

            sources = {
                "kafka": kafka_reader(
                    spark,
                    bootstrap=kafka.bootstrap,
                    topic=kafka.topic,
                    decode=decode,
                    schema=schema,
                    partitions=partitions,
                    stream_batch_records=batch_records if stream else None,
                ),
                "gazette": gz(None),
                "gazette_direct": gz(file_root),
            }
            if not stream:
                for name, df in sources.items():
                    n = df.count()
                    if n != rows:
                        raise RuntimeError(f"{name} batch read {n} rows, expected {rows}")
            times: dict[str, list[float]] = {name: [] for name in sources}
            outside: dict[str, list[float]] = {name: [] for name in sources}
            for i in range(runs + 1):  # The first round warms up; interleaved, same load.
                for name, df in sources.items():
                    if stream:
                        ck = scratch / f"ck-{mode}-{decode}-{name}-{i}-{time.monotonic_ns()}"
                        took, overhead = _stream_run(df, ck, rows)
                    else:
                        took, overhead = _batch_run(df), 0.0
                    if i:
                        times[name].append(took)
                        outside[name].append(overhead)
            rps = {name: rows / min(t) for name, t in times.items()}
            figures = out[f"{mode}_{decode}"] = {
                "kafka_rows_per_s": round(rps["kafka"]),
                "gazette_rows_per_s": round(rps["gazette"]),
                "gazette_direct_rows_per_s": round(rps["gazette_direct"]),
                "ratio": round(rps["gazette"] / rps["kafka"], 3),
                "ratio_direct": round(rps["gazette_direct"] / rps["kafka"], 3),
                "seconds": {n: [round(x, 3) for x in t] for n, t in times.items()},
            }
            if stream:
                # Of each run: seconds outside micro-batches (query and source start-up, stop).
                figures["seconds_outside_batches"] = {
                    n: [round(x, 3) for x in t] for n, t in outside.items()
                }
                # Rows/s within micro-batches alone: without the per-query start-up, which
                # for a Python source includes Spark starting its source-runner process.
                inside = {
                    n: min(a - b for a, b in zip(times[n], outside[n], strict=True))
                    for n in sources
                }
                figures["ratio_in_batches"] = round(inside["kafka"] / inside["gazette"], 3)
                figures["ratio_direct_in_batches"] = round(
                    inside["kafka"] / inside["gazette_direct"], 3
                )
    return out
