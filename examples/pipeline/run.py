"""`make demo-pipeline`: a data pipeline over journals on a standalone Spark cluster.

1. Starts etcd and a `pygazette serve` broker joined to it, and a standalone Spark cluster
   (a master and two one-core workers, tests/support/spark_cluster.py), all on loopback
   under one temporary directory; creates the journals of journalspace.yaml.
2. Appends page-view events (JSON lines, a few malformed) to examples/pipeline/events/*.
3. Starts two consumer processes of examples.pipeline.totals:UserTotals and applies
   shards.yaml: one shard per page-counts partition, each a SQLite store recorded to a
   recovery log.
4. Runs the Structured Streaming job (stream_job.py) on the cluster: clean, aggregate per
   (user, page), write exactly once to examples/pipeline/page-counts/*. Appends a second
   wave of events and runs it again from its checkpoint.
5. Waits for the consumer's per-user totals (examples/pipeline/user-totals) to account for
   every clean event, stops the consumers, and restarts the broker (it persists its spools:
   every record is in a fragment file).
6. Runs the batch report (report.py) on the cluster: fragment files into Parquet.
7. Prints counts in and out, and the top users; exits non-zero unless they agree.

    python examples/pipeline/run.py [--events 6000] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.pipeline import report, stream_job  # noqa: E402
from examples.pipeline.totals import USER_TOTALS  # noqa: E402
from examples.run_consumer_demo import ConsumerCluster, shard_ids, step  # noqa: E402
from pygazette.client import SyncJournalClient  # noqa: E402
from tests.support.spark_cluster import SparkCluster, cluster_conf  # noqa: E402
from tests.support.spark_session import new_session  # noqa: E402

APP = "examples.pipeline.totals:UserTotals"
PREFIX = "/gazette/consumers/pipeline-totals"
EVENT_JOURNALS = ["examples/pipeline/events/part-000", "examples/pipeline/events/part-001"]
PAGES = ["/", "/Docs", " /pricing", "/blog ", "/signup"]


class Tally:
    """What was appended: events, and the clean ones' views and milliseconds."""

    def __init__(self) -> None:
        self.events = self.malformed = self.views = self.ms = 0


def append_events(client: SyncJournalClient, rng: random.Random, count: int, tally: Tally) -> None:
    lines: dict[str, list[bytes]] = {j: [] for j in EVENT_JOURNALS}
    for i in range(count):
        user = f"user-{rng.randrange(40):02d}"
        event: dict[str, Any] = {"user": user, "page": rng.choice(PAGES), "ms": rng.randrange(5000)}
        bad = rng.random()
        if bad < 0.02:
            del event["user"]
        elif bad < 0.04:
            event["ms"] = -1
        elif bad < 0.05:
            event["page"] = None
        else:
            tally.views += 1
            tally.ms += event["ms"]
        tally.malformed += bad < 0.05
        tally.events += 1
        lines[EVENT_JOURNALS[i % 2]].append(json.dumps(event).encode() + b"\n")
    for journal, batch in lines.items():
        for i in range(0, len(batch), 500):
            client.append(journal, b"".join(batch[i : i + 500]))


def consumer_views(client: SyncJournalClient) -> tuple[int, int]:
    """Views and milliseconds over the latest user-totals record of each user."""
    latest: dict[str, dict[str, Any]] = {}
    for line in b"".join(client.read(USER_TOTALS)).splitlines():
        msg = json.loads(line)
        if "user" in msg:
            latest[msg["user"]] = msg
    return sum(m["views"] for m in latest.values()), sum(m["ms"] for m in latest.values())


def wait_until(cond: Any, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


async def demo(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-pipeline-"))
    (tmp / "services").mkdir()
    services = ConsumerCluster(tmp / "services")
    spark_cluster = SparkCluster(tmp / "spark-cluster", workers=2)
    # The cluster's three JVMs start while etcd, the broker and the consumers do.
    cluster_error: list[BaseException] = []

    def start_cluster() -> None:
        try:
            spark_cluster.start()
        except BaseException as exc:
            cluster_error.append(exc)

    starter = threading.Thread(target=start_cluster, daemon=True)
    spark = None
    ok = False
    try:
        step(f"etcd, a broker and a Spark cluster under {tmp}")
        starter.start()
        services.start()
        broker = services.broker
        print(f"etcd {services.etcd.url}, broker {broker.url}")
        print(await services.apply_journals(HERE / "journalspace.yaml"), end="")
        client = SyncJournalClient(broker.url)
        rng = random.Random(7)
        tally = Tally()

        step(f"append {args.events} page-view events (about 5% malformed)")
        append_events(client, rng, args.events, tally)
        print(f"{tally.events} events, {tally.malformed} malformed")

        step("consumer: two processes of UserTotals, one shard per page-counts partition")
        consumers = [services.add_consumer(APP, PREFIX, f"totals-{i}") for i in range(2)]
        specs = HERE / "shards.yaml"
        print(await services.apply_shards(specs, consumers[0]), end="")
        await services.wait_ready(PREFIX, shard_ids(specs))
        print("shards ready")

        starter.join()
        if cluster_error:
            raise cluster_error[0]
        print(
            f"Spark master {spark_cluster.url} (2 workers, started in "
            f"{spark_cluster.started_in:.0f} s)"
        )
        conf = cluster_conf(spark_cluster, "pipeline")
        conf["spark.ui.showConsoleProgress"] = "false"
        spark = new_session(tmp / "faults", tmp / "driver", conf)
        checkpoint = str(tmp / "checkpoints" / "page-counts")

        step("Structured Streaming on the cluster: clean, aggregate, write exactly once")
        t0 = time.monotonic()
        stream_job.start(spark, broker.url, checkpoint).awaitTermination()
        print(f"first run: {time.monotonic() - t0:.1f} s")
        half = args.events // 2
        append_events(client, rng, half, tally)
        print(f"appended {half} more events; running again from the checkpoint")
        t0 = time.monotonic()
        stream_job.start(spark, broker.url, checkpoint).awaitTermination()
        print(f"second run: {time.monotonic() - t0:.1f} s")

        step("consumer: waiting for the per-user totals to account for every clean event")
        wait_until(lambda: consumer_views(client)[0] == tally.views, "the consumer's totals")
        for proc in services.consumers:
            proc.stop(timeout=20)
        client.close()
        broker.stop()  # Persists its spools: every record is in a fragment file.
        broker.start()
        print("consumers stopped; broker restarted (everything persisted to fragment files)")

        step("Spark batch report on the cluster: fragment files -> Parquet")
        out = str(tmp / "report.parquet")
        result = report.report(spark, broker.url, str(broker.file_root), out)
        print(f"wrote {result['report_users']} users to {out}")

        step("counts in = counts out")
        rows = [
            ("events appended", tally.events),
            ("malformed (dropped by the streaming job)", tally.malformed),
            ("clean events (views)", tally.views),
            ("views in the stream's (user, page) totals", result["stream_views"]),
            ("views in the consumer's user totals", result["consumer_views"]),
        ]
        for label, value in rows:
            print(f"  {label:<44} {value:>8}")
        ok = (
            result["stream_views"] == result["consumer_views"] == tally.views
            and result["stream_ms"] == result["consumer_ms"] == tally.ms
        )
        print(
            f"  {'milliseconds in / stream / consumer':<44} {tally.ms} / "
            f"{result['stream_ms']} / {result['consumer_ms']}"
        )
        print("\n  top users (from the Parquet report)")
        print(f"  {'user':<10} {'pages':>5} {'views':>6} {'ms':>10}")
        for r in result["top"]:
            print(f"  {r['user']:<10} {r['pages']:>5} {r['views']:>6} {r['ms']:>10}")
        step("done: " + ("counts in = counts out" if ok else "FAILED: counts differ"))
    finally:
        if spark is not None:
            spark.stop()
        starter.join()
        spark_cluster.stop()
        await services.close()
        services.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=6000)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return asyncio.run(demo(args))


if __name__ == "__main__":
    sys.exit(main())
