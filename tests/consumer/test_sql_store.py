"""PostgresStore (Gazette's SQLStore) against a real, throwaway PostgreSQL server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import psycopg
import pytest

from pygazette.consumer.memory_store import EarlierCommitFailed
from pygazette.consumer.sql_store import PostgresStore, shard_fqn
from pygazette.consumer.store import StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb
from tests.consumer.test_store_support import FakeShard, checkpoint, failed_future, read_through
from tests.support.postgres_process import PostgresProcess, postgres_bin_dir

pytestmark = pytest.mark.skipif(
    postgres_bin_dir() is None,
    reason="PostgreSQL is not installed (initdb/postgres; .ci/install-system-deps installs it)",
)

SHARD = FakeShard()
FQN = "/tests/consumer/items/tests/stores/shard-000"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresProcess]:
    server = PostgresProcess()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def dsn(postgres: PostgresProcess) -> AsyncIterator[str]:
    """A fresh database for the test, with the app's table."""
    name = "t_" + uuid.uuid4().hex[:12]
    async with await psycopg.AsyncConnection.connect(postgres.dsn, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    url = f"host=127.0.0.1 port={postgres.port} user=postgres dbname={name}"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BIGINT NOT NULL)")
    yield url


async def put(store: PostgresStore, k: str, v: int) -> None:
    conn = await store.transaction()
    await conn.execute(
        "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v", (k, v)
    )


async def bump(store: PostgresStore, k: str) -> None:
    conn = await store.transaction()
    await conn.execute(
        "INSERT INTO kv VALUES (%s, 1) ON CONFLICT (k) DO UPDATE SET v = kv.v + 1", (k,)
    )


async def table(
    dsn: str, query: str = "SELECT k, v FROM kv ORDER BY k"
) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query)
        return list(await cur.fetchall())


async def restored(dsn: str) -> cpb.Checkpoint:
    store = PostgresStore(dsn)
    try:
        return await store.restore_checkpoint(SHARD)
    finally:
        await store.aclose()


async def lock_waiters(dsn: str) -> int:
    rows = await table(
        dsn,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    return int(str(rows[0][0]))


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll server state until `check()` holds (the server offers nothing to wait on)."""
    async with asyncio.timeout(within):
        while True:
            if await check():
                return
            await asyncio.sleep(0.01)


def test_shard_fqn_is_the_spec_key_of_the_shard() -> None:
    assert shard_fqn(SHARD) == FQN
    assert shard_fqn(FakeShard(shard_id="a/b", root="/x/assign/y")) == "/x/assign/y/items/a/b"


async def test_round_trip_through_a_new_store(dsn: str) -> None:
    store = PostgresStore(dsn)
    assert await store.restore_checkpoint(SHARD) == cpb.Checkpoint()
    assert store.fence == 1
    await put(store, "a", 1)
    await put(store, "b", 2)
    await store.start_commit(SHARD, checkpoint(5, ack=b"ack"), [])
    assert await table(dsn) == [("a", 1), ("b", 2)]
    store.destroy()

    again = PostgresStore(dsn)
    assert await again.restore_checkpoint(SHARD) == checkpoint(5, ack=b"ack")
    assert again.fence == 2
    rows = await table(dsn, "SELECT shard_fqn, fence, checkpoint FROM gazette_checkpoints")
    assert rows == [(FQN, 2, checkpoint(5, ack=b"ack").SerializeToString())]
    # A commit with no statements of the app's still stores the checkpoint.
    await again.start_commit(SHARD, checkpoint(6), [])
    again.destroy()
    third = PostgresStore(dsn, shard_fqn="explicit")
    assert await third.restore_checkpoint(SHARD) == cpb.Checkpoint()
    await third.aclose()
    assert read_through(await restored(dsn)) == 6


async def test_failing_wait_for_rolls_the_transaction_back(dsn: str) -> None:
    store = PostgresStore(dsn)
    await store.restore_checkpoint(SHARD)
    await put(store, "a", 1)
    await store.start_commit(SHARD, checkpoint(1), [])
    await put(store, "a", 2)
    await put(store, "b", 2)
    first = store.start_commit(SHARD, checkpoint(2), [failed_future(RuntimeError("no append"))])
    await put(store, "c", 3)
    second = store.start_commit(SHARD, checkpoint(3), [])
    with pytest.raises(RuntimeError, match="no append"):
        await first
    with pytest.raises(EarlierCommitFailed):
        await second
    with pytest.raises(EarlierCommitFailed):
        await store.transaction()
    assert await table(dsn) == [("a", 1)]
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    await put(store, "d", 4)
    await store.start_commit(SHARD, checkpoint(4), [])
    assert await table(dsn) == [("a", 1), ("d", 4)]
    await store.aclose()


async def test_pipelined_transactions_commit_in_order(dsn: str) -> None:
    store = PostgresStore(dsn)
    await store.restore_checkpoint(SHARD)
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    await bump(store, "n")
    await put(store, "first", 1)
    first = store.start_commit(SHARD, checkpoint(1), [gate])

    # The next transaction runs on another connection: it doesn't see the first's
    # uncommitted rows, and its update of the same row waits for the first to commit.
    conn = await store.transaction()
    cur = await conn.execute("SELECT count(*) FROM kv WHERE k = 'first'")
    assert await cur.fetchone() == (0,)
    blocked = asyncio.ensure_future(bump(store, "n"))

    async def waiting_on_the_lock() -> bool:
        return await lock_waiters(dsn) > 0

    await eventually(waiting_on_the_lock)
    assert not blocked.done()
    second = store.start_commit(SHARD, checkpoint(2), [blocked])
    order: list[int] = []
    first.add_done_callback(lambda _f: order.append(1))
    second.add_done_callback(lambda _f: order.append(2))
    gate.set_result(None)
    await asyncio.gather(first, second)
    assert order == [1, 2]
    assert await table(dsn) == [("first", 1), ("n", 2)]
    assert read_through(await store.restore_checkpoint(SHARD)) == 2
    await store.aclose()


async def test_a_newer_store_fences_the_older(dsn: str) -> None:
    old = PostgresStore(dsn)
    await old.restore_checkpoint(SHARD)
    await put(old, "owner", 1)
    await old.start_commit(SHARD, checkpoint(1), [])

    new = PostgresStore(dsn)
    assert read_through(await new.restore_checkpoint(SHARD)) == 1
    assert (old.fence, new.fence) == (1, 2)

    await put(old, "owner", 666)
    await put(old, "deposed", 1)
    with pytest.raises(StoreFenced):
        await old.start_commit(SHARD, checkpoint(2), [])
    with pytest.raises(StoreFenced):
        await old.start_commit(SHARD, checkpoint(3), [])
    with pytest.raises(StoreFenced):
        await old.transaction()
    assert await table(dsn) == [("owner", 1)]  # Nothing of the deposed store's commit.

    await put(new, "owner", 2)
    await new.start_commit(SHARD, checkpoint(4), [])
    assert await table(dsn) == [("owner", 2)]
    old.destroy()
    await new.aclose()
    assert read_through(await restored(dsn)) == 4


async def test_destroy_closes_connections_and_rolls_back(dsn: str) -> None:
    store = PostgresStore(dsn)
    await store.restore_checkpoint(SHARD)
    await put(store, "open", 1)
    count = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    before = int(str((await table(dsn, count))[0][0]))
    store.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        await store.transaction()

    async def closed() -> bool:  # The server notices the closed sockets asynchronously.
        return int(str((await table(dsn, count))[0][0])) < before

    await eventually(closed)
    assert await table(dsn) == []


async def test_commit_before_restore_fails(dsn: str) -> None:
    store = PostgresStore(dsn)
    with pytest.raises(RuntimeError, match="restore_checkpoint"):
        await store.start_commit(SHARD, checkpoint(1), [])
    await store.aclose()


async def test_missing_table_is_an_error_without_create_table(dsn: str) -> None:
    store = PostgresStore(dsn, table="no_such_table", create_table=False)
    with pytest.raises(psycopg.errors.UndefinedTable):
        await store.restore_checkpoint(SHARD)
    await store.aclose()
