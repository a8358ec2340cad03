"""Shard state that crosses between Gazette and pygazette: RocksDB recorded in Gazette's
recoverylog format by one, recovered and opened by the other.

- Go to Python: Gazette's stream-sum `summer` (store label `rocksdb`: Gazette's
  store-rocksdb on Debian's librocksdb 7.8) records its shard on pygazette brokers;
  `pygazette shards recover` plays the log into a directory that rocksdict (RocksDB 9.x)
  opens: every stream's Sum (the summer's JSON value under the stream's 16-byte ID) is the
  final sum the summer published, and the checkpoint is under Gazette's key. `gazctl shards
  recover` of the same shard yields the same keys and values.
- Python to Go: pygazette's RocksDBStore (the Counter app's store for `*-rocksdb` shards)
  records its shard; `gazctl shards recover` plays the log, and `rocksdump` (Go, gorocksdb on
  Debian's librocksdb) opens the directory read-write: the counts and the checkpoint are those
  pygazette wrote, equal to what `pygazette shards recover` yields, read by rocksdict.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rocksdict

from pygazette.client import JournalClient, apply_journals
from pygazette.client.append_service import AppendService
from pygazette.consumer.rocksdb_store import CHECKPOINT_KEY, mark_key
from pygazette.consumer.shard_client import ShardClient
from pygazette.message.publisher import Publisher
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.interop.test_gazctl_shards import escaping_file_store, journal_spec
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries
from tests.support.gazette_stream_sum import SUMS, StreamSum, Workload, stream_sum_binaries

NDJSON = "application/x-ndjson"
RECOVERY_LOG = "application/x-gazette-recoverylog"


def rocksdb_items(directory: Path) -> dict[bytes, bytes]:
    db = rocksdict.Rdict(str(directory), rocksdict.Options(raw_mode=True))
    try:
        return {bytes(k): bytes(v) for k, v in db.items()}  # type: ignore[arg-type]
    finally:
        db.close()


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def pygazette_recover(shard: str, directory: Path, consumer: str, broker: str) -> None:
    run(
        [sys.executable, "-m", "pygazette.cli.main", "shards", "recover", "--id", shard,
         "--dir", str(directory), "--consumer", consumer, "--broker", broker]
    )  # fmt: skip


def gazctl_recover(
    gazctl: Path, shard: str, directory: Path, consumer: str, broker: str
) -> None:
    run(
        [str(gazctl), "shards", "recover", f"--consumer.address={consumer}",
         f"--broker.address={broker}", "--id", shard, "--dir", str(directory)]
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_summers_rocksdb_recovered_by_pygazette_opens_in_rocksdict(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    # Two partitions: part-000 in RocksDB, part-001 in SQLite (stream-sum's shard specs).
    w = Workload(workers=2, streams=4, chunks=20, partitions=2, summers=1)
    sums = StreamSum("pygazette", binaries, etcd, tmp_path, w)
    try:
        sums.start()
        sums.run_chunker(180)
        broker = sums.cluster.endpoints[0]
        consumer = f"http://127.0.0.1:{sums.summer_ports[0]}"
        ours, theirs = tmp_path / "pygazette-recovered", tmp_path / "gazctl-recovered"
        pygazette_recover("chunks-part-000", ours, consumer, broker)
        gazctl_recover(sums.gazctl, "chunks-part-000", theirs, consumer, broker)
        published = run(
            [str(sums.gazctl), "journals", "read", f"--broker.address={broker}",
             "-l", f"name={SUMS}"]
        )  # fmt: skip
    finally:
        sums.stop()
    finals = {}
    for line in published.splitlines():
        if line.startswith("{"):
            msg = json.loads(line)
            if msg.get("SeqNo") == w.chunks + 1:
                finals[bytes(msg["ID"])] = msg

    items = rocksdb_items(ours)
    assert items == rocksdb_items(theirs)  # Both tools recover the same database.
    cp = cpb.Checkpoint.FromString(items.pop(CHECKPOINT_KEY))
    assert cp.sources["examples/stream-sum/chunks/part-000"].read_through > 0
    read_through = cp.sources["examples/stream-sum/chunks/part-000"].read_through
    assert read_through > 0
    # Gazette's legacy offset mark beside it (cockroach-encoded varint).
    assert items.pop(mark_key("examples/stream-sum/chunks/part-000"))
    assert items, "the summer stored no sums"
    for key, value in items.items():
        assert len(key) == 16, key  # A StreamID.
        stored = json.loads(value)  # The summer's Sum, as json.Marshal wrote it.
        assert bytes(stored["ID"]) == key
        # Every stream of the partition ran to its end: its stored Sum is the final one.
        final = finals[key]
        assert (stored["SeqNo"], stored["Value"]) == (final["SeqNo"], final["Value"])


# Python to Go. ------------------------------------------------------------------------------


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker" / "data")
    proc.data_dir.parent.mkdir(parents=True, exist_ok=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.mark.timeout(240)
async def test_pygazettes_rocksdb_recovered_by_gazctl_opens_in_go(
    binaries: GazetteBinaries, etcd: EtcdServer, broker: BrokerProcess, tmp_path: Path
) -> None:
    rocksdump = stream_sum_binaries(binaries.gazette.parent)[0].parent / "rocksdump"
    root = f"/interop-rocksdb-{uuid.uuid4().hex[:12]}"
    source, out, log = "rocks/in", "rocks/out", "rocks/recovery/counter-rocksdb"
    shard = "counter-rocksdb"
    async with JournalClient(broker.url) as client:
        specs = [journal_spec(j, NDJSON, "file:///", 1 << 20) for j in (source, out)]
        # gazctl reads the log's fragments from the store itself (test_gazctl_shards.py).
        specs.append(journal_spec(log, RECOVERY_LOG, escaping_file_store(broker.file_root), 4096))
        await apply_journals(
            client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
        )
    consumer = ConsumerProcess(
        tmp_path / "consumer" / "data",
        app="tests.consumer.apps:Counter",
        broker=broker.url,
        etcd=etcd.url,
        etcd_prefix=f"{root}/consumer",
        member_id="member-0",
        extra_args=["--lease-ttl", "2s", "--hints-interval", "1s"],
        env={"COUNTER_OUTPUT": out},
    )
    consumer.data_dir.parent.mkdir(parents=True)
    consumer.start()
    try:
        shardspace = tmp_path / "shards.yaml"
        shardspace.write_text(
            f"common:\n  recovery_log_prefix: rocks/recovery\n  hint_prefix: {root}/hints\n"
            f"  hint_backups: 1\n  max_txn_duration: 100ms\n"
            f"shards:\n- id: {shard}\n  sources:\n  - journal: {source}\n"
        )
        env = {**os.environ, "CONSUMER_ADDRESS": consumer.url, "BROKER_ADDRESS": broker.url}
        await asyncio.to_thread(
            run, [sys.executable, "-m", "pygazette.cli.main", "shards", "apply",
                  "--specs", str(shardspace)], env
        )  # fmt: skip
        sent = 0
        head = 0
        async with JournalClient(broker.url) as client, AppendService(client) as service:
            pub = Publisher(service)
            for _round in range(3):  # Several transactions.
                msgs = [{"key": f"k{(sent + i) % 10}"} for i in range(200)]
                for aa in pub.publish_committed_many(lambda _m: (source, NDJSON), msgs):
                    await aa
                    assert aa.response is not None
                    head = aa.response.commit.end
                sent += len(msgs)
                async with ShardClient(consumer.url) as shards:
                    await shards.stat(shard, {source: head}, within=60)

        theirs, ours = tmp_path / "gazctl-recovered", tmp_path / "pygazette-recovered"
        await asyncio.to_thread(
            gazctl_recover, binaries.gazctl, shard, theirs, consumer.url, broker.url
        )
        await asyncio.to_thread(pygazette_recover, shard, ours, consumer.url, broker.url)
    finally:
        consumer.kill()
    expected = rocksdb_items(ours)
    dumped = json.loads(await asyncio.to_thread(run, [str(rocksdump), str(theirs)]))
    go_items = {bytes.fromhex(k): bytes.fromhex(v) for k, v in dumped.items()}
    assert go_items == expected
    cp = cpb.Checkpoint.FromString(go_items.pop(CHECKPOINT_KEY))
    assert cp.sources[source].read_through == head
    go_items.pop(mark_key(source))
    counts: dict[str, Any] = {k.decode(): int(v) for k, v in go_items.items()}
    assert counts == {f"k{i}": sent // 10 for i in range(10)}
