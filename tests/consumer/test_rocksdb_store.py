"""RocksDBStore: a plain local database, and a database recorded into a recovery log on a
real broker by diffing its directory — replayed by the Player into a fresh directory that
RocksDB opens with the same keys, values and checkpoint; fenced on fail-over; killed with
SIGKILL mid-transaction and recovered from the hints it last reported only, which skip the
table files that compaction deleted."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import rocksdict

from pygazette.client import JournalClient, append
from pygazette.consumer.memory_store import EarlierCommitFailed
from pygazette.consumer.recoverylog import Player
from pygazette.consumer.rocksdb_store import (
    CHECKPOINT_KEY,
    RocksDBStore,
    decode_varint_ascending,
    encode_varint_ascending,
    mark_key,
    read_checkpoint,
)
from pygazette.consumer.store import StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.consumer.test_store_support import (
    FakeShard,
    checkpoint,
    create_log,
    failed_future,
    read_through,
    replay,
    take_over,
)
from tests.support.broker_process import BrokerProcess

SHARD = FakeShard()
LOG = "tests/stores/rocksdb/recovery-log"


def items_of(directory: Path) -> dict[bytes, bytes]:
    """Every key and value of the RocksDB in `directory`, opened by rocksdict."""
    opts = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(str(directory), opts)
    try:
        return {bytes(k): bytes(v) for k, v in db.items()}  # type: ignore[arg-type]
    finally:
        db.close()


def test_gazette_key_encodings() -> None:
    # store_rocksdb.go: EncodeStringAscending(EncodeNullAscending(nil), "checkpoint").
    assert CHECKPOINT_KEY == b"\x00\x12checkpoint\x00\x01"
    assert mark_key("a/j\x00") == b"\x00\x12mark\x00\x01\x12a/j\x00\xff\x00\x01"
    cases = [(0, b"\x88"), (109, b"\xf5"), (110, b"\xf6\x6e"), (1 << 20, b"\xf8\x10\x00\x00")]
    for v, raw in cases:
        assert encode_varint_ascending(v) == raw
        assert decode_varint_ascending(raw) == v


async def test_local_round_trip_and_failed_commit(tmp_path: Path) -> None:
    store = RocksDBStore(directory=tmp_path)
    assert read_through(await store.restore_checkpoint(SHARD)) == 0
    store.put(b"a", b"1")
    assert store.get(b"a") == b"1" and store.db.get(b"a") is None  # Not applied yet.
    await store.start_commit(SHARD, checkpoint(1), [])
    store.put(b"b", b"2")
    store.delete(b"a")
    failing = store.start_commit(SHARD, checkpoint(2), [failed_future(RuntimeError("no ack"))])
    with pytest.raises(RuntimeError, match="no ack"):
        await failing
    with pytest.raises(EarlierCommitFailed):
        await store.start_commit(SHARD, checkpoint(3), [])
    with pytest.raises(EarlierCommitFailed):
        await store.restore_checkpoint(SHARD)
    store.destroy()
    # The failed transaction never reached the database.
    assert items_of(tmp_path)[b"a"] == b"1" and b"b" not in items_of(tmp_path)
    again = RocksDBStore(directory=tmp_path)
    assert await again.restore_checkpoint(SHARD) == checkpoint(1)
    # Gazette's legacy offset marks are written beside the checkpoint.
    assert again.db.get(mark_key("b/source")) == encode_varint_ascending(2)
    again.destroy()


async def test_open_opens_the_database_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `new_store` runs on the consumer's event loop: a database that takes a while to open
    # stalled every other shard of the process. `RocksDBStore.open` opens it on a thread.
    RocksDBStore(directory=tmp_path).destroy()  # A database to open again.
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    opened_on: list[int] = []
    opening_started = asyncio.Event()
    release = threading.Event()
    real = rocksdict.Rdict

    def slow_open(path: str, opts: rocksdict.Options) -> rocksdict.Rdict:
        opened_on.append(threading.get_ident())
        loop.call_soon_threadsafe(opening_started.set)
        assert release.wait(30)  # Until the loop showed it runs meanwhile.
        return real(path, opts)

    monkeypatch.setattr(rocksdict, "Rdict", slow_open)
    opening = asyncio.ensure_future(RocksDBStore.open(directory=tmp_path))
    # The loop goes on while the database opens (on the loop, this would never be set).
    await asyncio.wait_for(opening_started.wait(), 30)
    release.set()
    store = await opening
    assert opened_on != [loop_thread]
    assert read_through(await store.restore_checkpoint(SHARD)) == 0
    store.put(b"k", b"v")
    await store.start_commit(SHARD, checkpoint(1), [])
    store.destroy()
    monkeypatch.setattr(rocksdict, "Rdict", real)
    assert items_of(tmp_path)[b"k"] == b"v"


def test_needs_a_recorder_or_a_directory() -> None:
    with pytest.raises(ValueError, match="recorder or a directory"):
        RocksDBStore()


@pytest.fixture(scope="module")
def log_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("rocksdb-store") / "broker-data")
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


async def test_recorded_database_replays_and_fails_over(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/replay"
    await create_log(client, log)
    primary = tmp_path / "primary"
    store = RocksDBStore(await take_over(client, log, primary))
    assert await store.restore_checkpoint(SHARD) == cpb.Checkpoint()
    expected: dict[bytes, bytes] = {}
    for i in range(30):
        for j in range(50):
            key, value = f"k{(i * 50 + j) % 700:04}".encode(), bytes([i]) * 300
            store.put(key, value)
            expected[key] = value
        if i % 7 == 3:
            store.delete(b"k0000")
            expected.pop(b"k0000", None)
        await store.start_commit(SHARD, checkpoint(i + 1), [])
        if i % 5 == 4:  # Memtable flushes (new SSTs, new WALs, old WALs deleted).
            await asyncio.to_thread(store.db.flush)
        if i == 20:  # Compaction: the flushed SSTs are replaced and deleted.
            await asyncio.to_thread(store.db.compact_range, None, None)
    # The new primary plays the log, fencing the old one, and opens the played database.
    new_dir = tmp_path / "new"
    new = RocksDBStore(await take_over(client, log, new_dir))
    assert await new.restore_checkpoint(SHARD) == checkpoint(30)
    assert all(new.get(k) == v for k, v in expected.items())
    store.put(b"owner", b"deposed")
    with pytest.raises(StoreFenced):
        await store.start_commit(SHARD, checkpoint(31), [])
    store.destroy()
    new.put(b"owner", b"new")
    await new.start_commit(SHARD, checkpoint(32), [])
    new.destroy()

    standby = tmp_path / "standby"
    await replay(client, log, standby)
    items = items_of(standby)
    assert read_checkpoint_of(standby) == checkpoint(32)
    assert items[b"owner"] == b"new"
    assert {k: v for k, v in items.items() if k.startswith(b"k")} == expected


def read_checkpoint_of(directory: Path) -> cpb.Checkpoint:
    db = rocksdict.Rdict(str(directory), rocksdict.Options(raw_mode=True))
    try:
        return read_checkpoint(db)
    finally:
        db.close()


CHILD_PRIMARY = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from pygazette.client import JournalClient
    from pygazette.consumer.rocksdb_store import RocksDBStore
    from pygazette.protocol.pb import recoverylog_pb2 as rpb
    from tests.consumer.test_store_support import FakeShard, checkpoint, take_over

    async def main():
        url, log, directory = sys.argv[1:4]
        async with JournalClient(url) as client:
            hints = rpb.FSMHints(log=log)
            if len(sys.argv) > 4:
                hints.ParseFromString(bytes.fromhex(sys.argv[4]))
            recorder = await take_over(client, log, Path(directory), hints)
            store = RocksDBStore(recorder)
            shard = FakeShard()
            n = int(store.get(b"n") or b"0")
            assert (await store.restore_checkpoint(shard)).sources["a/source"].read_through == n
            while True:  # Until killed: pipelined transactions, flushes and compactions.
                n += 1
                store.put(b"n", str(n).encode())
                store.put(b"k%03d" % (n % 200), b"x" * 2000)
                done = store.start_commit(shard, checkpoint(n), [])
                if n % 2 == 0:
                    await done
                    if n % 20 == 0:
                        await asyncio.to_thread(store.db.flush)
                    if n % 80 == 0:
                        await asyncio.to_thread(store.db.compact_range, None, None)
                    hints = recorder.build_hints()
                    print(n, hints.SerializeToString().hex(), flush=True)

    asyncio.run(main())
    """
)


async def run_child_until_killed(
    url: str, log: str, directory: Path, hints: rpb.FSMHints | None, until: int
) -> tuple[int, rpb.FSMHints]:
    """A primary in a child process; once it reported `until` more transactions durable,
    kill -9 it mid-transaction. Returns the last it reported, with its hints."""
    args = [sys.executable, "-c", CHILD_PRIMARY, url, log, str(directory)]
    if hints is not None:
        args.append(hints.SerializeToString().hex())
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=Path(__file__).parents[2],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    first, last, last_hints = 0, 0, rpb.FSMHints()
    try:
        async with asyncio.timeout(120):
            while True:
                line = await proc.stdout.readline()
                assert line, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
                n, raw = line.split()
                last = int(n)
                first = first or last
                last_hints = rpb.FSMHints.FromString(bytes.fromhex(raw.decode()))
                if last - first >= until:
                    break
    finally:
        proc.kill()  # SIGKILL: no cleanup, commits in flight.
        await proc.wait()
    return last, last_hints


async def test_primary_killed_mid_transaction_recovers_from_hints_only(
    client: JournalClient, log_broker: BrokerProcess, tmp_path: Path
) -> None:
    log = LOG + "/kill"
    await create_log(client, log)
    hints: rpb.FSMHints | None = None
    reported = 0
    for life in range(2):
        reported, hints = await run_child_until_killed(
            log_broker.url, log, tmp_path / f"primary-{life}", hints, until=90
        )
    assert hints is not None and hints.live_nodes
    # The hints skip what compaction deleted: the log's beginning is not read.
    first = min(s.first_offset for node in hints.live_nodes for s in node.segments)
    assert first > 0

    # A standby plays from those hints only, then tails the log to its write head.
    standby = tmp_path / "standby"
    player = Player(client, hints, standby)
    player.finish_at_write_head()
    await player.play()
    items = items_of(standby)
    n = read_through(read_checkpoint_of(standby))
    assert n >= reported
    assert items[b"n"] == str(n).encode()  # The state is that of the checkpoint.
    assert len([k for k in items if k.startswith(b"k")]) == min(n, 200)


async def test_files_pinning_old_history_are_recorded_anew(
    client: JournalClient, tmp_path: Path
) -> None:
    log = LOG + "/refresh"
    await create_log(client, log)
    recorder = await take_over(client, log, tmp_path / "primary")
    store = RocksDBStore(recorder, refresh_min_bytes=16 << 10)
    for i in range(80):
        store.put(b"k%02d" % (i % 20), bytes([i]) * 2000)
        await store.start_commit(SHARD, checkpoint(i + 1), [])
        if i % 10 == 9:  # New table files and WALs; the OPTIONS file stays from the open.
            await asyncio.to_thread(store.db.flush)
    expected = {b"k%02d" % k: store.get(b"k%02d" % k) for k in range(20)}
    hints = recorder.build_hints()
    store_bytes = sum(store.recorded_files.values())
    store.destroy()
    assert store.refreshed_files > 0
    # Playback from the hints starts within about twice the store's size of the head, not
    # at the log's beginning.
    first = min(s.first_offset for node in hints.live_nodes for s in node.segments)
    assert recorder.write_head - first <= 3 * store_bytes, (first, recorder.write_head)
    assert first > 0
    standby = tmp_path / "standby"
    player = Player(client, hints, standby)
    player.finish_at_write_head()
    await player.play()
    items = items_of(standby)
    assert {k: items[k] for k in expected} == expected
    assert read_checkpoint_of(standby) == checkpoint(80)
