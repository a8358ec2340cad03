"""MemoryStore, and the commit sequencing (CommitPipeline) all stores share."""

from __future__ import annotations

import asyncio
import contextlib
import functools

import pytest

from pygazette.client.append_service import finished_operation
from pygazette.consumer.memory_store import CommitPipeline, EarlierCommitFailed, MemoryStore
from pygazette.consumer.store import StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb
from tests.consumer.test_store_support import FakeShard, checkpoint, read_through

SHARD = FakeShard()


async def test_new_store_restores_an_empty_checkpoint_and_the_initial_state() -> None:
    store = MemoryStore({"n": 0})
    assert await store.restore_checkpoint(SHARD) == cpb.Checkpoint()
    assert store.state == {"n": 0}
    assert MemoryStore().state == {}


async def test_commit_and_restore_round_trip() -> None:
    store = MemoryStore({"n": 0})
    await store.restore_checkpoint(SHARD)
    store.state["n"] = 1
    await store.start_commit(SHARD, checkpoint(10, ack=b"ack"), [])
    store.state["n"] = 2  # Not committed.
    cp = await store.restore_checkpoint(SHARD)
    assert cp == checkpoint(10, ack=b"ack")
    assert store.state == {"n": 1}
    assert store.committed_state == {"n": 1}


async def test_commit_snapshots_state_and_checkpoint_at_call_time() -> None:
    store = MemoryStore({"items": []})
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cp = checkpoint(5)
    store.state["items"].append(1)
    commit = store.start_commit(SHARD, cp, [gate])
    # The next transaction runs while this one commits.
    store.state["items"].append(2)
    cp.sources["a/source"].read_through = 999
    await asyncio.sleep(0)
    assert not commit.done()
    gate.set_result(None)
    await commit
    assert store.committed_state == {"items": [1]}
    assert read_through(await store.restore_checkpoint(SHARD)) == 5


async def test_failing_wait_for_commits_nothing_and_fails_later_commits() -> None:
    store = MemoryStore({"n": 0})
    store.state["n"] = 1
    await store.start_commit(SHARD, checkpoint(1), [])
    store.state["n"] = 2
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first = store.start_commit(SHARD, checkpoint(2), [gate])
    store.state["n"] = 3
    second = store.start_commit(SHARD, checkpoint(3), [])  # Pipelined behind `first`.
    gate.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await first
    with pytest.raises(EarlierCommitFailed):
        await second
    with pytest.raises(EarlierCommitFailed):
        await store.start_commit(SHARD, checkpoint(4), [])
    # Restore rolls back to the last durable commit, and commits work again.
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert store.state == {"n": 1}
    store.state["n"] = 5
    await store.start_commit(SHARD, checkpoint(5), [])
    assert store.committed_state == {"n": 5}


async def test_pipelined_commits_complete_in_call_order() -> None:
    store = MemoryStore({"n": 0})
    loop = asyncio.get_running_loop()
    gates = [loop.create_future() for _ in range(3)]
    commits = []
    for i, gate in enumerate(gates):
        store.state["n"] = i + 1
        commits.append(store.start_commit(SHARD, checkpoint(i + 1), [gate]))
    order: list[int] = []
    for i, commit in enumerate(commits):
        commit.add_done_callback(functools.partial(lambda i, _f: order.append(i), i))
    # Dependencies resolve in reverse order; commits still complete in call order.
    for gate in reversed(gates):
        gate.set_result(None)
    await asyncio.gather(*commits)
    assert order == [0, 1, 2]
    assert store.committed_state == {"n": 3}
    assert read_through(await store.restore_checkpoint(SHARD)) == 3


async def test_a_commit_waits_for_all_of_its_dependencies() -> None:
    store = MemoryStore()
    loop = asyncio.get_running_loop()
    a, b = loop.create_future(), loop.create_future()
    commit = store.start_commit(SHARD, checkpoint(1), [a, b])
    a.set_result(None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not commit.done()
    b.set_result(None)
    await commit


async def test_pipeline_repeats_a_fenced_failure_as_store_fenced() -> None:
    pipeline = CommitPipeline()

    async def fenced() -> None:
        raise StoreFenced("newer primary")

    async def fine() -> None:
        return None

    first = pipeline.start([], fenced)
    second = pipeline.start([], fine)
    with pytest.raises(StoreFenced):
        await first
    with pytest.raises(StoreFenced):
        await second
    with pytest.raises(StoreFenced):
        await pipeline.start([], fine)


async def test_cancelling_an_awaiter_does_not_cancel_the_commit() -> None:
    store = MemoryStore({"n": 0})
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    store.state["n"] = 1
    first = store.start_commit(SHARD, checkpoint(1), [gate])
    store.state["n"] = 2
    second = store.start_commit(SHARD, checkpoint(2), [])

    async def await_quietly() -> None:
        with contextlib.suppress(Exception):
            await first

    waiter = asyncio.ensure_future(await_quietly())
    await asyncio.sleep(0)
    waiter.cancel()  # Cancels `first` (what it awaits), but not the commit itself.
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert first.cancelled()
    gate.set_result(None)
    await second
    assert store.committed_state == {"n": 2}
    assert read_through(await store.restore_checkpoint(SHARD)) == 2


async def test_destroy_cancels_commits_in_flight() -> None:
    store = MemoryStore()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(SHARD, checkpoint(1), [gate])
    store.destroy()
    with pytest.raises(asyncio.CancelledError):
        await commit


async def test_destroyed_store_is_unusable() -> None:
    store = MemoryStore()
    store.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        await store.restore_checkpoint(SHARD)
    with pytest.raises(RuntimeError, match="destroyed"):
        store.start_commit(SHARD, checkpoint(1), [])


async def test_wait_for_takes_append_service_operations() -> None:
    store = MemoryStore({"n": 0})
    await store.start_commit(SHARD, checkpoint(1), [finished_operation()])
    store.state["n"] = 1
    with pytest.raises(RuntimeError, match="append failed"):
        await store.start_commit(
            SHARD, checkpoint(2), [finished_operation(RuntimeError("append failed"))]
        )
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert store.state == {"n": 0}
