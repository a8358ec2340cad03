"""SQLiteStore: as a plain local database (with crash recovery of commits that weren't
durable), and recorded into a recovery log on a real broker, replayed by the Player into a
fresh directory as a valid database equal to the original."""

from __future__ import annotations

import asyncio
import functools
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from prometheus_client import REGISTRY

from pygazette.cli.shards_cmd import live_segments, overlaps_any_segment
from pygazette.client import JournalClient, append, apply_journals
from pygazette.client.fragments import list_all_fragments
from pygazette.consumer import sqlite_store
from pygazette.consumer.memory_store import EarlierCommitFailed
from pygazette.consumer.progress import Progress
from pygazette.consumer.recoverylog import Author, Player, Recorder
from pygazette.consumer.sqlite_store import SQLiteStore, read_checkpoint
from pygazette.consumer.store import StoreFenced
from pygazette.message.envelope import Envelope
from pygazette.message.publisher import Publisher
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.consumer import test_transactions as tt
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
from tests.support.journal_data import small_journal_spec

SHARD = FakeShard()
LOG = "tests/stores/sqlite/recovery-log"
SCHEMA = "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v)"


def rows(store: SQLiteStore) -> list[tuple[object, ...]]:
    return list(store.db.execute("SELECT k, v FROM kv ORDER BY k"))


def rows_of(path: Path) -> list[tuple[object, ...]]:
    """The kv rows of a database file, read with SQLite's default VFS."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return list(conn.execute("SELECT k, v FROM kv ORDER BY k"))
    finally:
        conn.close()


def integrity(path: Path) -> list[tuple[object, ...]]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return list(conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


def checkpoint_of(path: Path) -> cpb.Checkpoint:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return read_checkpoint(conn)
    finally:
        conn.close()


def put(store: SQLiteStore, k: str, v: object) -> None:
    store.db.execute(
        "INSERT INTO kv VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (k, v)
    )


# As a local database. ----------------------------------------------------------------------


async def test_local_round_trip_survives_a_new_store(tmp_path: Path) -> None:
    store = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
    assert await store.restore_checkpoint(SHARD) == cpb.Checkpoint()
    put(store, "a", 1)
    put(store, "b", b"\x00blob")
    await store.start_commit(SHARD, checkpoint(3, ack=b"ack"), [])
    # A transaction that isn't committed is abandoned by a restore (or a close).
    put(store, "c", 3)
    store.destroy()

    again = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
    assert await again.restore_checkpoint(SHARD) == checkpoint(3, ack=b"ack")
    assert rows(again) == [("a", 1), ("b", b"\x00blob")]
    again.destroy()
    assert integrity(tmp_path / "store.sqlite") == [("ok",)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.sqlite", "store.sqlite-journal"]


async def test_local_commit_without_changes_stores_the_checkpoint(tmp_path: Path) -> None:
    store = SQLiteStore(directory=tmp_path)
    await store.start_commit(SHARD, checkpoint(9), [])
    assert read_through(await store.restore_checkpoint(SHARD)) == 9
    store.destroy()
    assert read_through(checkpoint_of(tmp_path / "store.sqlite")) == 9


async def test_local_failed_wait_for_rolls_back_to_the_last_durable_commit(
    tmp_path: Path,
) -> None:
    # A tiny page cache: the big transaction spills pages into the database file before
    # its COMMIT, and grows the file.
    store = SQLiteStore(directory=tmp_path, bootstrap_sql="PRAGMA cache_size=5;" + SCHEMA)
    put(store, "a", 1)
    await store.start_commit(SHARD, checkpoint(1), [])
    path = tmp_path / "store.sqlite"
    durable = path.read_bytes()

    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    put(store, "a", 2)
    for i in range(300):
        put(store, f"big{i:03}", b"x" * 2000)
    first = store.start_commit(SHARD, checkpoint(2), [gate])
    # The next transaction runs (and commits locally) while the first one waits.
    store.db.execute("DELETE FROM kv WHERE k >= 'big100'")
    second = store.start_commit(SHARD, checkpoint(3), [])
    put(store, "c", 3)  # A third, still open.
    assert path.stat().st_size > len(durable)
    assert list((tmp_path).glob("store.sqlite-undo-*"))

    gate.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await first
    with pytest.raises(EarlierCommitFailed):
        await second
    with pytest.raises(EarlierCommitFailed):
        store.db.execute("SELECT 1")
    with pytest.raises(EarlierCommitFailed):
        await store.start_commit(SHARD, checkpoint(4), [])

    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert rows(store) == [("a", 1)]
    assert path.read_bytes() == durable
    assert not list(tmp_path.glob("store.sqlite-undo-*"))
    # And it commits again.
    put(store, "d", 4)
    await store.start_commit(SHARD, checkpoint(5), [])
    store.destroy()
    assert rows_of(path) == [("a", 1), ("d", 4)]
    assert integrity(path) == [("ok",)]


async def test_local_pipelined_commits_complete_in_order(tmp_path: Path) -> None:
    store = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
    loop = asyncio.get_running_loop()
    gates = [loop.create_future() for _ in range(3)]
    commits = []
    for i, gate in enumerate(gates):
        put(store, "n", i + 1)
        commits.append(store.start_commit(SHARD, checkpoint(i + 1), [gate]))
    order: list[int] = []
    for i, commit in enumerate(commits):
        commit.add_done_callback(functools.partial(lambda i, _f: order.append(i), i))
    for gate in reversed(gates):
        gate.set_result(None)
    await asyncio.gather(*commits)
    assert order == [0, 1, 2]
    assert read_through(await store.restore_checkpoint(SHARD)) == 3
    assert rows(store) == [("n", 3)]
    assert not list(tmp_path.glob("store.sqlite-undo-*"))
    store.destroy()


CRASHING_PRIMARY = """
import asyncio, os, sys
from pygazette.consumer.sqlite_store import SQLiteStore
from tests.consumer.test_store_support import FakeShard, checkpoint

async def main():
    store = SQLiteStore(directory=sys.argv[1], bootstrap_sql=sys.argv[2])
    store.db.execute("INSERT INTO kv VALUES ('durable', 1)")
    await store.start_commit(FakeShard(), checkpoint(1), [])
    store.db.execute("INSERT INTO kv VALUES ('pending', 2)")
    store.db.execute("UPDATE kv SET v = 100 WHERE k = 'durable'")
    never = asyncio.get_running_loop().create_future()  # Its outputs never append.
    store.start_commit(FakeShard(), checkpoint(2), [never])
    store.db.execute("INSERT INTO kv VALUES ('open', 3)")
    os._exit(0)  # Crash: no cleanup of any kind.

asyncio.run(main())
"""


async def test_local_crash_before_a_commit_is_durable_rolls_it_back(tmp_path: Path) -> None:
    """A process dying after a local COMMIT but before its wait_for resolved must not leave
    that commit's checkpoint: the next open rolls it back from its undo file."""
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", textwrap.dedent(CRASHING_PRIMARY), str(tmp_path), SCHEMA],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(list(tmp_path.glob("store.sqlite-undo-*"))) == 1
    store = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
    assert not list(tmp_path.glob("store.sqlite-undo-*"))
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert rows(store) == [("durable", 1)]
    store.destroy()
    assert integrity(tmp_path / "store.sqlite") == [("ok",)]


CRASHING_MID_COMMIT = """
import asyncio, os, sys
from pygazette.consumer import sqlite_store
from pygazette.consumer.sqlite_store import SQLiteStore
from tests.consumer.test_store_support import FakeShard, checkpoint

async def main():
    store = SQLiteStore(directory=sys.argv[1], bootstrap_sql=sys.argv[2])
    for i in range(40):
        store.db.execute("INSERT INTO kv VALUES (?, ?)", (f"k{i:02}", os.urandom(3000)))
    await store.start_commit(FakeShard(), checkpoint(1), [])
    # The next commit dies halfway through writing its pages to the database file, before
    # any sync: SQLite's rollback journal (a hot journal) is left, and no undo file.
    writes = 0
    write = sqlite_store._DBFile.xWrite

    def dying_write(self, data, offset):
        nonlocal writes
        writes += 1
        if writes == 3:
            os._exit(0)
        write(self, data, offset)

    sqlite_store._DBFile.xWrite = dying_write
    store.db.execute("DELETE FROM kv WHERE k >= 'k10'")
    store.db.execute("INSERT INTO kv VALUES ('gone', ?)", (os.urandom(9000),))
    await store.start_commit(FakeShard(), checkpoint(2), [])
    os._exit(1)  # Not reached.

asyncio.run(main())
"""


async def test_local_crash_mid_commit_then_a_restart_without_commits(tmp_path: Path) -> None:
    """A process dying while SQLite writes a commit's pages leaves a hot journal: SQLite rolls
    it back when the database is next opened. Done through the store's VFS, that rollback's
    writes were taken for the first batch's own (their undo images: the torn pages), and
    persisted to an undo file at its sync; a store closed (or crashed) before its first
    durable commit left that file, and the next open applied it, putting the torn commit
    back: a corrupt database. (So did a failed first commit's rollback.)"""
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", textwrap.dedent(CRASHING_MID_COMMIT), str(tmp_path), SCHEMA],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmp_path / "store.sqlite-journal").stat().st_size  # A hot journal.
    assert not list(tmp_path.glob("store.sqlite-undo-*"))
    expect = [(f"k{i:02}",) for i in range(40)]
    for _ in range(2):  # Opened (it rolls back the hot journal), then closed without commits.
        store = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
        assert read_through(await store.restore_checkpoint(SHARD)) == 1
        assert list(store.db.execute("SELECT k FROM kv ORDER BY k")) == expect
        store.destroy()
        assert integrity(tmp_path / "store.sqlite") == [("ok",)]
    # And a first commit that fails rolls back to the same state.
    store = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
    put(store, "failed", 1)
    with pytest.raises(RuntimeError):
        await store.start_commit(SHARD, checkpoint(2), [failed_future(RuntimeError("no"))])
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert list(store.db.execute("SELECT k FROM kv ORDER BY k")) == expect
    store.destroy()
    assert integrity(tmp_path / "store.sqlite") == [("ok",)]


async def test_local_crash_at_any_write_of_a_pipelined_commit_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits overlap: a transaction runs (and commits locally) while the one before waits
    for its outputs. SQLite doesn't journal a free page it reuses; one freed by the earlier,
    not yet durable commit was left, after a crash mid-commit, as the interrupted commit
    wrote it (its hot journal doesn't restore it), and the earlier commit's undo file, not
    having it (freeing a page doesn't write it), rolled back to a state where the page was
    live with other content: a corrupt database. A crash at each write of the database
    file is simulated by copying the directory as it then is (what kill -9 leaves)."""
    directory = tmp_path / "store"
    crashes: list[Path] = []
    write = sqlite_store._DBFile.xWrite
    recording = False

    def copying_write(self: Any, data: Any, offset: int) -> None:
        if recording:
            crashes.append(tmp_path / f"crash-{len(crashes)}")
            shutil.copytree(directory, crashes[-1])
        write(self, data, offset)

    monkeypatch.setattr(sqlite_store._DBFile, "xWrite", copying_write)
    store = SQLiteStore(directory=directory, bootstrap_sql="PRAGMA cache_size=5;" + SCHEMA)
    for i in range(60):
        put(store, f"k{i:02}", bytes([i]) * 3000)  # Each row on a page and an overflow page.
    await store.start_commit(SHARD, checkpoint(1), [])
    expect = rows(store)
    never = asyncio.get_running_loop().create_future()
    store.db.execute("DELETE FROM kv WHERE k < 'k40'")  # Frees most pages.
    second = store.start_commit(SHARD, checkpoint(2), [never])
    recording = True
    for i in range(40):  # Reuses them (spilling, then committing).
        put(store, f"n{i:02}", b"n" * 3000)
    third = store.start_commit(SHARD, checkpoint(3), [])
    recording = False
    monkeypatch.undo()
    assert len(crashes) > 40
    for crash in crashes:
        again = SQLiteStore(directory=crash, bootstrap_sql=SCHEMA)
        assert read_through(await again.restore_checkpoint(SHARD)) == 1, crash
        assert rows(again) == expect, crash
        again.destroy()
        assert integrity(crash / "store.sqlite") == [("ok",)], crash
    never.set_result(None)
    await asyncio.gather(second, third)
    store.destroy()


async def test_vacuum_and_large_deletes_keep_working(tmp_path: Path) -> None:
    store = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
    for i in range(200):
        put(store, f"k{i:03}", b"y" * 3000)
    await store.start_commit(SHARD, checkpoint(1), [])
    store.db.execute("DELETE FROM kv WHERE k > 'k010'")
    await store.start_commit(SHARD, checkpoint(2), [])
    size = (tmp_path / "store.sqlite").stat().st_size
    store.connection.execute("VACUUM")  # Outside of a transaction.
    await store.start_commit(SHARD, checkpoint(2), [])
    store.destroy()
    assert (tmp_path / "store.sqlite").stat().st_size < size / 4  # Not recorded: it shrinks.
    again = SQLiteStore(directory=tmp_path, bootstrap_sql=SCHEMA)
    assert read_through(await again.restore_checkpoint(SHARD)) == 2
    assert len(rows(again)) == 11
    again.destroy()


async def test_attach_is_refused(tmp_path: Path) -> None:
    store = SQLiteStore(directory=tmp_path)
    with pytest.raises(apsw.CantOpenError):
        store.db.execute(f"ATTACH DATABASE '{tmp_path / 'other.sqlite'}' AS other")
    store.destroy()


def test_needs_a_recorder_or_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="recorder or a directory"):
        SQLiteStore()
    with pytest.raises(ValueError, match="relative"):
        SQLiteStore(directory=tmp_path, filename="/abs.sqlite")


# Recorded into a recovery log. -------------------------------------------------------------


@pytest.fixture(scope="module")
def log_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("sqlite-store") / "broker-data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def client(log_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(log_broker.url) as c:
        yield c


async def write_head(client: JournalClient, log: str) -> int:
    return (await append(client, log, b"")).commit.end


async def test_recorded_database_replays_equal_to_the_original(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/replay"
    await create_log(client, log)
    primary = tmp_path / "primary"
    store = SQLiteStore(
        await take_over(client, log, primary), bootstrap_sql="PRAGMA cache_size=5;" + SCHEMA
    )
    assert await store.restore_checkpoint(SHARD) == cpb.Checkpoint()
    # Small transactions, a big one that spills and grows the file, deletes, an app-level
    # rollback of a big transaction (SQLite truncates the file back), and a VACUUM.
    for i in range(5):
        put(store, f"small{i}", i)
        await store.start_commit(SHARD, checkpoint(i + 1), [])
    for i in range(300):
        put(store, f"big{i:03}", b"z" * 2500)
    await store.start_commit(SHARD, checkpoint(10), [])
    store.db.execute("DELETE FROM kv WHERE k >= 'big050'")
    await store.start_commit(SHARD, checkpoint(11), [])
    for i in range(400):
        put(store, f"gone{i:03}", b"g" * 2500)
    store.connection.execute("ROLLBACK")
    store.connection.execute("VACUUM")
    put(store, "last", "value")
    await store.start_commit(SHARD, checkpoint(12, ack=b"ack"), [])
    expected = rows(store)
    page_count = int(str(store.db.execute("PRAGMA page_count").fetchall()[0][0]))
    page_size = int(str(store.db.execute("PRAGMA page_size").fetchall()[0][0]))
    store.destroy()
    # SQLite truncated the file (rollback, VACUUM): the recorded file ignored that.
    assert (primary / "store.sqlite").stat().st_size > page_count * page_size

    standby = tmp_path / "standby"
    await replay(client, log, standby)
    # Byte for byte the original database file (the journal is local only).
    assert files_of(standby) == {"store.sqlite": (primary / "store.sqlite").read_bytes()}
    assert integrity(standby / "store.sqlite") == [("ok",)]
    assert rows_of(standby / "store.sqlite") == expected
    assert checkpoint_of(standby / "store.sqlite") == checkpoint(12, ack=b"ack")


async def test_recorded_failed_wait_for_records_nothing(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/atomic"
    await create_log(client, log)
    primary = tmp_path / "primary"
    store = SQLiteStore(await take_over(client, log, primary), bootstrap_sql=SCHEMA)
    put(store, "a", 1)
    await store.start_commit(SHARD, checkpoint(1), [])
    head = await write_head(client, log)
    put(store, "a", 2)
    put(store, "b", 2)
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failing = store.start_commit(SHARD, checkpoint(2), [gate])
    put(store, "c", 3)
    pipelined = store.start_commit(SHARD, checkpoint(3), [])
    gate.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await failing
    with pytest.raises(EarlierCommitFailed):
        await pipelined
    assert await write_head(client, log) == head  # Nothing of either was appended.

    # The same store rolls back to what the log holds, and goes on.
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert rows(store) == [("a", 1)]
    put(store, "d", 4)
    await store.start_commit(SHARD, checkpoint(4), [])
    store.destroy()

    standby = tmp_path / "standby"
    await replay(client, log, standby)
    assert files_of(standby) == {"store.sqlite": (primary / "store.sqlite").read_bytes()}
    assert rows_of(standby / "store.sqlite") == [("a", 1), ("d", 4)]
    assert read_through(checkpoint_of(standby / "store.sqlite")) == 4


async def test_recorded_store_fails_over_to_a_new_primary(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/failover"
    await create_log(client, log)
    old = SQLiteStore(await take_over(client, log, tmp_path / "old"), bootstrap_sql=SCHEMA)
    put(old, "owner", "old")
    await old.start_commit(SHARD, checkpoint(1), [])

    # The new primary plays the log into its own directory, fencing the old recorder, and
    # opens the store on the played database.
    new_dir = tmp_path / "new"
    new = SQLiteStore(await take_over(client, log, new_dir), bootstrap_sql=SCHEMA)
    assert read_through(await new.restore_checkpoint(SHARD)) == 1
    assert rows(new) == [("owner", "old")]

    put(old, "owner", "deposed")
    with pytest.raises(StoreFenced):
        await old.start_commit(SHARD, checkpoint(2), [])
    with pytest.raises(StoreFenced):
        old.db.execute("SELECT 1")
    old.destroy()

    put(new, "owner", "new")
    for i in range(100):
        put(new, f"n{i:03}", b"n" * 1000)
    await new.start_commit(SHARD, checkpoint(3), [])
    new.destroy()

    standby = tmp_path / "standby"
    await replay(client, log, standby)
    assert files_of(standby) == {"store.sqlite": (new_dir / "store.sqlite").read_bytes()}
    assert rows_of(standby / "store.sqlite")[-1] == ("owner", "new")
    assert read_through(checkpoint_of(standby / "store.sqlite")) == 3


async def test_rewrites_of_a_page_within_a_commit_are_recorded_once(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/dedup"
    await create_log(client, log)
    store = SQLiteStore(await take_over(client, log, tmp_path / "primary"), bootstrap_sql=SCHEMA)
    put(store, "counter", 0)
    await store.start_commit(SHARD, checkpoint(1), [])
    head = await write_head(client, log)
    # Many local transactions rewriting one page, in one consumer transaction's commit.
    for _ in range(200):
        store.connection.execute("UPDATE kv SET v = v + 1 WHERE k = 'counter'")
    await store.start_commit(SHARD, checkpoint(2), [])
    recorded = await write_head(client, log) - head
    page_size = int(str(store.connection.execute("PRAGMA page_size").fetchall()[0][0]))
    assert recorded < 4 * page_size, recorded  # Pages of kv, the checkpoint, the header.
    store.destroy()
    standby = tmp_path / "standby"
    await replay(client, log, standby)
    assert rows_of(standby / "store.sqlite") == [("counter", 200)]


async def test_local_file_unknown_to_the_log_is_recorded_whole(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/adopt"
    await create_log(client, log)
    primary = tmp_path / "primary"
    recorder = await take_over(client, log, primary)
    # A database put into the directory outside of the log (e.g. a pre-existing store).
    local = SQLiteStore(directory=primary, bootstrap_sql=SCHEMA)
    put(local, "old", 1)
    await local.start_commit(SHARD, checkpoint(1), [])
    local.destroy()

    store = SQLiteStore(recorder, bootstrap_sql=SCHEMA)
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    put(store, "new", 2)
    await store.start_commit(SHARD, checkpoint(2), [])
    store.destroy()
    standby = tmp_path / "standby"
    await replay(client, log, standby)
    assert (standby / "store.sqlite").read_bytes() == (primary / "store.sqlite").read_bytes()
    assert rows_of(standby / "store.sqlite") == [("new", 2), ("old", 1)]


# Under the consumer's transactions. --------------------------------------------------------


class SQLCounter(tt.Counter):
    """tests/consumer/test_transactions.py's Counter, counting in SQLite."""

    def consume_message(self, shard: Any, store: Any, env: Envelope, pub: Publisher) -> None:
        self.seen += 1
        if self.seen == self.fail_at:
            raise RuntimeError("injected failure")
        key = env.message["key"]
        store.db.execute(
            "INSERT INTO counts VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET n = n + 1", (key,)
        )
        pub.publish_uncommitted(
            lambda _m: (tt.OUT, tt.NDJSON), {"key": key, "n": env.message["n"], "src": env.journal}
        )


COUNTS = "CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, n INTEGER NOT NULL)"


def total(path: Path) -> int:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return int(str(conn.execute("SELECT coalesce(sum(n), 0) FROM counts").fetchall()[0][0]))
    finally:
        conn.close()


async def test_exactly_once_transactions_fail_over_through_the_recovery_log(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    async with JournalClient(broker.url) as client:
        await apply_journals(
            client,
            [
                pb.ApplyRequest.Change(upsert=small_journal_spec(j), expect_mod_revision=0)
                for j in [*tt.SOURCES, tt.OUT]
            ],
        )
        log = LOG + "/transactions"
        await create_log(client, log)
        n = 500
        spec = tt.shard_spec(max_ms=20)
        heads = await tt.publish_inputs(client, n)

        # A primary commits all of it; then, of more input, fails mid-way: nothing of its
        # failed transaction is committed.
        first = tmp_path / "first"
        store = SQLiteStore(await take_over(client, log, first), bootstrap_sql=COUNTS)
        await tt.run_until(client, SQLCounter(), store, heads, Progress(), spec)  # type: ignore[arg-type]
        assert store.connection.execute("SELECT sum(n) FROM counts").fetchall() == [(2 * n,)]
        heads = await tt.publish_inputs(client, n)
        with pytest.raises(RuntimeError, match="injected failure"):
            await tt.run_until(
                client,
                SQLCounter(fail_at=n // 2),
                store,  # type: ignore[arg-type]
                heads,
                Progress(),
                spec,
            )
        store.destroy()
        assert total(first / "store.sqlite") == 2 * n

        # The next primary recovers the store from the log, and carries on.
        second = tmp_path / "second"
        store = SQLiteStore(await take_over(client, log, second), bootstrap_sql=COUNTS)
        await tt.run_until(client, SQLCounter(), store, heads, Progress(), spec)  # type: ignore[arg-type]
        store.destroy()
        assert total(second / "store.sqlite") == 4 * n
        outputs = await tt.committed_outputs(client)
        assert sorted((o["src"], o["n"]) for o in outputs) == sorted(
            2 * [(s, i) for s in tt.SOURCES for i in range(n)]
        )
        standby = tmp_path / "standby"
        await replay(client, log, standby)
        assert files_of(standby) == {"store.sqlite": (second / "store.sqlite").read_bytes()}
        assert total(standby / "store.sqlite") == 4 * n


# Compaction: recovery reads O(store size), not O(history). --------------------------------


def recovered_bytes() -> float:
    value = REGISTRY.get_sample_value("gazette_recoverylog_recovered_bytes_total")
    return value or 0.0


async def play_hints(client: JournalClient, hints: rpb.FSMHints, directory: Path) -> float:
    """Play the log from `hints` into `directory`; returns the bytes read from the log."""
    before = recovered_bytes()
    player = Player(client, hints, directory)
    player.finish_at_write_head()
    await player.play()
    return recovered_bytes() - before


def fragments_needed(hints: rpb.FSMHints, fragments: list[pb.Fragment]) -> list[pb.Fragment]:
    """The fragments `shards prune` keeps for these hints (it removes the others)."""
    segments = live_segments(hints)
    return [f for f in fragments if overlaps_any_segment(segments, f)]


async def test_compaction_bounds_playback_from_hints_to_a_few_times_the_store(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/compaction"
    await create_log(client, log, fragment_length=64 << 10)
    primary = tmp_path / "primary"
    store = SQLiteStore(
        await take_over(client, log, primary),
        bootstrap_sql=SCHEMA,
        compact_ratio=1.0,
        compact_min_bytes=0,
    )
    for i in range(100):
        put(store, f"k{i:03}", b"v" * 500)
    await store.start_commit(SHARD, checkpoint(1), [])
    size = (primary / "store.sqlite").stat().st_size
    # Small transactions, two at a time in flight, until the log holds 50x the store.
    n = 1
    while await write_head(client, log) < 50 * size:
        for _ in range(10):
            n += 1
            put(store, f"k{n % 100:03}", b"w" * 500)
            put(store, "n", n)
            first = store.start_commit(SHARD, checkpoint(n), [])
            n += 1
            put(store, "n", n)
            await store.start_commit(SHARD, checkpoint(n), [])
            await first
    assert store.compactions >= 10
    history = await write_head(client, log)
    hints = store.recorder.build_hints()  # type: ignore[union-attr]
    expected = rows(store)
    size = (primary / "store.sqlite").stat().st_size
    assert history >= 40 * size

    # A standby from the hints reads a few times the store, not the history.
    standby = tmp_path / "standby"
    read = await play_hints(client, hints, standby)
    assert read <= 3 * size, (read, size, history)
    assert files_of(standby) == {"store.sqlite": (primary / "store.sqlite").read_bytes()}
    assert rows_of(standby / "store.sqlite") == expected
    assert read_through(checkpoint_of(standby / "store.sqlite")) == n

    # `shards prune` keeps only fragments near the end of the log.
    listed = [f.spec for f in await list_all_fragments(client, log)]
    needed = fragments_needed(hints, listed)
    assert sum(f.end - f.begin for f in needed) <= 3 * size + 2 * (64 << 10)
    assert min(f.begin for f in needed) > history - 4 * size - (64 << 10)
    store.destroy()


CHILD_PRIMARY = """
import asyncio, sys
from pathlib import Path
from pygazette.client import JournalClient
from pygazette.consumer.hints import encode_hints
from pygazette.consumer.sqlite_store import SQLiteStore
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.consumer.test_store_support import FakeShard, checkpoint, take_over

async def main():
    url, log, directory, schema = sys.argv[1:5]
    async with JournalClient(url) as client:
        hints = rpb.FSMHints(log=log)
        if len(sys.argv) > 5:
            hints.ParseFromString(bytes.fromhex(sys.argv[5]))
        recorder = await take_over(client, log, Path(directory), hints)
        # Copies of the database ride along with several commits (16 KiB each).
        store = SQLiteStore(recorder, bootstrap_sql=schema, compact_ratio=0.5,
                            compact_min_bytes=64 << 10, compact_chunk_bytes=16 << 10)
        shard = FakeShard()
        n = 0
        for (v,) in store.db.execute("SELECT v FROM kv WHERE k = 'n'"):
            n = v
        assert (await store.restore_checkpoint(shard)).sources["a/source"].read_through == n
        while True:  # Until killed: pipelined small transactions.
            n += 1
            store.db.execute("INSERT OR REPLACE INTO kv VALUES ('n', ?)", (n,))
            store.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (f"k{n % 50}", "x" * 400))
            done = store.start_commit(shard, checkpoint(n), [])
            if n % 2 == 0:
                await done
                hints = recorder.build_hints()
                print(n, store.compactions, hints.SerializeToString().hex(), flush=True)

asyncio.run(main())
"""


async def run_child_until_killed(
    client: JournalClient,
    url: str,
    log: str,
    directory: Path,
    hints: rpb.FSMHints | None,
    compactions: int,
) -> tuple[int, rpb.FSMHints]:
    """A primary in a child process committing small transactions; once it compacted
    `compactions` times, kill -9 it mid-transaction. Returns the last transaction it
    reported durable, and the hints it reported with it."""
    args = [sys.executable, "-c", CHILD_PRIMARY, url, log, str(directory), SCHEMA]
    if hints is not None:
        args.append(hints.SerializeToString().hex())
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=Path(__file__).parents[2],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    last, last_hints = 0, rpb.FSMHints()
    try:
        async with asyncio.timeout(120):
            while True:
                line = await proc.stdout.readline()
                assert line, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
                n, done, raw = line.split()
                last = int(n)
                last_hints = rpb.FSMHints.FromString(bytes.fromhex(raw.decode()))
                if int(done) >= compactions:
                    break
    finally:
        proc.kill()  # SIGKILL: no cleanup, commits in flight.
        await proc.wait()
    return last, last_hints


async def test_primary_killed_around_compactions_recovers_from_hints_only(
    client: JournalClient, log_broker: BrokerProcess, tmp_path: Path
) -> None:
    log = LOG + "/compaction-kill"
    await create_log(client, log)
    # A first primary compacts a few times and is killed; a second takes over from the hints
    # it last stored (not from the log's beginning), compacts, and is killed too.
    hints: rpb.FSMHints | None = None
    reported = 0
    for life in range(2):
        reported, hints = await run_child_until_killed(
            client, log_broker.url, log, tmp_path / f"primary-{life}", hints, compactions=3
        )
        assert reported > 0 and hints.live_nodes
    assert hints is not None
    # The hints skip the log's beginning (the files compacted away).
    assert min(s.first_offset for node in hints.live_nodes for s in node.segments) > 64 << 10

    # A third recovers from those hints only: every commit it reported is there, and the
    # checkpoint matches the state (a transaction is all or nothing).
    recovered = tmp_path / "recovered"
    store = SQLiteStore(await take_over(client, log, recovered, hints), bootstrap_sql=SCHEMA)
    n = read_through(await store.restore_checkpoint(SHARD))
    assert n >= reported
    assert store.db.execute("SELECT v FROM kv WHERE k = 'n'").fetchall() == [(n,)]
    assert len(rows(store)) == min(n, 50) + 1
    store.destroy()
    assert integrity(recovered / "store.sqlite") == [("ok",)]


@pytest.mark.parametrize("chunk", [4 << 20, 8 << 10])
async def test_hot_standby_tails_compactions_and_takes_over(
    client: JournalClient, tmp_path: Path, chunk: int
) -> None:
    log = LOG + f"/compaction-standby-{chunk}"
    await create_log(client, log)
    primary = tmp_path / "primary"
    store = SQLiteStore(
        await take_over(client, log, primary),
        bootstrap_sql=SCHEMA,
        compact_ratio=0.5,
        compact_min_bytes=32 << 10,
        compact_chunk_bytes=chunk,
    )
    put(store, "n", 0)
    await store.start_commit(SHARD, checkpoint(1), [])
    # A hot standby, from the primary's hints, tailing the log as the primary compacts.
    standby_dir = tmp_path / "standby"
    standby = Player(client, store.recorder.build_hints(), standby_dir)  # type: ignore[union-attr]
    playing = asyncio.ensure_future(standby.play())
    await standby.tailing.wait()
    n = 1
    while store.compactions < 3:
        n += 1
        put(store, "n", n)
        put(store, f"k{n % 40}", b"s" * 600)
        await store.start_commit(SHARD, checkpoint(n), [])
    expected = rows(store)

    # The standby takes over: the deposed primary is fenced, the store is what it committed.
    author = Author.random()
    standby.inject_handoff(author)
    fsm = await playing
    new = SQLiteStore(Recorder(client, fsm, author, standby_dir), bootstrap_sql=SCHEMA)
    assert read_through(await new.restore_checkpoint(SHARD)) == n
    assert rows(new) == expected
    put(store, "n", -1)
    with pytest.raises(StoreFenced):
        await store.start_commit(SHARD, checkpoint(n + 1), [])
    store.destroy()
    put(new, "n", n + 1)
    await new.start_commit(SHARD, checkpoint(n + 1), [])
    new.destroy()
    assert integrity(standby_dir / "store.sqlite") == [("ok",)]
    final = tmp_path / "final"
    await replay(client, log, final)  # All of the log, compactions and all.
    assert files_of(final) == {"store.sqlite": (standby_dir / "store.sqlite").read_bytes()}


async def test_a_failed_compaction_commit_records_nothing_and_the_next_compacts(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/compaction-failed"
    await create_log(client, log)
    primary = tmp_path / "primary"
    store = SQLiteStore(
        await take_over(client, log, primary), bootstrap_sql=SCHEMA, compact_ratio=None
    )
    put(store, "a", 1)
    await store.start_commit(SHARD, checkpoint(1), [])
    head = await write_head(client, log)
    store.compact_ratio, store.compact_min_bytes = 0.01, 0  # The next commit compacts.
    put(store, "a", 2)
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failing = store.start_commit(SHARD, checkpoint(2), [gate])
    assert store.compactions == 1
    gate.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await failing
    assert await write_head(client, log) == head
    assert read_through(await store.restore_checkpoint(SHARD)) == 1
    assert rows(store) == [("a", 1)]

    put(store, "b", 3)
    await store.start_commit(SHARD, checkpoint(3), [])
    assert store.compactions == 2
    hints = store.recorder.build_hints()  # type: ignore[union-attr]
    assert min(s.first_offset for n in hints.live_nodes for s in n.segments) >= head
    store.destroy()
    standby = tmp_path / "standby"
    await play_hints(client, hints, standby)
    assert files_of(standby) == {"store.sqlite": (primary / "store.sqlite").read_bytes()}
    assert rows_of(standby / "store.sqlite") == [("a", 1), ("b", 3)]


async def test_a_compaction_cut_short_is_removed_and_started_over(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/compaction-cut-short"
    await create_log(client, log)
    primary = tmp_path / "primary"
    store = SQLiteStore(
        await take_over(client, log, primary),
        bootstrap_sql=SCHEMA,
        compact_ratio=None,
        compact_chunk_bytes=8 << 10,
    )
    for i in range(60):
        put(store, f"k{i:02}", b"c" * 1000)
    await store.start_commit(SHARD, checkpoint(1), [])
    store.compact_ratio, store.compact_min_bytes = 0.01, 0
    for n in range(2, 5):  # The copy starts, two more pieces of it are durable.
        put(store, "n", n)
        await store.start_commit(SHARD, checkpoint(n), [])
    recorder = store.recorder
    assert recorder is not None
    assert recorder.fnode_of("store.sqlite.compacted") is not None
    put(store, "n", 5)
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failing = store.start_commit(SHARD, checkpoint(5), [gate])
    gate.set_exception(RuntimeError("append failed"))
    with pytest.raises(RuntimeError, match="append failed"):
        await failing
    assert read_through(await store.restore_checkpoint(SHARD)) == 4

    # The cut-short copy goes with the next commit; a new one starts over and completes.
    n = 4
    while True:
        n += 1
        put(store, "n", n)
        await store.start_commit(SHARD, checkpoint(n), [])
        if recorder.fnode_of("store.sqlite.compacted") is None and store.compactions == 2:
            break
    hints = recorder.build_hints()
    assert [node.fnode for node in hints.live_nodes] == [recorder.fnode_of("store.sqlite")]
    store.destroy()
    standby = tmp_path / "standby"
    await play_hints(client, hints, standby)
    assert files_of(standby) == {"store.sqlite": (primary / "store.sqlite").read_bytes()}
    assert read_through(checkpoint_of(standby / "store.sqlite")) == n
