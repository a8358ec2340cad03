"""`PostgresStore`: a shard's state in a remote PostgreSQL database (Gazette's SQLStore).

Each consumer transaction is a SQL transaction on a connection of the store: the
application gets it with `await store.transaction()` (a `psycopg.AsyncConnection`; its SQL
transaction begins with the first statement) and issues its statements through it:

    def new_store(self, shard, recorder):
        return PostgresStore("postgresql://app@db.example/app")

    async def consume_message(self, shard, store, envelope, publisher):
        conn = await store.transaction()
        await conn.execute(
            "INSERT INTO counts VALUES (%s, 1) "
            "ON CONFLICT (key) DO UPDATE SET n = counts.n + 1", (envelope.message["key"],))

Checkpoints live in Gazette's fenced table (same name and columns as Gazette's SQLStore, so
a Gazette and a pygazette consumer can hand a shard over through it):

    CREATE TABLE gazette_checkpoints (
        shard_fqn  TEXT    PRIMARY KEY NOT NULL,
        fence      INTEGER NOT NULL,
        checkpoint BYTEA   NOT NULL   -- the marshaled consumer.Checkpoint
    );

(created if missing, unless `create_table=False`). `restore_checkpoint` increments the
shard's fence — inserting its row with fence 1 if there is none — in a transaction of its
own, and remembers the fence. `start_commit` hands the transaction's connection to the
commit (the next transaction gets another connection, so consuming and committing overlap,
as in Gazette); once the previous commit and every `wait_for` are done, the commit runs
`UPDATE gazette_checkpoints SET checkpoint=... WHERE shard_fqn=... AND fence=...` in that
same SQL transaction, and COMMITs it only if that updated the row. If it didn't, another
store restored the shard since: the transaction is rolled back and the commit raises
`StoreFenced` (and so does every later one). A failed commit rolls its transaction back:
nothing of it is committed.

Pipelined transactions run on different connections: the next transaction does not see the
uncommitted writes of the one committing, and its writes of the same rows wait (on row
locks) until that commit ends, as with Gazette's SQLStore over a connection pool.

The shard's FQN (the key of its spec in the keyspace, `<root>/items/<shard id>`) is
derived from the shard's assignment key, unless given as `shard_fqn`. `cache` is free for
the application's use (Gazette's `SQLStore.Cache`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from pygazette.consumer.memory_store import CommitPipeline, EarlierCommitFailed
from pygazette.consumer.store import CommitFuture, Store, StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb

if TYPE_CHECKING:
    from pygazette.consumer.shard_api import Shard

__all__ = ["DEFAULT_TABLE", "PostgresStore", "shard_fqn"]

DEFAULT_TABLE = "gazette_checkpoints"

Connection = psycopg.AsyncConnection[Any]


def shard_fqn(shard: Shard) -> str:
    """The shard's fully qualified name: its spec's key, `<root>/items/<shard id>`."""
    fqn = getattr(shard, "fqn", None)
    if isinstance(fqn, str) and fqn:
        return fqn
    key = shard.assignment.key
    marker = "/assign/" + shard.id + "#"
    at = key.rfind(marker)
    if at < 0:
        raise ValueError(f"can't derive the FQN of shard {shard.id} from assignment {key!r}")
    return key[:at] + "/items/" + shard.id


class PostgresStore(Store):
    """A store in a PostgreSQL database (see the module docstring).

    `conninfo`: a libpq connection string or URI; `connect_kwargs` go to
    `psycopg.AsyncConnection.connect` as well. `table`: the checkpoints table.
    `shard_fqn`: the key of the shard's checkpoint row (default: derived from the shard).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = DEFAULT_TABLE,
        shard_fqn: str | None = None,
        create_table: bool = True,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.table = table
        self.fqn = shard_fqn
        self.create_table = create_table
        self.connect_kwargs = dict(connect_kwargs or {})
        # Free for the application's use, e.g. rows read and modified in memory this
        # transaction, written out in finalize_txn.
        self.cache: Any = None
        self.fence = 0  # Fence value after restore, verified by every commit (0: none).
        self._pipeline = CommitPipeline()
        self._txn: Connection | None = None  # The current consumer transaction's.
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self._releases: set[asyncio.Task[None]] = set()
        self._destroyed = False
        ident = sql.Identifier(table)
        self._sql_create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            "shard_fqn TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL, "
            "checkpoint BYTEA NOT NULL)"
        ).format(ident)
        self._sql_fence = sql.SQL(
            "INSERT INTO {t} (shard_fqn, fence, checkpoint) VALUES (%s, 1, ''::bytea) "
            "ON CONFLICT (shard_fqn) DO UPDATE SET fence = {t}.fence + 1 "
            "RETURNING fence, checkpoint"
        ).format(t=ident)
        self._sql_update = sql.SQL(
            "UPDATE {} SET checkpoint = %s WHERE shard_fqn = %s AND fence = %s"
        ).format(ident)

    # The application's side ----------------------------------------------------------------

    async def transaction(self) -> Connection:
        """The connection of the current consumer transaction (its SQL transaction begins
        with the first statement, and is committed by the store)."""
        self._check_usable()
        failure = self._pipeline.failure
        if isinstance(failure, StoreFenced):
            raise StoreFenced(str(failure)) from failure
        if failure is not None:
            raise EarlierCommitFailed(f"PostgresStore: a commit failed: {failure!r}") from failure
        if self._txn is None:
            self._txn = await self._acquire()
        return self._txn

    # Store ---------------------------------------------------------------------------------

    async def restore_checkpoint(self, shard: Shard) -> cpb.Checkpoint:
        self._check_usable()
        await self._pipeline.drain()
        await self._settle_releases()
        if self._txn is not None:  # An abandoned transaction: nothing of it commits.
            conn, self._txn = self._txn, None
            await self._release(conn)
        if self.fqn is None:
            self.fqn = shard_fqn(shard)
        conn = await self._acquire()
        try:
            if self.create_table:
                try:
                    await conn.execute(self._sql_create)
                    await conn.commit()
                except psycopg.errors.UniqueViolation:
                    await conn.rollback()  # Created concurrently by another store.
            cur = await conn.execute(self._sql_fence, (self.fqn,))
            row = await cur.fetchone()
            await conn.commit()
        finally:
            await self._release(conn)
        assert row is not None
        fence, blob = row
        cp = cpb.Checkpoint()
        cp.ParseFromString(bytes(blob))
        self.fence = int(fence)
        self._pipeline.reset()
        return cp

    def start_commit(
        self, shard: Shard, checkpoint: cpb.Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> CommitFuture:
        self._check_usable()
        conn, self._txn = self._txn, None
        if self._pipeline.failure is not None or self.fence == 0:
            fut = (
                self._pipeline.failed_commit()
                if self._pipeline.failure is not None
                else _failed(RuntimeError("PostgresStore: restore_checkpoint() first"))
            )
            if conn is not None:
                self._release_soon(conn)
            return fut
        blob = checkpoint.SerializeToString()
        fence, fqn = self.fence, self.fqn
        holder: list[Connection] = [conn] if conn is not None else []

        async def apply() -> None:
            if not holder:
                holder.append(await self._acquire())
            txn = holder[0]
            cur = await txn.execute(self._sql_update, (blob, fqn, fence))
            if cur.rowcount != 1:
                raise StoreFenced(
                    f"checkpoint fence of {fqn} was updated (ie, by a new primary): "
                    f"this store holds fence {fence}"
                )
            await txn.commit()

        def finished() -> None:  # The commit is over: rolls back what it left open.
            if holder:
                self._release_soon(holder[0])

        return self._pipeline.start(wait_for, apply, finished=finished)

    def destroy(self) -> None:
        """Close the store's connections (rolling back open transactions)."""
        if self._destroyed:
            return
        self._destroyed = True
        self._pipeline.cancel()
        for task in self._releases:
            task.cancel()
        for conn in list(self._all):
            _close_now(conn)
        self._all.clear()
        self._idle.clear()
        self._txn = None

    async def aclose(self) -> None:
        """`destroy()`, from a coroutine, after letting a commit in flight finish."""
        await self._pipeline.drain()
        await self._settle_releases()
        self.destroy()

    # Internals -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._destroyed:
            raise RuntimeError("PostgresStore was destroyed")

    async def _acquire(self) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._all.discard(conn)
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=False, **self.connect_kwargs
        )
        if self._destroyed:
            await conn.close()
            raise RuntimeError("PostgresStore was destroyed")
        self._all.add(conn)
        return conn

    async def _release(self, conn: Connection) -> None:
        """Return `conn` to the idle connections, rolling back what it has open."""
        try:
            if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                await conn.rollback()
        except Exception:
            with contextlib.suppress(Exception):
                await conn.close()
        if conn.closed or self._destroyed:
            self._all.discard(conn)
            if not conn.closed:
                _close_now(conn)
            return
        self._idle.append(conn)

    def _release_soon(self, conn: Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._release(conn))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _settle_releases(self) -> None:
        if self._releases:
            await asyncio.wait(list(self._releases))


def _failed(exc: BaseException) -> CommitFuture:
    fut: CommitFuture = asyncio.get_running_loop().create_future()
    fut.set_exception(exc)
    return fut


def _close_now(conn: Connection) -> None:
    """Close an async connection from synchronous code: finish its libpq connection (what
    `AsyncConnection.close()` does; the server rolls back an open transaction)."""
    with contextlib.suppress(Exception):
        conn.pgconn.finish()
