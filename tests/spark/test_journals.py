"""Journal look-ups of the Spark source against a real broker: write heads, where a journal
listed but not served (yet) is an error only where the caller needs it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pygazette.client import SyncJournalClient, append, list_journals
from pygazette.protocol.errors import JournalNotFound
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from pygazette.spark import journals as jn
from pygazette.spark import runtime
from tests.support.broker_process import BrokerProcess
from tests.support.etcd_process import EtcdProcess
from tests.support.journal_data import append_each
from tests.support.spark_session import create_journals, journal_spec


def test_write_heads_leave_out_absent_journals_only_where_allowed(
    spark_broker: BrokerProcess, gz: SyncJournalClient, prefix: str
) -> None:
    served, absent = prefix + "served", prefix + "not-served"
    create_journals(gz, journal_spec(served))
    append_each(gz, served, [b"one\n", b"two\n"])

    # A stream's newly discovered journal may be listed before a broker serves it: it is
    # left out of this micro-batch (and discovered by the next).
    heads = runtime.call(
        spark_broker.url,
        lambda c: jn.write_heads(c, [served, absent], absent_ok=frozenset({absent})),
    )
    assert heads == {served: 8}
    # A journal the query already reads must be served: its absence is an error.
    with pytest.raises(JournalNotFound, match=absent):
        runtime.call(spark_broker.url, lambda c: jn.write_heads(c, [served, absent]))


async def test_a_fully_suspended_journal_reads_as_empty_at_its_head(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A journal with no content (never written, or all of it removed by retention) that is
    # suspended (e.g. by --auto-suspend) has no broker: its reads and listings are answered
    # SUSPENDED. To a query it is a journal without content, at the offset it was suspended.
    from pygazette.client import JournalClient, apply_journals
    from pygazette.client.suspension import suspend_journal
    from pygazette.spark.batch_reader import batch_ranges
    from pygazette.spark.options import parse_read_options
    from tests.broker.in_process_brokers import start_brokers

    brokers = await start_brokers(tmp_path, etcd, etcd_root, 1)
    try:
        url = f"http://127.0.0.1:{brokers[0].port}"
        async with JournalClient(url) as client:
            idles = [f"spark/suspended/idle-{i}" for i in range(3)]
            idle, used = idles[0], "spark/suspended/used"
            specs = [journal_spec(j, labels={"topic": "suspended"}) for j in (*idles, used)]
            await apply_journals(
                client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
            )
            await append(client, used, b"one\n")
            deadline = time.monotonic() + 30
            for j in idles:
                while not await suspend_journal(client, j):
                    assert time.monotonic() < deadline, "the journal was never suspended"
                    await asyncio.sleep(0.1)
            (listed,) = await list_journals(client, parse_selector(f"name={idle}"))
            assert listed.spec.suspend.level == pb.JournalSpec.Suspend.FULL

            # The heads of suspended journals come from their specs, all in one List (a List
            # walks every journal of the cluster: one per suspended journal, every trigger,
            # grows as their product).
            lists = []
            real_list = jn.list_journals

            async def counted(*args: object, **kwargs: object) -> object:
                lists.append(args)
                return await real_list(*args, **kwargs)  # type: ignore[arg-type]

            monkeypatch.setattr(jn, "list_journals", counted)
            heads = await jn.write_heads(client, [*idles, used])
            assert heads == {**dict.fromkeys(idles, 0), used: 4}
            assert len(lists) == 1
            monkeypatch.undo()
            assert await jn.write_heads(client, [idle, used]) == {idle: 0, used: 4}
            assert await jn.all_fragments(client, [idle]) == {idle: []}
            opts = parse_read_options(
                {"broker": url, "selector": "topic=suspended"}, streaming=False
            )
            ranges, _ = await batch_ranges(client, opts)
            assert ranges == {**{j: (0, 0) for j in idles}, used: (0, 4)}
    finally:
        for b in brokers:
            await b.stop(grace=1.0)


def test_a_stream_plans_its_micro_batches_across_a_broker_restart(broker: BrokerProcess) -> None:
    # The driver asks the broker for the journals, their heads and their fragments at every
    # trigger. A broker restarting (a rolling upgrade, a crash and restart) was unreachable
    # for a few seconds, and the first trigger in that window failed the query (UNAVAILABLE).
    # Gazette's client waits for the broker to be ready for such look-ups; so does the source.
    import threading

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from pygazette.spark.framing import Framing
    from pygazette.spark.options import parse_read_options
    from pygazette.spark.planning import GazettePartition
    from pygazette.spark.schema import default_schema, layout
    from pygazette.spark.stream_reader import GazetteStreamReader

    j = "spark/restarted/events"
    with SyncJournalClient(broker.url) as gz:
        create_journals(gz, journal_spec(j, labels={"topic": "restarted"}))
        append_each(gz, j, [b"one\n", b"two\n"])
    opts = parse_read_options(
        {"broker": broker.url, "selector": "topic=restarted", "framing": "lines"},
        streaming=True,
    )
    reader = GazetteStreamReader(opts, layout(default_schema(Framing.LINES), Framing.LINES))
    start = reader.initialOffset()

    def restarted() -> threading.Thread:
        broker.stop()
        thread = threading.Thread(target=broker.start)
        thread.start()
        return thread

    thread = restarted()
    try:
        end = reader.latestOffset({j: [0, start[j][1]]}, ReadAllAvailable())
    finally:
        thread.join()
    assert end == {j: [8, start[j][1]]}
    thread = restarted()
    try:
        parts = reader.partitions({j: [0, start[j][1]]}, end)
    finally:
        thread.join()
    rows = [
        row["value"]
        for part in parts
        if isinstance(part, GazettePartition)
        for batch in reader.read(part)
        for row in batch.to_pylist()
    ]
    assert rows == [b"one", b"two"]
