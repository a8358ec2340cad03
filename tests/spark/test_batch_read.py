"""`spark.read.format("gazette")` against a real broker: every framing, offsets, selectors,
timestamps, splits, data loss and errors."""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from pygazette.client import SyncJournalClient
from pygazette.message.fixed_framing import encode_fixed_frame
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.journal_data import (
    append_each,
    fragment_path,
    json_records,
    persisted,
    wait_for,
    wait_persisted,
)
from tests.support.spark_session import create_journals, journal_spec


def reader(spark: SparkSession, broker: BrokerProcess, **options: str) -> DataFrame:
    r = spark.read.format("gazette").option("broker", broker.url)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def fragment_file(broker: BrokerProcess, gz: SyncJournalClient, journal: str, index: int) -> Path:
    """The file of the journal's index-th fragment in the broker's file store."""
    url = gz.list_all_fragments(journal, signature_ttl=60)[index].signed_url
    return fragment_path(broker.file_root, url)


def fill(gz: SyncJournalClient, journal: str, appends: list[bytes]) -> None:
    """Append; all but the last append end up in persisted fragments of 1 KiB length.

    A fragment rolls after the journal's first append and once it holds more than its
    length (Gazette's rules), so each append but the last must be larger than 1 KiB.
    """
    assert all(len(a) > 1024 for a in appends[:-1]), [len(a) for a in appends]
    create_journals(gz, journal_spec(journal, fragment_length=1024, codec=pb.GZIP))
    append_each(gz, journal, appends)
    wait_persisted(gz, journal, sum(map(len, appends[:-1])))


def test_lines_and_raw(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    j = prefix + "lines"
    records = json_records(0, 300, pad=10)
    appends = [b"".join(records[i : i + 40]) for i in range(0, 300, 40)]
    fill(gz, j, appends)
    content = b"".join(appends)

    lines = reader(spark, spark_broker, journals=j, framing="lines", minPartitions="6")
    assert lines.rdd.getNumPartitions() >= 6
    got = sorted((r.offset, r.value, r.journal) for r in lines.collect())
    offsets = [0]
    for r in records[:-1]:
        offsets.append(offsets[-1] + len(r))
    assert got == [(o, r.rstrip(b"\n"), j) for o, r in zip(offsets, records, strict=True)]

    with_time = reader(spark, spark_broker, journals=j, framing="lines").collect()
    persisted_end = max(f.end for f in persisted(gz, j))
    for row in with_time:
        assert (row.fragment_mod_time is not None) == (row.offset < persisted_end)

    raw = reader(spark, spark_broker, journals=j).orderBy("offset").collect()
    assert b"".join(r.value for r in raw) == content
    # Raw rows are append-aligned: each one is a whole fragment (or the spool's content).
    fragment_begins = sorted({f.spec.begin for f in gz.list_all_fragments(j)})
    assert [r.offset for r in raw] == fragment_begins

    as_text = spark.read.format("gazette").schema("value STRING, offset LONG")
    text = as_text.option("broker", spark_broker.url).option("journals", j)
    first = text.option("framing", "lines").load().orderBy("offset").first()
    assert first is not None and json.loads(first.value)["n"] == 0


def test_json_inferred_and_with_a_schema(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    j = prefix + "json"
    records = json_records(0, 200, pad=5)
    records.insert(50, b"\n")  # Blank lines are not records.
    fill(gz, j, [b"".join(records[i : i + 30]) for i in range(0, 201, 30)])

    inferred = reader(spark, spark_broker, journals=j, framing="json", minPartitions="4")
    assert inferred.columns == ["journal", "offset", "n", "pad", "user", "fragment_mod_time"]
    assert dict(inferred.dtypes)["n"] == "bigint"
    rows = inferred.collect()
    assert sorted(r.n for r in rows) == list(range(200))

    typed = (
        spark.read.format("gazette")
        .schema("offset LONG, user STRING, n INT")
        .option("broker", spark_broker.url)
        .option("journals", j)
        .option("framing", "json")
        .load()
    )
    totals = {
        r.user: r.total for r in typed.groupBy("user").sum("n").toDF("user", "total").collect()
    }
    assert totals == {f"u{k}": sum(i for i in range(200) if i % 7 == k) for k in range(7)}


def test_csv_and_protobuf_fixed(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    jc, jf = prefix + "csv", prefix + "fixed"
    rows = [[i, f"name {i}", "line\nbreak" if i % 9 == 0 else "plain"] for i in range(150)]
    encoded = []
    for row in rows:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(row)
        encoded.append(buf.getvalue().encode())
    fill(gz, jc, [b"".join(encoded[i : i + 60]) for i in range(0, 150, 60)])

    typed = (
        spark.read.format("gazette")
        .schema("id INT, name STRING, note STRING, offset LONG")
        .option("broker", spark_broker.url)
        .option("journals", jc)
        .option("framing", "csv")
        .option("minPartitions", "5")
        .load()
    )
    got = sorted((r.id, r.name, r.note) for r in typed.collect())
    assert got == [(i, n, note) for i, n, note in rows]
    inferred = reader(spark, spark_broker, journals=jc, framing="csv")
    assert inferred.columns == ["journal", "offset", "_c0", "_c1", "_c2", "fragment_mod_time"]

    payloads = [b"\x08" + bytes([i % 256]) * (i % 50) for i in range(300)]
    frames = [encode_fixed_frame(p) for p in payloads]
    fill(gz, jf, [b"".join(frames[i : i + 60]) for i in range(0, 300, 60)])
    fixed = reader(spark, spark_broker, journals=jf, framing="protobuf-fixed", minPartitions="4")
    got_fixed = [r.value for r in fixed.orderBy("offset").collect()]
    assert got_fixed == payloads


def test_selector_offsets_and_timestamps(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    topic = prefix.strip("/").replace("/", ".")
    a, b = prefix + "a", prefix + "b"
    for j in (a, b):
        create_journals(gz, journal_spec(j, fragment_length=1024, labels={"topic": topic}))
    old = json_records(0, 50, pad=20)
    append_each(gz, a, [b"".join(old)])
    append_each(gz, b, [b"".join(old)])
    wait_persisted(gz, a, sum(map(len, old)))
    hour_ago = time.time() - 3600
    # Age a's fragment by an hour; the broker sees that when it next lists its store.
    path = fragment_file(spark_broker, gz, a, 0)
    os.utime(path, (hour_ago - 60, hour_ago - 60))
    wait_for(
        lambda: any(0 < f.mod_time < hour_ago for f in persisted(gz, a)),
        what="the broker to see the fragment's age",
    )
    new = json_records(50, 20, pad=20)
    append_each(gz, a, [b"".join(new)])

    everything = reader(spark, spark_broker, selector=f"topic={topic}", framing="lines")
    assert everything.count() == 50 + 50 + 20
    assert sorted({r.journal for r in everything.select("journal").collect()}) == [a, b]

    boundary = len(b"".join(old[:10]))
    ranged = reader(
        spark,
        spark_broker,
        selector=f"topic={topic}",
        framing="lines",
        startingOffsets=json.dumps({a: boundary}),
        endingOffsets=json.dumps({b: len(b"".join(old[:5]))}),
    )
    counts = {r.journal: r["count"] for r in ranged.groupBy("journal").count().collect()}
    assert counts == {a: 60, b: 5}

    recent = reader(
        spark,
        spark_broker,
        journals=a,
        framing="json",
        startingTimestamp=str(int((hour_ago + 60) * 1000)),
    )
    assert sorted(r.n for r in recent.collect()) == list(range(50, 70))


def test_data_loss_at_planning_and_clear_errors(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    j = prefix + "lossy"
    records = json_records(0, 60, pad=40)
    appends = [b"".join(records[i : i + 20]) for i in range(0, 60, 20)]
    fill(gz, j, appends)
    first = gz.list_all_fragments(j)[0]
    fragment_file(spark_broker, gz, j, 0).unlink()
    wait_for(
        lambda: first.spec.begin not in {f.spec.begin for f in gz.list_all_fragments(j)},
        what="the broker to drop the removed fragment",
    )
    from_zero = {
        "journals": j,
        "framing": "json",
        "startingOffsets": json.dumps({j: 0}),
        "fileRoot": str(spark_broker.file_root),  # The remaining fragments are read directly.
    }
    with pytest.raises(PySparkException, match=r"data loss in journal .*offsets \[0, "):
        reader(spark, spark_broker, **from_zero).collect()
    skipped = reader(spark, spark_broker, failOnDataLoss="false", **from_zero)
    assert sorted(r.n for r in skipped.collect()) == list(range(20, 60))
    # "earliest" is the first fragment still there: no loss to report.
    assert reader(spark, spark_broker, journals=j, framing="lines").count() == 40

    with pytest.raises(
        PySparkException, match=r"unknown option 'startingoffset'.*did you mean startingOffsets"
    ):
        reader(spark, spark_broker, journals=j, startingOffset="earliest").collect()
    with pytest.raises(PySparkException, match="JOURNAL_NOT_FOUND"):
        reader(spark, spark_broker, journals=prefix + "missing").collect()
    with pytest.raises(PySparkException, match=r"column n must be|cannot be read with framing"):
        spark.read.format("gazette").schema("n LONG").option("journals", j).load().collect()


def test_the_format_registers_itself_and_by_hand(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    import pkgutil

    import pyspark_gazette
    from pygazette.spark import GazetteDataSource, register

    # PySpark's lookup: top-level modules named pyspark_* with a DefaultSource.
    assert "pyspark_gazette" in {m.name for m in pkgutil.iter_modules()}
    assert pyspark_gazette.DefaultSource is GazetteDataSource
    assert GazetteDataSource.name() == "gazette"
    j = prefix + "registered"
    create_journals(gz, journal_spec(j))
    gz.append(j, b"one\ntwo\n")
    register(spark)  # Registering by hand replaces the found one: same class, same results.
    assert reader(spark, spark_broker, journals=j, framing="lines").count() == 2


def test_json_columns_of_maps_dates_and_binary_read_back_what_the_sink_wrote(
    spark: SparkSession, spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    # The sink writes JSON as Spark's JSON writer does: maps as objects, dates as yyyy-MM-dd,
    # binary as base64. Read with the same schema, a map column failed every read ('JSON
    # conversion to map<string, int64> is not supported'), so did a date ('changed from
    # number to string'), and binary came back as its base64 text.
    import datetime

    j = prefix + "typed"
    create_journals(gz, journal_spec(j))
    schema = (
        "id LONG, m MAP<STRING, LONG>, d DATE, b BINARY, "
        "s STRUCT<when: DATE, tags: MAP<STRING, STRING>>, bs ARRAY<BINARY>, t TIMESTAMP"
    )
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000)
    rows = [
        (
            i,
            {"a": i, "b": None} if i % 2 else {},
            datetime.date(2024, 1, 1) + datetime.timedelta(days=i),
            bytes([i, 0, 255]) + b"\n",
            (datetime.date(2000, 2, 29), {"k": str(i)}) if i % 3 else None,
            [b"\x00", None, bytes([i])],
            when + datetime.timedelta(seconds=i),
        )
        for i in range(6)
    ]
    rows.append((6, None, None, None, None, None, None))
    df = spark.createDataFrame(rows, schema)
    df.coalesce(1).write.format("gazette").mode("append").option("broker", spark_broker.url).option(
        "journal", j
    ).option("framing", "json").save()
    back = spark.read.format("gazette").schema(schema).option("broker", spark_broker.url)
    read = back.option("journals", j).option("framing", "json").load()
    assert sorted(read.collect()) == sorted(df.collect())
