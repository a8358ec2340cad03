"""JSONFileStore: as a local file store, and recorded into a recovery log on a real broker
(replayed by the Player into a fresh directory)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pygazette.client import JournalClient
from pygazette.consumer.json_file_store import JSONFileStore
from pygazette.consumer.memory_store import EarlierCommitFailed
from pygazette.consumer.store import StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb
from tests.consumer.test_store_support import (
    FakeShard,
    checkpoint,
    create_log,
    failed_future,
    files_of,
    read_through,
    replay,
    take_over,
)
from tests.support.broker_process import BrokerProcess

SHARD = FakeShard()
LOG = "tests/stores/json/recovery-log"


# As a local file store. --------------------------------------------------------------------


async def test_local_round_trip_survives_a_new_store(tmp_path: Path) -> None:
    store = JSONFileStore(state={"counts": {}}, directory=tmp_path)
    assert await store.restore_checkpoint(SHARD) == cpb.Checkpoint()
    assert store.state == {"counts": {}}
    assert not store.path.exists()
    store.state["counts"]["a"] = 1
    await store.start_commit(SHARD, checkpoint(7, ack=b"\x00ack"), [])
    store.destroy()

    doc = json.loads(store.path.read_bytes())
    assert doc["state"] == {"counts": {"a": 1}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]

    again = JSONFileStore(state={"counts": {}}, directory=tmp_path)
    assert await again.restore_checkpoint(SHARD) == checkpoint(7, ack=b"\x00ack")
    assert again.state == {"counts": {"a": 1}}


async def test_local_failed_wait_for_leaves_the_file_alone(tmp_path: Path) -> None:
    store = JSONFileStore(state={"n": 0}, directory=tmp_path)
    store.state["n"] = 1
    await store.start_commit(SHARD, checkpoint(1), [])
    before = store.path.read_bytes()
    store.state["n"] = 2
    first = store.start_commit(SHARD, checkpoint(2), [failed_future(RuntimeError("no append"))])
    store.state["n"] = 3
    second = store.start_commit(SHARD, checkpoint(3), [])
    with pytest.raises(RuntimeError, match="no append"):
        await first
    with pytest.raises(EarlierCommitFailed):
        await second
    assert store.path.read_bytes() == before
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert store.state == {"n": 1}


async def test_local_pipelined_commits_complete_in_order(tmp_path: Path) -> None:
    store = JSONFileStore(state={"n": 0}, directory=tmp_path)
    loop = asyncio.get_running_loop()
    gates = [loop.create_future() for _ in range(3)]
    commits = []
    for i, gate in enumerate(gates):
        store.state["n"] = i + 1  # Serialized at start_commit.
        commits.append(store.start_commit(SHARD, checkpoint(i + 1), [gate]))
    store.state["n"] = 100
    order: list[int] = []
    for i, commit in enumerate(commits):
        commit.add_done_callback(functools.partial(lambda i, _f: order.append(i), i))
    for gate in reversed(gates):
        gate.set_result(None)
    await asyncio.gather(*commits)
    assert order == [0, 1, 2]
    again = JSONFileStore(directory=tmp_path)
    assert again.state == {"n": 3}
    assert read_through(await again.restore_checkpoint(SHARD)) == 3


async def test_unserializable_state_fails_the_commit(tmp_path: Path) -> None:
    store = JSONFileStore(state={"n": 0}, directory=tmp_path)
    store.state["bad"] = object()
    with pytest.raises(TypeError):
        await store.start_commit(SHARD, checkpoint(1), [])
    assert not store.path.exists()
    await store.restore_checkpoint(SHARD)
    assert store.state == {"n": 0}


def test_needs_a_recorder_or_a_directory() -> None:
    with pytest.raises(ValueError, match="recorder or a directory"):
        JSONFileStore()


# Recorded into a recovery log. -------------------------------------------------------------


@pytest.fixture(scope="module")
def log_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("json-store") / "broker-data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def client(
    log_broker: BrokerProcess, request: pytest.FixtureRequest
) -> AsyncIterator[JournalClient]:
    async with JournalClient(log_broker.url) as c:
        yield c


async def test_recorded_commits_replay_into_a_fresh_directory(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/replay"
    await create_log(client, log)
    primary = tmp_path / "primary"
    recorder = await take_over(client, log, primary)
    store = JSONFileStore(recorder, {"counts": {}})
    assert await store.restore_checkpoint(SHARD) == cpb.Checkpoint()
    for i in range(1, 4):
        store.state["counts"][f"k{i}"] = i
        await store.start_commit(SHARD, checkpoint(i, ack=b"ack%d" % i), [])
    store.destroy()
    assert files_of(primary) == {"state.json": (primary / "state.json").read_bytes()}

    standby = tmp_path / "standby"
    await replay(client, log, standby)
    assert files_of(standby) == files_of(primary)
    restored = JSONFileStore(directory=standby)
    assert restored.state == {"counts": {"k1": 1, "k2": 2, "k3": 3}}
    assert await restored.restore_checkpoint(SHARD) == checkpoint(3, ack=b"ack3")


async def test_recorded_failed_wait_for_records_nothing(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/atomic"
    await create_log(client, log)
    primary = tmp_path / "primary"
    store = JSONFileStore(await take_over(client, log, primary), {"n": 0})
    store.state["n"] = 1
    await store.start_commit(SHARD, checkpoint(1), [])
    store.state["n"] = 2
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failing = store.start_commit(SHARD, checkpoint(2), [gate])
    gate.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await failing
    # Locally and in the log, the last commit is the first one.
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert store.state == {"n": 1}
    store.destroy()
    standby = tmp_path / "standby"
    await replay(client, log, standby)
    replayed = JSONFileStore(directory=standby)
    assert replayed.state == {"n": 1}
    assert read_through(await replayed.restore_checkpoint(SHARD)) == 1


async def test_recorded_store_of_a_deposed_primary_is_fenced(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/fenced"
    await create_log(client, log)
    old = JSONFileStore(await take_over(client, log, tmp_path / "old"), {"owner": "old"})
    await old.start_commit(SHARD, checkpoint(1), [])

    # A new primary takes the log over (plays it, and fences it to its own author).
    new = JSONFileStore(await take_over(client, log, tmp_path / "new"), {"owner": "?"})
    assert new.state == {"owner": "old"}
    assert read_through(await new.restore_checkpoint(SHARD)) == 1

    old.state["owner"] = "old-again"
    with pytest.raises(StoreFenced):
        await old.start_commit(SHARD, checkpoint(2), [])
    with pytest.raises(StoreFenced):
        await old.start_commit(SHARD, checkpoint(3), [])
    new.state["owner"] = "new"
    await new.start_commit(SHARD, checkpoint(4), [])

    standby = tmp_path / "standby"
    await replay(client, log, standby)
    replayed = JSONFileStore(directory=standby)
    assert replayed.state == {"owner": "new"}
    assert read_through(await replayed.restore_checkpoint(SHARD)) == 4
