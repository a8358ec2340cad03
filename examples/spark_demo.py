"""`make demo`: the Spark examples end to end, against a local broker of its own.

1. Starts `pygazette serve` on a free port with a temporary data directory, and creates the
   journals of examples/spark/journalspace.yaml.
2. Appends click events (JSON lines) to examples/spark/clicks/part-000 and part-001.
3. Runs the streaming aggregation (spark_clicks_per_user.py) with Trigger.AvailableNow: it
   reads the clicks and writes per-user counts to examples/spark/clicks-per-user.
4. Appends more clicks and runs the aggregation again from its checkpoint: it picks up
   exactly the new clicks.
5. Runs the batch job (spark_fragments_to_parquet.py): the clicks journals' fragments into
   Parquet.

With `--broker URL` it runs against that broker instead (the quickstart's, say): the journals
are created there unless they exist, and they keep their clicks afterwards, for the examples
to run on their own (`--file-root`: that broker's file root, to read persisted fragments
straight from it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The demo starts processes (`journals apply`, Spark's JVM) while a client's gRPC threads may
# run: gRPC's fork support, which logs 'skipping fork() handlers' then, is off, as in the
# `pygazette` command.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from pyspark.sql import SparkSession  # noqa: E402
from spark_clicks_per_user import COUNTS, start  # noqa: E402
from spark_fragments_to_parquet import clicks, export  # noqa: E402

from pygazette.client import SyncJournalClient  # noqa: E402

PARTS = ["examples/spark/clicks/part-000", "examples/spark/clicks/part-001"]
USERS = [f"user-{i:02d}" for i in range(12)]
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the broker exited early")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the broker did not start")


def append_clicks(client: SyncJournalClient, count: int, rng: random.Random) -> Counter[str]:
    """Append `count` clicks, in appends of 500, to both partitions; returns clicks per user."""
    per_user: Counter[str] = Counter()
    now = datetime.now(UTC)
    for first in range(0, count, 500):
        batch = []
        for i in range(first, min(count, first + 500)):
            user = rng.choice(USERS)
            per_user[user] += 1
            ts = (now - timedelta(seconds=count - i)).isoformat()
            event = {"user": user, "page": rng.choice(PAGES), "ts": ts}
            batch.append(json.dumps(event).encode() + b"\n")
        client.append(PARTS[(first // 500) % 2], b"".join(batch))
    return per_user


def clicks_per_user(client: SyncJournalClient) -> Counter[str]:
    """Every click in the clicks journals, per user (earlier runs' too, with --broker)."""
    per_user: Counter[str] = Counter()
    for part in PARTS:
        for line in b"".join(client.read(part)).splitlines():
            if line.strip():
                per_user[json.loads(line)["user"]] += 1
    return per_user


def apply_journals(env: dict[str, str]) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "journals",
            "apply",
            "--specs",
            str(HERE / "spark" / "journalspace.yaml"),
        ],
        env=env,
        check=True,
    )


def latest_counts(client: SyncJournalClient) -> dict[str, int]:
    """Each user's last line in the counts journal is its current count."""
    counts: dict[str, int] = {}
    for line in b"".join(client.read(COUNTS)).splitlines():
        row = json.loads(line)
        counts[row["user"]] = row["clicks"]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", help="run against this broker, not one of its own")
    parser.add_argument("--file-root", help="with --broker: that broker's file root")
    args = parser.parse_args()
    rng = random.Random(6)
    with tempfile.TemporaryDirectory(prefix="pygazette-demo-") as tmp:
        if args.broker:
            step(f"using the broker at {args.broker}")
            with SyncJournalClient(args.broker) as client:
                names = {j.spec.name for j in client.list_journals("prefix=examples/spark/")}
            if not names >= {*PARTS, COUNTS}:
                apply_journals(dict(os.environ, BROKER_ADDRESS=args.broker))
            run(args.broker, tmp, rng, args.file_root)
            return
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, BROKER_ADDRESS=url)
        step(f"starting a broker on {url} (data in {tmp}/data)")
        broker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pygazette.cli.main",
                "serve",
                "--port",
                str(port),
                "--data-dir",
                f"{tmp}/data",
            ],
            env=env,
        )
        try:
            wait_listening(port, broker)
            apply_journals(env)
            run(url, tmp, rng, f"{tmp}/data/fragments")
        finally:
            broker.send_signal(signal.SIGTERM)
            broker.wait(30)


def run(url: str, tmp: str, rng: random.Random, file_root: str | None) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pygazette-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    checkpoint = f"{tmp}/checkpoints/clicks-per-user"
    with SyncJournalClient(url) as client:
        expected = clicks_per_user(client)  # None, but on a broker of earlier runs.
        step("appending 20,000 clicks to examples/spark/clicks/part-000 and part-001")
        expected += append_clicks(client, 20_000, rng)

        step("streaming aggregation: clicks -> clicks per user (Trigger.AvailableNow)")
        start(spark, url, checkpoint, available_now=True).awaitTermination()
        counts = latest_counts(client)
        show(counts)
        assert counts == dict(expected), "counts do not match the clicks appended"

        step("appending 5,000 more clicks, and running the aggregation again from its checkpoint")
        expected += append_clicks(client, 5_000, rng)
        start(spark, url, checkpoint, available_now=True).awaitTermination()
        counts = latest_counts(client)
        show(counts)
        assert counts == dict(expected), "counts do not match the clicks appended"
        print(f"total clicks: {sum(counts.values())} (each counted exactly once)")

        step("batch job: the clicks journals' fragments -> Parquet")
        fragments = sum(len(client.list_all_fragments(p)) for p in PARTS)
        stored = sum(1 for p in PARTS for f in client.list_all_fragments(p) if f.spec.backing_store)
        print(
            f"{fragments} fragments, {stored} of them persisted files read straight from the store"
        )
        out = f"{tmp}/clicks.parquet"
        rows = export(spark, url, out, file_root)
        print(f"wrote {rows} rows to {out}")
        clicks(spark, url).groupBy("journal").count().orderBy("journal").show(truncate=False)
    spark.stop()


def show(counts: dict[str, int]) -> None:
    for user in sorted(counts):
        print(f"  {user}  {counts[user]:>5}")


if __name__ == "__main__":
    main()
