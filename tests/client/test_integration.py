"""The client against a real `pygazette serve` broker process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import time
from collections.abc import AsyncIterator
from hashlib import sha1
from pathlib import Path

import pytest

from pygazette.client import (
    Appender,
    AppendService,
    JournalClient,
    OpFuture,
    Reader,
    RetryReader,
    SyncJournalClient,
    append,
    apply_journals,
    get_journal,
    get_journal_entry,
    list_all_fragments,
    list_journals,
    read_journal,
)
from pygazette.client.errors import OffsetJump
from pygazette.protocol.errors import (
    BrokerError,
    EtcdTransactionFailed,
    JournalNotFound,
    OffsetNotYetAvailable,
    RegisterMismatch,
    WrongAppendOffset,
)
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from tests.support.broker_process import BrokerProcess

J = "tests/client/journal"


def journal_spec(name: str = J, *, codec: int = pb.SNAPPY) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name, replication=1, labels=label_set({"suite": "client", "codec": str(codec)})
    )
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec


async def create(client: JournalClient, *specs: pb.JournalSpec) -> pb.ApplyResponse:
    return await apply_journals(
        client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
    )


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url) as c:
        await create(c, journal_spec())
        yield c


async def read_to_head(client: JournalClient, journal: str = J, offset: int = 0) -> bytes:
    return b"".join([chunk async for chunk in read_journal(client, journal, offset=offset)])


async def test_apply_list_append_read_round_trip(client: JournalClient) -> None:
    (listed,) = await list_journals(client, f"name={J}")
    assert listed.spec.name == J and listed.mod_revision > 0
    assert await get_journal(client, J) == listed.spec
    assert [j.spec.name for j in await list_journals(client, "suite=client")] == [J]
    assert await list_journals(client, "suite=other") == []

    first = await append(client, J, b"hello, ")
    second = await append(client, J, [b"gazette", b"!\n"])
    assert (first.commit.begin, first.commit.end) == (0, 7)
    assert (second.commit.begin, second.commit.end) == (7, 16)
    assert first.commit.journal == J

    assert await read_to_head(client) == b"hello, gazette!\n"
    assert await read_to_head(client, offset=7) == b"gazette!\n"


async def test_large_append_is_chunked_and_reads_back(client: JournalClient) -> None:
    data = os.urandom(5 << 20) + b"tail"
    resp = await append(client, J, data)
    assert resp.commit.end - resp.commit.begin == len(data)
    assert await read_to_head(client) == data


async def test_reader_offsets_and_end_offset(client: JournalClient) -> None:
    await append(client, J, b"0123456789")
    reader = Reader(client, J, offset=3, end_offset=6)
    assert b"".join([c async for c in reader]) == b"345"
    assert reader.offset == 6

    rr = RetryReader(client, J, offset=2, end_offset=10)
    assert b"".join([c async for c in rr]) == b"23456789"


async def test_non_blocking_read_at_the_head_raises(client: JournalClient) -> None:
    await append(client, J, b"abc")
    reader = Reader(client, J, offset=0)
    assert await reader.read() == b"abc"
    with pytest.raises(OffsetNotYetAvailable):
        await reader.read()
    assert reader.offset == 3

    with pytest.raises(OffsetNotYetAvailable):
        await Reader(client, J, offset=-1).read()
    with pytest.raises(OffsetNotYetAvailable):
        await RetryReader(client, J, offset=3).read()


async def test_retry_reader_polls_again_after_reaching_the_head(client: JournalClient) -> None:
    # OFFSET_NOT_YET_AVAILABLE ends one Read RPC, not the RetryReader: as Gazette's, a later
    # read asks again and returns what was appended meanwhile.
    await append(client, J, b"abc")
    rr = RetryReader(client, J, offset=3)
    for _ in range(2):
        with pytest.raises(OffsetNotYetAvailable):
            await rr.read()
    assert rr.offset == 3
    await append(client, J, b"def")
    assert await rr.read() == b"def"
    await rr.aclose()


async def test_non_blocking_read_at_the_head_keeps_the_head_it_was_told(
    client: JournalClient,
) -> None:
    # A non-blocking read from -1 that finds nothing yet stays at the write head the broker
    # resolved (as Gazette's Reader adopts the response's offset): content appended after it
    # is the next thing read, not skipped by resolving -1 again to a later head.
    empty = RetryReader(client, J, offset=-1)
    with pytest.raises(OffsetNotYetAvailable):
        await empty.read()
    assert empty.offset == 0
    await append(client, J, b"abc")
    assert await empty.read() == b"abc"

    rr = RetryReader(client, J, offset=-1)
    with pytest.raises(OffsetNotYetAvailable):
        await rr.read()
    assert rr.offset == 3
    await append(client, J, b"def")
    assert await rr.read() == b"def"
    await empty.aclose()
    await rr.aclose()


async def test_a_read_skipping_to_the_head_by_mod_time_keeps_the_head_it_was_told(
    broker: BrokerProcess, client: JournalClient
) -> None:
    # A read bounded by begin_mod_time skips the fragments persisted before it; when that
    # reaches the write head, the broker answers OFFSET_NOT_YET_AVAILABLE at the head, and the
    # reader goes on from there (as Gazette's Reader adopts the response's offset: gazctl's
    # `journals read --from T --offsets-out F` writes the head, not the offset it began at).
    name = "tests/client/seeded"
    content = b"x" * 99 + b"\n"
    path = broker.file_root / name / f"{0:016x}-{100:016x}-{sha1(content).hexdigest()}.raw"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    await create(client, journal_spec(name, codec=pb.NONE))
    for _ in range(300):  # The journal is assigned, and its store listed, in the background.
        with contextlib.suppress(BrokerError):
            if await list_all_fragments(client, name):
                break
        await asyncio.sleep(0.1)

    later = int(time.time()) + 3600
    rr = RetryReader(client, pb.ReadRequest(journal=name, begin_mod_time=later))
    for _ in range(2):
        with pytest.raises(OffsetNotYetAvailable):
            await rr.read()
        assert rr.offset == 100
    await rr.aclose()


async def test_blocking_reads_see_later_appends(client: JournalClient) -> None:
    await append(client, J, b"old\n")
    reader = RetryReader(client, J, offset=4, block=True)
    pending = asyncio.create_task(reader.read())
    await append(client, J, b"new\n")
    assert await asyncio.wait_for(pending, 30) == b"new\n"
    assert reader.offset == 8
    await reader.aclose()


async def test_blocking_read_from_the_write_head(client: JournalClient) -> None:
    await append(client, J, b"old\n")
    reader = RetryReader(client, J, offset=-1, block=True)
    pending = asyncio.create_task(reader.read())
    # Offset -1 means "wherever the head is when the broker serves the read": keep appending
    # until the read picks something up; it must never return what preceded it.
    for _ in range(150):
        await append(client, J, b"new\n")
        done, _ = await asyncio.wait({pending}, timeout=0.2)
        if done:
            break
    got = pending.result()
    assert got and got == b"new\n" * (len(got) // 4)
    assert reader.offset > 4
    await reader.aclose()


async def test_wrong_append_offset_and_register_mismatch(client: JournalClient) -> None:
    await append(client, J, b"12345")
    with pytest.raises(WrongAppendOffset, match="WRONG_APPEND_OFFSET"):
        await append(client, J, b"x", offset=2)
    ok = await append(client, J, b"x", offset=5)
    assert ok.commit.begin == 5

    owned = await append(client, J, b"y", union_registers=label_set({"owner": "me"}))
    assert owned.registers == label_set({"owner": "me"})
    with pytest.raises(RegisterMismatch, match="REGISTER_MISMATCH"):
        await append(client, J, b"z", check_registers=parse_selector("owner=you"))
    await append(client, J, b"z", check_registers=parse_selector("owner=me"))
    assert await read_to_head(client) == b"12345xyz"


async def test_aborted_append_leaves_nothing(client: JournalClient) -> None:
    app = Appender(client, J, chunk_size=4)
    await app.write(b"this must never be visible")
    await app.abort()
    with pytest.raises(OffsetNotYetAvailable):
        await Reader(client, J).read()

    with pytest.raises(RuntimeError):
        async with Appender(client, J, chunk_size=4) as app2:
            await app2.write(b"nor this")
            raise RuntimeError("abandon")

    resp = await append(client, J, b"visible")
    assert (resp.commit.begin, resp.commit.end) == (0, 7)
    assert await read_to_head(client) == b"visible"


async def test_unknown_journal(client: JournalClient) -> None:
    with pytest.raises(JournalNotFound):
        await append(client, "tests/client/nope", b"x")
    with pytest.raises(JournalNotFound):
        await Reader(client, "tests/client/nope").read()
    with pytest.raises(JournalNotFound):
        await get_journal(client, "tests/client/nope")


async def test_apply_revisions_are_checked(client: JournalClient) -> None:
    entry = await get_journal_entry(client, J)
    with pytest.raises(EtcdTransactionFailed):
        await create(client, journal_spec())  # Exists already: revision 0 is stale.
    updated = journal_spec()
    updated.labels.CopyFrom(label_set({"suite": "client", "updated": "yes"}))
    await apply_journals(
        client,
        [pb.ApplyRequest.Change(upsert=updated, expect_mod_revision=entry.mod_revision)],
    )
    assert (await get_journal(client, J)).labels == updated.labels
    await apply_journals(client, [pb.ApplyRequest.Change(delete=J, expect_mod_revision=-1)])
    assert await list_journals(client, f"name={J}") == []


async def test_fragments_cover_the_journal(client: JournalClient) -> None:
    for i in range(3):
        await append(client, J, b"record %d\n" % i)
    fragments = await list_all_fragments(client, J)
    assert fragments
    assert fragments[0].spec.begin == 0
    assert fragments[-1].spec.end == 27
    for prev, nxt in itertools.pairwise(fragments):
        assert prev.spec.end == nxt.spec.begin


async def test_do_not_proxy_reads_persisted_fragments_directly(
    broker: BrokerProcess, client: JournalClient
) -> None:
    spec = journal_spec("tests/client/small-fragments")
    spec.fragment.length = 1024  # Every append below closes (and persists) its fragment.
    await create(client, spec)
    first, second = b"a" * 2000 + b"\n", b"b" * 10
    await append(client, spec.name, first)
    await append(client, spec.name, second)
    for _ in range(300):  # Persisting happens in the background.
        fragments = await list_all_fragments(client, spec.name)
        if fragments[0].spec.backing_store:
            break
        await asyncio.sleep(0.1)
    assert fragments[0].spec.backing_store == "file:///"

    # Fragment URLs of file:// stores are relative to the broker's file root, as Gazette's.
    file_root = broker.data_dir / "fragments"
    rr = RetryReader(client, spec.name, do_not_proxy=True, file_root=file_root)
    assert await rr.read() == first
    assert rr.reader.fragment_url.startswith("file:///tests/client/small-fragments/")
    assert rr.reader.direct is not None  # Read from the store, not through the broker.
    rest = b""
    with pytest.raises(OffsetNotYetAvailable):
        while True:
            rest += await rr.read()
    assert rest == second

    # Without the file root no URL can be opened here: the reads go through the broker.
    fallback = RetryReader(client, spec.name, do_not_proxy=True)
    assert await fallback.read() == first
    assert fallback.reader.direct is None
    rest = b""
    with pytest.raises(OffsetNotYetAvailable):
        while True:
            rest += await fallback.read()
    assert rest == second


async def test_fragments_of_a_journal_named_with_a_percent_sign_are_read_directly(
    broker: BrokerProcess, client: JournalClient
) -> None:
    # Journal names may hold '%' (Gazette's path symbols), and brokers sign a file:// store's
    # fragment as its path verbatim (Gazette: "file://" + path): 'p%41' stays 'p%41'. The
    # client took the URL's path as percent-encoded and looked for 'pA': never there, so
    # every fragment of such a journal was read through the broker instead.
    spec = journal_spec("tests/client/p%41q", codec=pb.NONE)
    spec.fragment.length = 1024  # The first append's fragment closes (and persists) at the next.
    await create(client, spec)
    first = b"a" * 2000 + b"\n"
    for data in (first, b"b\n"):
        for _ in range(300):  # Gazette assigns the journal in the background.
            with contextlib.suppress(BrokerError):
                await append(client, spec.name, data)
                break
            await asyncio.sleep(0.1)
    for _ in range(300):  # Persisting (and, for Gazette, listing it) happens in the background.
        fragments = await list_all_fragments(client, spec.name)
        if fragments[0].spec.backing_store:
            break
        await asyncio.sleep(0.1)
    assert fragments[0].spec.backing_store == "file:///"

    rr = RetryReader(client, spec.name, do_not_proxy=True, file_root=broker.file_root)
    assert await rr.read() == first
    assert rr.reader.fragment_url.startswith("file:///tests/client/p%41q/")
    assert rr.reader.direct is not None  # Read from the store, not through the broker.
    await rr.aclose()


async def test_a_fragment_url_failing_to_open_is_read_through_the_broker_alone(
    broker: BrokerProcess, client: JournalClient, tmp_path: Path
) -> None:
    spec = journal_spec("tests/client/flaky-store")
    spec.fragment.length = 1024  # Every append below closes (and persists) its fragment.
    await create(client, spec)
    parts = [bytes([c]) * 1500 + b"\n" for c in b"abc"]
    for part in parts:
        await append(client, spec.name, part)
    for _ in range(300):  # Persisting happens in the background.
        fragments = await list_all_fragments(client, spec.name)
        if len(fragments) == 3 and all(f.spec.backing_store for f in fragments):
            break
        await asyncio.sleep(0.1)
    assert [f.spec.end for f in fragments] == [1501, 3002, 4503]

    # The client reads a copy of the store in which the middle fragment's file is missing
    # (as if a store failed its GET, or retention had just removed it).
    mirror = tmp_path / "mirror"
    shutil.copytree(broker.data_dir / "fragments", mirror)
    (missing,) = mirror.rglob(f"{1501:016x}-*")
    missing.unlink()

    rr = RetryReader(client, spec.name, do_not_proxy=True, file_root=mirror)
    read: list[tuple[int, bool]] = []  # (offset, read directly) of every chunk.
    data = b""
    with pytest.raises(OffsetNotYetAvailable):
        while True:
            offset = rr.offset
            data += await rr.read()
            read.append((offset, rr.reader.direct is not None))
    assert data == b"".join(parts)
    by_fragment = {end: {d for o, d in read if end - 1501 <= o < end} for end in (1501, 3002, 4503)}
    # The first and last from the store, the middle one through the broker.
    assert by_fragment == {1501: {True}, 3002: {False}, 4503: {True}}
    await rr.aclose()


async def test_retry_reader_continues_across_a_broker_crash(
    broker: BrokerProcess, client: JournalClient
) -> None:
    rr = RetryReader(client, J, block=True)
    await append(client, J, b"before crash\n")
    assert await asyncio.wait_for(rr.read(), 30) == b"before crash\n"

    pending = asyncio.create_task(rr.read())
    await asyncio.to_thread(broker.kill)
    await asyncio.to_thread(broker.start)  # Same port and data directory.
    await append(client, J, b"after restart\n")
    assert await asyncio.wait_for(pending, 60) == b"after restart\n"
    assert rr.offset == len(b"before crash\nafter restart\n")
    # The acknowledged append from before the crash survived it.
    assert await read_to_head(client) == b"before crash\nafter restart\n"
    await rr.aclose()


def test_sync_client_round_trip(broker: BrokerProcess) -> None:
    with SyncJournalClient(broker.url) as client:
        client.apply_journals(
            [pb.ApplyRequest.Change(upsert=journal_spec(), expect_mod_revision=0)]
        )
        assert client.get_journal(J).name == J
        client.append(J, b"line 1\n")
        client.append(J, (b"line %d\n" % i for i in range(2, 4)))
        with client.appender(J) as app:
            app.write(b"line 4\n")
        assert b"".join(client.read(J)) == b"line 1\nline 2\nline 3\nline 4\n"
        assert b"".join(client.read(J, offset=7, end_offset=14)) == b"line 2\n"
        assert client.list_all_fragments(J)[-1].spec.end == 28
        assert [j.spec.name for j in client.list_journals("suite=client")] == [J]


async def test_a_gap_in_old_fragments_is_reported_as_one_offset_jump(
    broker: BrokerProcess, client: JournalClient
) -> None:
    # Fragments persisted long ago with a span missing between them (removed from the store
    # by hand, or by another process's retention): a RetryReader reading through the broker
    # reports the gap as one OffsetJump and reads on, blocking or not, and a read that starts
    # inside the gap jumps to its end. (Both brokers jump a gap only before fragments older
    # than six hours: a younger one may be a fragment still being persisted.)
    name = "tests/client/gap"
    old = time.time() - 86400
    parts = {0: b"a" * 99 + b"\n", 200: b"c" * 99 + b"\n", 300: b"d" * 99 + b"\n"}
    for begin, content in parts.items():
        path = broker.file_root / name / (
            f"{begin:016x}-{begin + 100:016x}-{sha1(content).hexdigest()}.raw"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.utime(path, (old, old))
    await create(client, journal_spec(name, codec=pb.NONE))
    for _ in range(300):  # The journal is assigned, and its store listed, in the background.
        with contextlib.suppress(BrokerError):
            if len(await list_all_fragments(client, name)) == 3:
                break
        await asyncio.sleep(0.1)

    for block in (False, True):
        rr = RetryReader(client, name, block=block, end_offset=400 if block else 0)
        data, jumps = await _read_noting_jumps(rr)
        assert jumps == [(100, 200)], block
        assert data == parts[0] + parts[200] + parts[300]
        assert rr.offset == 400
        await rr.aclose()

    rr = RetryReader(client, name, offset=150)
    assert await _read_noting_jumps(rr) == (parts[200] + parts[300], [(150, 200)])
    await rr.aclose()


async def _read_noting_jumps(rr: RetryReader) -> tuple[bytes, list[tuple[int, int]]]:
    """What `rr` reads to its end offset or the write head, and its jumps (from, to)."""
    data, jumps = b"", []
    while True:
        try:
            chunk = await rr.read()
        except OffsetJump as jump:
            jumps.append((jump.requested, jump.offset))
            continue
        except OffsetNotYetAvailable:
            return data, jumps
        if not chunk:
            return data, jumps
        data += chunk


async def test_an_append_whose_task_is_cancelled_before_its_commit_leaves_nothing(
    client: JournalClient,
) -> None:
    # A task cancelled while its append streams content (the commit chunk not yet sent)
    # commits none of it, and the journal takes the next append at once.
    await append(client, J, b"before\n")
    sent_one = asyncio.Event()

    async def content() -> AsyncIterator[bytes]:
        yield b"x" * (1 << 20)
        yield b"y" * 10  # The first chunk is handed to the RPC once this one is asked for.
        sent_one.set()
        await asyncio.Event().wait()  # Never: the task is cancelled here.
        yield b"never"

    task = asyncio.create_task(append(client, J, content(), chunk_size=1 << 20))
    await asyncio.wait_for(sent_one.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(30):
        await append(client, J, b"after\n")
    assert await read_to_head(client) == b"before\nafter\n"


async def test_a_waiter_cancelled_leaves_the_async_append_it_awaited_alone(
    client: JournalClient,
) -> None:
    # A task that stops waiting for an AsyncAppend (cancelled, or a wait_for timing out)
    # leaves the append as it was: it goes out, and its other waiters and dependents see it
    # commit. `await op` wrapped the op's shared future with asyncio.wrap_future, whose
    # cancellation cancels that future: the append committed, but every waiter got
    # CancelledError and a dependent append failed (DependencyFailed).
    other = "tests/client/dependent"
    await create(client, journal_spec(other))
    async with AppendService(client) as service:
        gate = OpFuture()  # Holds the append back until the waiter below is cancelled.
        aa = service.append(J, b"one\n", dependencies=[gate])
        dependent = service.append(other, b"two\n", dependencies=[aa])
        waiter = asyncio.create_task(aa.wait())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(aa, 0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.resolve()
        async with asyncio.timeout(30):
            await aa
            await dependent
        assert aa.error() is None
    assert await read_to_head(client) == b"one\n"
    assert await read_to_head(client, other) == b"two\n"
