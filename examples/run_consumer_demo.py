"""`make demo-consumer`: pygazette's consumer examples end to end, on a cluster of their own.

1. Starts etcd (the Debian `etcd` binary) on free loopback ports and a `pygazette serve`
   broker joined to it, each under one temporary directory.
2. Creates the journals of examples/stream_sum/journalspace.yaml and
   examples/word_count/journalspace.yaml (`pygazette journals apply`).
3. stream-sum: starts two consumer processes of the summer
   (`pygazette consumer serve --app examples.stream_sum.summer:Summer --etcd ...`), applies
   its shards (`pygazette shards apply --specs examples/stream_sum/shards.yaml`: one
   primary and one hot standby per shard), waits for every shard's primary and standby,
   and runs the chunker, which verifies every stream's sum arrives exactly once.
4. word-count: starts two consumer processes of the counter, applies its shards, publishes
   three texts and queries a few words with read-your-writes (examples/word_count).
5. Stops everything and removes the temporary directory.

    python examples/run_consumer_demo.py [--streams 40] [--chunks 50] [--keep]

`ConsumerCluster` (etcd, a broker, consumer processes, CLI steps, waiting for shards) is
shared with the examples' end-to-end test and bench/consumer.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pygazette.keyspace.etcd import EtcdKeyspace  # noqa: E402
from pygazette.keyspace.layout import KeyLayout  # noqa: E402
from pygazette.protocol.pb import consumer_pb2 as cpb  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402
from tests.support.consumer_process import ConsumerProcess  # noqa: E402
from tests.support.etcd_process import EtcdProcess  # noqa: E402

STREAM_SUM_APP = "examples.stream_sum.summer:Summer"
STREAM_SUM_PREFIX = "/gazette/consumers/stream-sum"
WORD_COUNT_APP = "examples.word_count.counter:Counter"
WORD_COUNT_PREFIX = "/gazette/consumers/word-count"
BROKER_PREFIX = "/gazette/cluster"

PRIMARY = cpb.ReplicaStatus.PRIMARY
STANDBY = cpb.ReplicaStatus.STANDBY
FAILED = cpb.ReplicaStatus.FAILED


class ConsumerCluster:
    """etcd, one broker joined to it, and consumer processes, under `tmp`."""

    def __init__(self, tmp: Path, *, lease_ttl: str = "20s", broker_lease_ttl: str = "20s") -> None:
        self.tmp = tmp
        self.lease_ttl = lease_ttl
        self.etcd = EtcdProcess(tmp / "etcd")
        self.broker = BrokerProcess(
            tmp / "broker",
            extra_args=[
                "--etcd",
                "",  # Set in start(), once etcd's port is known.
                "--etcd-prefix",
                BROKER_PREFIX,
                "--lease-ttl",
                broker_lease_ttl,
                "--id",
                "demo-broker",
            ],
        )
        self.consumers: list[ConsumerProcess] = []
        self._keyspaces: dict[str, EtcdKeyspace] = {}

    # Processes ---------------------------------------------------------------------------

    def start(self) -> None:
        self.etcd.start()
        self.broker.extra_args[1] = self.etcd.url
        self.broker.start()

    def add_consumer(
        self,
        app: str,
        prefix: str,
        member_id: str,
        *,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> ConsumerProcess:
        proc = ConsumerProcess(
            self.tmp / f"consumer-{member_id}",
            app=app,
            broker=self.broker.url,
            etcd=self.etcd.url,
            etcd_prefix=prefix,
            member_id=member_id,
            extra_args=["--lease-ttl", self.lease_ttl, *extra_args],
            env=env,
        )
        self.consumers.append(proc)
        proc.start()
        return proc

    def stop(self) -> None:
        for proc in self.consumers:
            with contextlib.suppress(Exception):
                proc.stop(timeout=10)
        with contextlib.suppress(Exception):
            self.broker.stop(timeout=10)
        with contextlib.suppress(Exception):
            self.etcd.stop()

    def logs(self) -> str:
        parts = [f"--- broker\n{self.broker.log()}"]
        parts += [f"--- consumer {c.member_id}\n{c.log()}" for c in self.consumers]
        return "\n".join(parts)

    # CLI steps ---------------------------------------------------------------------------

    async def cli(self, *args: str) -> str:
        """Run `pygazette ARGS` against this cluster's broker; its stdout."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "--broker",
            self.broker.url,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(
                f"pygazette {' '.join(args)} failed ({proc.returncode}): {err.decode().strip()}"
            )
        return out.decode()

    async def apply_journals(self, specs: Path) -> str:
        return await self.cli("journals", "apply", "--specs", str(specs))

    async def apply_shards(self, specs: Path, consumer: ConsumerProcess) -> str:
        return await self.cli("shards", "apply", "--specs", str(specs), "--consumer", consumer.url)

    # Waiting on shards -------------------------------------------------------------------

    async def keyspace(self, prefix: str) -> EtcdKeyspace:
        ks = self._keyspaces.get(prefix)
        if ks is None:
            ks = EtcdKeyspace(self.etcd.url, prefix)
            await ks.open()
            self._keyspaces[prefix] = ks
        return ks

    async def close(self) -> None:
        for ks in self._keyspaces.values():
            with contextlib.suppress(Exception):
                await ks.close()
        self._keyspaces.clear()

    async def replicas(self, prefix: str) -> dict[str, dict[int, tuple[str, cpb.ReplicaStatus]]]:
        """shard -> slot -> (member suffix, status), as the keyspace holds them now."""
        ks = await self.keyspace(prefix)
        layout = KeyLayout(prefix)
        out: dict[str, dict[int, tuple[str, cpb.ReplicaStatus]]] = {}
        for kv in ks.range(layout.assign_prefix):
            key = layout.parse_assignment_key(kv.key)
            status = cpb.ReplicaStatus()
            status.ParseFromString(kv.value)
            out.setdefault(key.item, {})[key.slot] = (key.suffix, status)
        return out

    async def wait_for(
        self, prefix: str, cond: Callable[[], bool], what: str, within: float = 90.0
    ) -> None:
        """Wait (on keyspace changes, not a timer) until `cond()` holds."""
        ks = await self.keyspace(prefix)
        deadline = time.monotonic() + within
        while not cond():
            failed = [
                f"{shard}: {list(st.errors)}"
                for shard, slots in (await self.replicas(prefix)).items()
                for _m, st in slots.values()
                if st.code == FAILED
            ]
            if failed:
                raise RuntimeError(f"shards failed while waiting for {what}: {failed}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}\n{self.logs()}")
            with contextlib.suppress(TimeoutError):
                await ks.wait_for_change(ks.revision, min(1.0, deadline - time.monotonic()))

    async def wait_ready(
        self, prefix: str, shards: Sequence[str], *, standbys: int = 0, within: float = 90.0
    ) -> None:
        """Wait until each shard has a primary and `standbys` caught-up hot standbys."""
        ks = await self.keyspace(prefix)
        layout = KeyLayout(prefix)

        def ready() -> bool:
            by_shard: dict[str, list[int]] = {s: [] for s in shards}
            for kv in ks.range(layout.assign_prefix):
                key = layout.parse_assignment_key(kv.key)
                if key.item in by_shard:
                    status = cpb.ReplicaStatus()
                    status.ParseFromString(kv.value)
                    by_shard[key.item].append(status.code)
            return all(
                codes.count(PRIMARY) == 1 and codes.count(STANDBY) >= standbys
                for codes in by_shard.values()
            )

        await self.wait_for(prefix, ready, f"primaries of {', '.join(shards)}", within)

    async def primary_of(self, prefix: str, shard: str) -> ConsumerProcess | None:
        slot0 = (await self.replicas(prefix)).get(shard, {}).get(0)
        if slot0 is None or slot0[1].code != PRIMARY:
            return None
        for proc in self.consumers:
            if proc.member_id == slot0[0] and proc.running():
                return proc
        return None


def shard_ids(specs: Path) -> list[str]:
    from pygazette.cli.shardspace import flatten, parse_shardspace

    return [entry.spec.id for entry in flatten(parse_shardspace(specs.read_text()))]


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


async def run_python(module: str, *args: str) -> tuple[int, str, str]:
    """Run `python -m module ARGS` (from the repository root); (status, stdout, stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=str(REPO),
    )
    out, err = await proc.communicate()
    return int(proc.returncode or 0), out.decode(), err.decode()


async def demo_stream_sum(cluster: ConsumerCluster, streams: int, chunks: int) -> dict[str, Any]:
    step("stream-sum: two summer processes, one shard per chunk partition (+1 hot standby)")
    specs = HERE / "stream_sum" / "shards.yaml"
    summers = [
        cluster.add_consumer(STREAM_SUM_APP, STREAM_SUM_PREFIX, f"summer-{i}") for i in range(2)
    ]
    print(await cluster.apply_shards(specs, summers[0]), end="")
    ids = shard_ids(specs)
    await cluster.wait_ready(STREAM_SUM_PREFIX, ids, standbys=1)
    print(f"shards ready: {', '.join(ids)}")

    step(f"stream-sum: chunker, {streams} streams x {chunks} chunks, verifying every sum")
    status, out, err = await run_python(
        "examples.stream_sum.chunker",
        "--broker",
        cluster.broker.url,
        "--consumer",
        summers[0].url,
        "--streams",
        str(streams),
        "--chunks",
        str(chunks),
        "--seed",
        "1",
    )
    if status != 0 or not out.strip():
        raise RuntimeError(f"chunker failed ({status}):\n{out}\n{err}\n{cluster.logs()}")
    summary: dict[str, Any] = json.loads(out)
    print(json.dumps(summary, indent=2))
    return summary


TEXTS = [
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
    "incredulity, it was the season of Light, it was the season of Darkness.",
    "If you really want to hear about it, the first thing you'll probably want to know is "
    "where I was born, and what my lousy childhood was like.",
    "I was born in the Year 1632, in the City of York, of a good Family, tho' not of that "
    "Country, my Father being a Foreigner of Bremen.",
]


async def demo_word_count(cluster: ConsumerCluster) -> dict[str, Any]:
    step("word-count: two counter processes, SQLite stores recorded to recovery logs")
    specs = HERE / "word_count" / "shards.yaml"
    counters = [
        cluster.add_consumer(WORD_COUNT_APP, WORD_COUNT_PREFIX, f"counter-{i}") for i in range(2)
    ]
    print(await cluster.apply_shards(specs, counters[0]), end="")
    ids = shard_ids(specs)
    await cluster.wait_ready(WORD_COUNT_PREFIX, ids)
    print(f"shards ready: {', '.join(ids)}")

    step("word-count: publish three texts")
    offsets = cluster.tmp / "word-count-offsets.json"
    for text in TEXTS:
        status, out, err = await run_python(
            "examples.word_count.publish",
            "--broker",
            cluster.broker.url,
            "--text",
            text,
            "--offsets",
            str(offsets),
        )
        if status != 0:
            raise RuntimeError(f"publish failed ({status}):\n{out}\n{err}")
        print(out.strip())

    step("word-count: query (Stat through the publisher's offsets, then the shard's store)")
    results: dict[str, Any] = {}
    for word in ("it", "was", "born", "times", "gazette"):
        status, out, err = await run_python(
            "examples.word_count.query",
            word,
            "--broker",
            cluster.broker.url,
            "--consumer",
            counters[0].url,
            "--offsets",
            str(offsets),
        )
        if status != 0:
            raise RuntimeError(f"query failed ({status}):\n{out}\n{err}\n{cluster.logs()}")
        print(out.strip())
        results[word] = json.loads(out)
    return results


async def demo(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-consumer-demo-"))
    cluster = ConsumerCluster(tmp)
    ok = False
    try:
        step(f"etcd and a broker under {tmp}")
        cluster.start()
        print(f"etcd {cluster.etcd.url}, broker {cluster.broker.url}")
        step("journals")
        for specs in (
            HERE / "stream_sum" / "journalspace.yaml",
            HERE / "word_count" / "journalspace.yaml",
        ):
            print(await cluster.apply_journals(specs), end="")
        summary = await demo_stream_sum(cluster, args.streams, args.chunks)
        counts = await demo_word_count(cluster)
        ok = bool(summary.get("ok")) and all("count" in r for r in counts.values())
        step("done: " + ("every sum verified exactly once" if ok else "FAILED"))
    finally:
        await cluster.close()
        cluster.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    return asyncio.run(demo(args))


if __name__ == "__main__":
    sys.exit(main())
