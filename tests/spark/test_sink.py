"""The gazette sink: batch and streaming writes, routing, and exactly-once output under
injected task failures and a query killed mid-batch and restarted from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pygazette.client import SyncJournalClient
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.spark.faults import FAULTS_ENV, token_name
from pygazette.spark.framing import Framing
from pygazette.spark.routing import fnv1a32
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import append_each, json_records, wait_for
from tests.support.spark_session import create_journals, journal_spec, spark_env
from tests.support.spark_stream_job import run_query

REPO = Path(__file__).resolve().parents[2]


def lines_of(gz: SyncJournalClient, journal: str) -> list[bytes]:
    return b"".join(gz.read(journal)).splitlines()


def jsons_of(gz: SyncJournalClient, journal: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines_of(gz, journal)]


def out_journals(gz: SyncJournalClient, prefix: str, n: int, topic: str) -> list[str]:
    names = [f"{prefix}out-{i}" for i in range(n)]
    create_journals(gz, *(journal_spec(j, labels={"topic": topic}) for j in names))
    return names


def stream_journals(
    gz: SyncJournalClient, prefix: str, records: int, per_append: int
) -> tuple[str, str, list[str]]:
    """A stream job's journals: its source holding `records` JSON records (`per_append` to an
    append), the topic its sink selects, and that topic's two output journals."""
    source = prefix + "in"
    create_journals(gz, journal_spec(source))
    batches = range(0, records, per_append)
    append_each(gz, source, [b"".join(json_records(i, per_append)) for i in batches])
    topic = prefix.strip("/").replace("/", ".")
    return source, topic, out_journals(gz, prefix, 2, topic)


def arm(faults_dir: Path, kind: str, journal: str) -> Path:
    token = faults_dir / token_name(kind, journal)
    token.touch()
    return token


def test_batch_writes_by_option_column_and_key(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    single = prefix + "single"
    create_journals(gz, journal_spec(single))
    df = spark.createDataFrame([(f"line {i}",) for i in range(50)], "value STRING")
    df.write.format("gazette").mode("append").option("broker", spark_broker.url).option(
        "journal", single
    ).save()
    assert sorted(lines_of(gz, single)) == sorted(f"line {i}".encode() for i in range(50))

    # A journal column names each row's journal; rows are written as JSON lines.
    a, b = prefix + "col-a", prefix + "col-b"
    create_journals(gz, journal_spec(a), journal_spec(b))
    rows = [(a if i % 3 else b, i, f"u{i % 5}") for i in range(90)]
    spark.createDataFrame(rows, "journal STRING, n LONG, user STRING").repartition(3).write.format(
        "gazette"
    ).mode("append").option("broker", spark_broker.url).save()
    assert sorted(d["n"] for d in jsons_of(gz, a)) == [i for i in range(90) if i % 3]
    assert sorted(d["n"] for d in jsons_of(gz, b)) == [i for i in range(90) if not i % 3]
    assert set(jsons_of(gz, a)[0]) == {"n", "user"}  # The routing column is not written.

    # Keys map over a selector's journals as Gazette's mappings do.
    topic = prefix.strip("/").replace("/", ".")
    outs = out_journals(gz, prefix, 3, topic)
    keyed = spark.createDataFrame([(i, f"user-{i}") for i in range(200)], "n LONG, user STRING")
    for partitioner in ("modulo", "rendezvous"):
        keyed.write.format("gazette").mode("append").option("broker", spark_broker.url).option(
            "selector", f"topic={topic}"
        ).option("keyColumn", "user").option("partitioner", partitioner).save()
    for index, j in enumerate(outs):
        got = Counter(d["user"] for d in jsons_of(gz, j))
        for user, count in got.items():
            h = fnv1a32(str(user).encode())
            hrw = max(range(3), key=lambda i: (h ^ fnv1a32(outs[i].encode()), -i))
            assert count == (h % 3 == index) + (hrw == index)

    with pytest.raises(PySparkException, match="append-only"):
        df.write.format("gazette").mode("overwrite").option("journal", single).save()
    bad = spark.createDataFrame([("two\nlines",)], "value STRING")
    with pytest.raises(PySparkException, match="newline inside it"):
        bad.write.format("gazette").mode("append").option("broker", spark_broker.url).option(
            "journal", single
        ).save()


def test_batch_write_is_exactly_once_when_a_task_fails_between_appends(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    faults_dir: Path,
) -> None:
    topic = prefix.strip("/").replace("/", ".")
    outs = out_journals(gz, prefix, 2, topic)
    token = arm(faults_dir, "fail-after-append", outs[0])
    df = spark.createDataFrame([(i, f"user-{i % 11}") for i in range(400)], "n LONG, user STRING")
    df.repartition(4).write.format("gazette").mode("append").option(
        "broker", spark_broker.url
    ).option("selector", f"topic={topic}").option("keyColumn", "user").save()
    assert not token.exists()  # The fault fired: a task died after appending to outs[0].
    written = Counter(d["n"] for j in outs for d in jsons_of(gz, j))
    assert written == Counter(range(400))


def test_a_reused_writer_id_writes_other_rows_and_skips_a_rerun(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    out = prefix + "out"
    create_journals(gz, journal_spec(out))

    def write(values: list[str]) -> None:
        df = spark.createDataFrame([(v,) for v in values], "value STRING").repartition(2)
        df.write.format("gazette").mode("append").option("broker", spark_broker.url).option(
            "journal", out
        ).option("writerId", "daily-job").save()

    first = [f"first {i}" for i in range(40)]
    write(first)
    write(first)  # A re-run of the same job: deduplicated.
    assert Counter(lines_of(gz, out)) == Counter(v.encode() for v in first)
    second = [f"second {i}" for i in range(40)]
    write(second)  # The same writerId minutes later, with other rows: written.
    assert Counter(lines_of(gz, out)) == Counter(v.encode() for v in first + second)


def test_stream_write_is_exactly_once_when_a_task_fails_between_appends(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    faults_dir: Path,
    tmp_path: Path,
) -> None:
    source, topic, outs = stream_journals(gz, prefix, 300, 100)
    token = arm(faults_dir, "fail-after-append", outs[0])
    run_query(spark, spark_broker.url, source, f"topic={topic}", str(tmp_path / "checkpoint"))
    assert not token.exists()
    written = Counter(d["n"] for j in outs for d in jsons_of(gz, j))
    assert written == Counter(range(300))


@pytest.mark.timeout(600)  # A job's driver JVM started, killed, and the query restarted.
def test_query_killed_mid_batch_and_restarted_writes_each_row_once(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    kill_driver_mid_batch_and_restart(lambda: spark, spark_broker, gz, prefix, tmp_path)


def kill_driver_mid_batch_and_restart(
    restart_session: Callable[[], SparkSession],
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
    job_conf: dict[str, str] | None = None,
) -> None:
    """A job's driver (a process of its own, on `job_conf`'s master, else local) is killed
    -9 while a task hangs after one of its appends; the session `restart_session` gives
    restarts the query from the checkpoint, and every row is in the output journals once."""
    source, topic, outs = stream_journals(gz, prefix, 250, 50)
    checkpoint = str(tmp_path / "checkpoint")
    job_faults = tmp_path / "job-faults"
    job_faults.mkdir()
    arm(job_faults, "hang-after-append", outs[0])
    if job_conf is not None:  # The job's executors look for faults where the job arms them.
        job_conf = {**job_conf, f"spark.executorEnv.{FAULTS_ENV}": str(job_faults)}

    env = dict(os.environ, **spark_env(job_faults))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    log = open(tmp_path / "job.log", "wb")
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.spark_stream_job",
            spark_broker.url,
            source,
            f"topic={topic}",
            checkpoint,
            str(job_faults),
            str(tmp_path / "job-scratch"),
            *([json.dumps(job_conf)] if job_conf else []),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        hung = job_faults / token_name("hung", outs[0])
        try:
            # A driver JVM, its session and (on a cluster) executors start first: minutes on
            # a loaded two-core machine.
            wait_for(
                lambda: hung.exists() or job.poll() is not None,
                timeout=300,
                what="the job to hang in the middle of a micro-batch",
            )
        except TimeoutError as exc:
            log_tail = (tmp_path / "job.log").read_text(errors="replace")[-3000:]
            raise TimeoutError(f"{exc}; the job's log ends:\n{log_tail}") from None
        assert job.poll() is None, (tmp_path / "job.log").read_text(errors="replace")[-3000:]
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
        log.close()
    partial = Counter(d["n"] for j in outs for d in jsons_of(gz, j))
    assert partial and sum(partial.values()) < 250  # Killed mid-batch, rows half written.

    run_query(restart_session(), spark_broker.url, source, f"topic={topic}", checkpoint)
    written = Counter(d["n"] for j in outs for d in jsons_of(gz, j))
    assert written == Counter(range(250))


def test_stream_sink_of_an_aggregation(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    source, sink = prefix + "clicks", prefix + "counts"
    create_journals(gz, journal_spec(source), journal_spec(sink))
    append_each(gz, source, [b"".join(json_records(0, 140))])
    counts = (
        spark.readStream.format("gazette")
        .schema("n LONG, user STRING")
        .option("broker", spark_broker.url)
        .option("journals", source)
        .option("framing", "json")
        .option("startingOffsets", "earliest")
        .load()
        .groupBy("user")
        .agg(F.count("*").alias("clicks"))
    )
    query = (
        counts.writeStream.format("gazette")
        .outputMode("complete")
        .option("broker", spark_broker.url)
        .option("journal", sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    latest = {d["user"]: d["clicks"] for d in jsons_of(gz, sink)}
    assert latest == {f"u{k}": 20 for k in range(7)}


def test_json_rows_hold_maps_as_objects_and_refuse_what_json_cannot_encode(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    """Maps are JSON objects, as Spark's JSON writer writes them (they were lists of [key,
    value] pairs); a NaN or infinite float is a clear error that writes nothing (it was
    written as null), and so are types CSV cannot hold (they were written as Python reprs)."""
    out = prefix + "out"
    create_journals(gz, journal_spec(out))

    def write(df: object, **options: str) -> None:
        writer = df.write.format("gazette").mode("append")  # type: ignore[attr-defined]
        for key, value in {"broker": spark_broker.url, "journal": out, **options}.items():
            writer = writer.option(key, value)
        writer.save()

    write(
        spark.sql(
            "SELECT map('a', 1, 'b', 2) AS m, array(map(1, 'x')) AS l, "
            "named_struct('s', map('k', named_struct('v', 1.5D))) AS st, 7 AS n"
        )
    )
    assert jsons_of(gz, out) == [
        {"m": {"a": 1, "b": 2}, "l": [{"1": "x"}], "st": {"s": {"k": {"v": 1.5}}}, "n": 7}
    ]
    for value in ("CAST('NaN' AS DOUBLE)", "array(CAST('-Infinity' AS FLOAT))"):
        with pytest.raises(PySparkException, match="NaN or an infinity, which JSON cannot"):
            write(spark.sql(f"SELECT {value} AS f, 1 AS n"))
    with pytest.raises(PySparkException, match="map keys are of type struct"):
        write(spark.sql("SELECT map(named_struct('a', 1), 1) AS m"))
    for column in ("named_struct('x', 1)", "array(1, 2)", "map('a', 1)"):
        with pytest.raises(PySparkException, match="framing csv cannot write column c"):
            write(spark.sql(f"SELECT {column} AS c, 1 AS n"), framing="csv")
    assert len(lines_of(gz, out)) == 1  # Nothing more was written.


def test_a_stream_writer_id_reused_by_a_new_query_writes_its_rows(
    spark: SparkSession,
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    tmp_path: Path,
) -> None:
    """A query started afresh (a new checkpoint) under a writerId an earlier query used writes
    every row: its micro-batch ids start again from 0, and a label of the earlier query saying
    "batch 3 written" says nothing about them (they were all skipped, silently)."""
    out = prefix + "out"
    create_journals(gz, journal_spec(out))

    def run(source: str, first: int, checkpoint: str) -> None:
        create_journals(gz, journal_spec(source))
        for i in range(first, first + 40, 10):  # One micro-batch of 10 rows per append.
            append_each(gz, source, [b"".join(json_records(i, 10))])
        jvm = spark._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        rows = (
            spark.readStream.format("gazette")
            .schema("n LONG, user STRING")
            .option("broker", spark_broker.url)
            .option("journals", source)
            .option("framing", "json")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "10")
            .load()
        )
        query = (
            rows.writeStream.format("gazette")
            .option("broker", spark_broker.url)
            .option("journal", out)
            .option("writerId", "clicks-sink")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run(prefix + "in-1", 0, str(tmp_path / "checkpoint-1"))
    assert sorted(d["n"] for d in jsons_of(gz, out)) == list(range(40))
    run(prefix + "in-2", 100, str(tmp_path / "checkpoint-2"))
    assert sorted(d["n"] for d in jsons_of(gz, out)) == [*range(40), *range(100, 140)]


def test_a_task_appends_nothing_when_a_journal_it_writes_is_missing_or_read_only(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    """A task checks every journal it writes before its first append: a journal column naming
    a journal that does not exist fails the task with nothing appended (the journals before it,
    in name order, had their rows appended; the task's retries then failed the job), and a
    selector sink matching a read-only journal fails on the driver, before any task runs."""
    a, missing = prefix + "a", prefix + "b-missing"
    create_journals(gz, journal_spec(a))
    rows = spark.createDataFrame([(a, 1), (missing, 2), (a, 3)], "journal STRING, n LONG")
    with pytest.raises(PySparkException, match=f"journal {missing} does not exist"):
        rows.coalesce(1).write.format("gazette").mode("append").option(
            "broker", spark_broker.url
        ).save()
    assert lines_of(gz, a) == []

    topic = prefix.strip("/").replace("/", ".")
    outs = out_journals(gz, prefix, 2, topic)
    read_only = journal_spec(prefix + "out-2", labels={"topic": topic})
    read_only.flags = pb.JournalSpec.O_RDONLY
    create_journals(gz, read_only)
    keyed = spark.createDataFrame([(i, f"user-{i}") for i in range(30)], "n LONG, user STRING")
    with pytest.raises(PySparkException, match=f"journal {read_only.name} is read-only"):
        keyed.coalesce(1).write.format("gazette").mode("append").option(
            "broker", spark_broker.url
        ).option("selector", f"topic={topic}").option("keyColumn", "user").save()
    assert [lines_of(gz, j) for j in outs] == [[], []]


def test_a_task_holds_at_most_its_spool_budget_in_memory_however_many_journals_it_writes(
    spark_broker: BrokerProcess,
    gz: SyncJournalClient,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task's rows wait for their appends in memory up to SPOOL_MEMORY_BYTES in all, then
    on local disk. The bound was per journal: a task mapping 2 MiB of rows to each of 24
    journals held all 48 MiB in memory (a large partition over a topic of many journals,
    gigabytes)."""
    import tracemalloc

    import pyarrow as pa

    from pygazette.spark import sink
    from pygazette.spark.exactly_once import Fence, RowsDigest
    from pygazette.spark.options import parse_write_options
    from pygazette.spark.sink import SinkPlan, write_task

    topic = prefix.strip("/").replace("/", ".")
    outs = out_journals(gz, prefix, 24, topic)
    opts = parse_write_options(
        {"broker": spark_broker.url, "selector": f"topic={topic}", "keyColumn": "key"}
    )
    plan = SinkPlan(opts, Framing.LINES, ("key", "value"), tuple(outs), False, (), "t", "run")
    monkeypatch.setattr(sink, "_task_context", lambda: (0, 0, None))
    monkeypatch.setattr(sink, "SPOOL_MEMORY_BYTES", 4 << 20)
    value = "v" * 1023

    def batches() -> Iterator[pa.RecordBatch]:
        for b in range(48):  # 48 MiB of rows, 1 MiB a batch.
            keys = [f"key-{b}-{i}" for i in range(1024)]
            yield pa.record_batch({"key": keys, "value": [value] * 1024})

    RowsDigest().add([b"import what a task imports before measuring"])
    tracemalloc.start()
    try:
        commit = write_task(plan, batches(), lambda p: Fence.for_batch("t", p, "run"))
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert commit.rows == 48 * 1024 and len(commit.outcomes) == 24
    assert sum(len(lines_of(gz, j)) for j in outs) == 48 * 1024
    assert peak < 12 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_a_failed_batch_write_says_failed_tasks_may_have_appended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task that fails after some of its appends leaves them (its retries skip them): the
    abort's warning says so. It counted only the tasks that finished ('0 tasks had committed
    their rows' after a failed task had appended to a journal)."""
    from pygazette.spark.options import parse_write_options
    from pygazette.spark.sink import GazetteBatchWriter, SinkCommit, SinkPlan

    opts = parse_write_options({"broker": "http://127.0.0.1:9", "journal": "out/a"})
    plan = SinkPlan(opts, Framing.LINES, ("value",), (), False, ("value",), "write-1", "run")
    with caplog.at_level("WARNING", logger="pygazette.spark.sink"):
        GazetteBatchWriter(plan).abort([SinkCommit(0, 0), None, None])
    assert "after 1 of its 3 tasks committed their rows, and a failed task may have appended" in (
        caplog.text
    )
    assert "writerId=write-1" in caplog.text


def test_a_journal_column_sink_needs_only_the_append_capability(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A task checks its journals with a List when its token allows one; a token of the
    APPEND capability alone (a writer's least privilege) still writes, as before the check."""
    import base64

    from pygazette.auth.capability import Capability
    from pygazette.auth.claims import Claims
    from pygazette.auth.keyed_auth import KeyedAuth

    keys = base64.b64encode(b"spark-sink-auth-key".ljust(32, b"k")).decode()
    broker = BrokerProcess(tmp_path / "data", extra_args=["--auth-keys", keys])
    broker.start()
    try:
        signer = KeyedAuth(keys)
        with SyncJournalClient(broker.url, auth=signer) as admin:
            out = "spark/append-only/out"
            create_journals(admin, journal_spec(out))
            append_only = signer.sign(Claims(Capability.APPEND), ttl=3600)
            rows = spark.createDataFrame(
                [(out, f"row {i}") for i in range(20)], "journal STRING, value STRING"
            )
            rows.write.format("gazette").mode("append").option("broker", broker.url).option(
                "authToken", append_only
            ).save()
            assert sorted(lines_of(admin, out)) == sorted(f"row {i}".encode() for i in range(20))
    finally:
        broker.kill()


@pytest.mark.parametrize("routing", ["column", "key"])
def test_a_sink_task_waits_out_a_broker_restart_and_appends_once(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, routing: str
) -> None:
    """A sink task whose broker restarts under it (a rolling upgrade, a crash) waits for it,
    and appends its rows once. It failed at once (UNAVAILABLE), and so did its retries while
    the broker was down, which failed the write, or a stream's query. An append that may or
    may not have committed is made again through the same register check, so the rows are
    there once whatever the broker saw: a second run of the task appends nothing. (Routed by
    a journal column, the task lists its journals first; by key, it appends first.)"""
    import threading

    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from pygazette.spark import sink
    from pygazette.spark.exactly_once import Fence
    from pygazette.spark.options import parse_write_options

    a, b = "spark/restart/a", "spark/restart/b"
    with SyncJournalClient(broker.url) as gz:
        create_journals(gz, journal_spec(a), journal_spec(b))
    schema = StructType([StructField("journal", StringType()), StructField("n", LongType())])
    options = {"broker": broker.url}
    if routing == "key":
        options.update(journals=f"{a},{b}", keyColumn="n")
        schema = StructType([StructField("n", LongType())])
    plan = sink.make_plan(parse_write_options(options), schema, streaming=False)
    batch = pa.RecordBatch.from_pydict(
        {"journal": [a if i % 2 else b for i in range(40)], "n": list(range(40))}
    )
    if routing == "key":
        batch = batch.drop_columns(["journal"])
    monkeypatch.setattr(sink, "_task_context", lambda: (0, 0, None))

    def task() -> list[bool]:
        fence = Fence.for_batch(plan.identity, 0, plan.run)
        commit = sink.write_task(plan, iter([batch]), lambda _p: fence)
        return [o.appended for o in commit.outcomes]

    broker.stop()
    thread = threading.Thread(target=broker.start)
    thread.start()
    try:
        assert task() == [True, True]
    finally:
        thread.join()
    assert task() == [False, False]  # The task retried: its rows are there.
    with SyncJournalClient(broker.url) as gz:
        written = sorted(int(json.loads(line)["n"]) for j in (a, b) for line in lines_of(gz, j))
    assert written == list(range(40))
