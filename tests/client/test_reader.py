"""Reader and RetryReader against a scripted broker: offsets, jumps, statuses, direct fragment
reads, retries and cancellation."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import grpc
import pytest

from pygazette.client import (
    JournalClient,
    OffsetJump,
    ProtocolViolation,
    Reader,
    ReaderCancelled,
    RetryReader,
    read_journal,
)
from pygazette.client.fragment_reader import RAW_CHUNK_SIZE
from pygazette.protocol.errors import JournalNotFound, NotAllowed, OffsetNotYetAvailable
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores import codecs
from tests.client.fake_broker import Abort, FakeBroker, Hang, content, metadata

J = "a/journal"


def no_backoff(attempt: int) -> float:
    return 0.0


async def read_all(reader: Reader | RetryReader) -> bytes:
    return b"".join([chunk async for chunk in reader])


async def test_reads_content_and_tracks_metadata(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append(
        [
            metadata(0, begin=0, end=6, write_head=6),
            content(0, b"abc"),
            content(3, b"def"),
        ]
    )
    reader = Reader(fake_client, J)
    assert await read_all(reader) == b"abcdef"
    assert reader.offset == 6
    assert reader.write_head == 6
    assert reader.fragment is not None and reader.fragment.end == 6
    assert fake.journal.read_requests[0].journal == J


async def test_read_n_splits_chunks(fake: FakeBroker, fake_client: JournalClient) -> None:
    fake.journal.read_scripts.append([metadata(0, begin=0, end=5), content(0, b"hello")])
    reader = Reader(fake_client, J)
    assert await reader.read(2) == b"he"
    assert reader.offset == 2
    assert await reader.read(10) == b"llo"
    assert await reader.read() == b""


async def test_offset_jump_is_raised_once_then_reading_continues(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append([metadata(100, begin=100, end=110), content(100, b"x" * 10)])
    reader = Reader(fake_client, J, offset=50)
    with pytest.raises(OffsetJump) as info:
        await reader.read()
    assert (info.value.requested, info.value.offset) == (50, 100)
    assert reader.offset == 100
    assert await reader.read() == b"x" * 10
    assert reader.offset == 110


async def test_offset_minus_one_adopts_the_write_head_without_a_jump(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    # A read at the head (42) answered once a fragment covers it.
    fake.journal.read_scripts.append([metadata(42, begin=40, end=50, write_head=50)])
    reader = Reader(fake_client, J, offset=-1, block=True)
    assert await reader.read() == b""
    assert reader.offset == 42


async def test_offset_behind_the_request_is_a_protocol_violation(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append([metadata(10, begin=0, end=30)])
    reader = Reader(fake_client, J, offset=20)
    with pytest.raises(ProtocolViolation):
        await reader.read()


async def test_status_is_raised_and_invalidates_the_reader(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append([pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND)])
    reader = Reader(fake_client, J)
    with pytest.raises(JournalNotFound, match="JOURNAL_NOT_FOUND: a/journal"):
        await reader.read()
    with pytest.raises(JournalNotFound):
        await reader.read()


async def test_end_offset_trims_content(fake: FakeBroker, fake_client: JournalClient) -> None:
    fake.journal.read_scripts.append([metadata(0, begin=0, end=10), content(0, b"0123456789")])
    reader = Reader(fake_client, J, end_offset=4)
    assert await read_all(reader) == b"0123"
    assert reader.offset == 4


def write_fragment(tmp_path: Path, data: bytes, codec: int) -> str:
    path = tmp_path / "fragment.bin"
    path.write_bytes(codecs.compress(codec, data))
    return path.as_uri()


@pytest.mark.parametrize("codec", [pb.NONE, pb.SNAPPY, pb.GZIP, pb.ZSTANDARD])
async def test_do_not_proxy_reads_the_fragment_url_directly(
    fake: FakeBroker, fake_client: JournalClient, tmp_path: Path, codec: int
) -> None:
    data = bytes(range(256)) * 50
    url = write_fragment(tmp_path, data, codec)
    # The fragment covers [1000, 1000+len); the read starts 7 bytes in.
    fake.journal.read_scripts.append(
        [metadata(1007, begin=1000, end=1000 + len(data), url=url, codec=codec)]
    )
    reader = Reader(fake_client, J, offset=1007, do_not_proxy=True)
    assert await read_all(reader) == data[7:]
    assert reader.offset == 1000 + len(data)


async def test_direct_read_honours_end_offset(
    fake: FakeBroker, fake_client: JournalClient, tmp_path: Path
) -> None:
    data = b"abcdefghij"
    url = write_fragment(tmp_path, data, pb.SNAPPY)
    fake.journal.read_scripts.append([metadata(2, begin=0, end=10, url=url, codec=pb.SNAPPY)])
    reader = Reader(fake_client, J, offset=2, end_offset=5, do_not_proxy=True)
    assert await read_all(reader) == b"cde"


async def test_metadata_only_does_not_open_the_fragment(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append(
        [metadata(0, begin=0, end=10, url="file:///does/not/exist", codec=pb.SNAPPY)]
    )
    reader = Reader(fake_client, J, metadata_only=True, do_not_proxy=True)
    assert await reader.read() == b""
    assert reader.fragment_url == "file:///does/not/exist"


async def test_retry_reader_restarts_after_close_and_transport_errors(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.extend(
        [
            [metadata(0, begin=0, end=3), content(0, b"abc")],  # Then the broker closes.
            [Abort(grpc.StatusCode.UNAVAILABLE)],
            [metadata(3, begin=3, end=6), content(3, b"def")],
            [pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=6, write_head=6)],
        ]
    )
    rr = RetryReader(fake_client, J, backoff=no_backoff)
    got = b""
    with pytest.raises(OffsetNotYetAvailable):
        while True:
            got += await rr.read()
    assert got == b"abcdef"
    assert rr.offset == 6
    assert [r.offset for r in fake.journal.read_requests] == [0, 3, 3, 6]


async def test_retry_reader_stops_at_end_offset(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.extend(
        [[metadata(0, begin=0, end=3), content(0, b"abc")], [content(3, b"de")]]
    )
    rr = RetryReader(fake_client, J, end_offset=5, backoff=no_backoff)
    assert await read_all(rr) == b"abcde"
    assert len(fake.journal.read_requests) == 2


async def test_retry_reader_surfaces_offset_jumps_and_continues(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append([metadata(10, begin=10, end=12), content(10, b"zz")])
    fake.journal.read_scripts.append(
        [pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=12, write_head=12)]
    )
    rr = RetryReader(fake_client, J, backoff=no_backoff)
    with pytest.raises(OffsetJump):
        await rr.read()
    assert await rr.read() == b"zz"
    chunks = [c async for c in read_journal(fake_client, J, offset=12)]
    assert chunks == []


async def test_retry_reader_gives_up_on_errors_retries_cannot_fix(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append([pb.ReadResponse(status=pb.NOT_ALLOWED)])
    with pytest.raises(NotAllowed):
        await RetryReader(fake_client, J, backoff=no_backoff).read()

    fake.journal.read_scripts.extend([[pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND)]] * 4)
    with pytest.raises(JournalNotFound):
        await RetryReader(fake_client, J, backoff=no_backoff).read()
    assert len(fake.journal.read_requests) == 5


async def test_retry_reader_retries_transient_broker_statuses(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.extend(
        [
            [pb.ReadResponse(status=pb.NOT_JOURNAL_BROKER)],
            [pb.ReadResponse(status=pb.INSUFFICIENT_JOURNAL_BROKERS)],
            [metadata(0, begin=0, end=2), content(0, b"ok")],
        ]
    )
    rr = RetryReader(fake_client, J, backoff=no_backoff)
    assert await rr.read() == b"ok"


async def test_cancel_interrupts_a_blocked_read(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.append([metadata(0, begin=0, end=0), Hang()])
    rr = RetryReader(fake_client, J, block=True, backoff=no_backoff)
    task = asyncio.create_task(rr.read())
    assert await asyncio.to_thread(fake.journal.read_started.wait, 30)
    rr.cancel()
    with pytest.raises(ReaderCancelled):
        await task
    with pytest.raises(ReaderCancelled):
        await rr.read()


class _StallingStore:
    """An HTTP server that answers a GET with `sent` bytes of a longer body (or, with
    `sent` None, nothing at all), then stalls until it is closed."""

    def __init__(self, sent: bytes | None) -> None:
        self.sent = sent
        self.requested = threading.Event()
        self.release = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/fragment"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            self.requested.set()
            if self.sent is not None:
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.sent) + 1000}\r\n\r\n"
                conn.sendall(head.encode() + self.sent)
            self.release.wait(60)

    def close(self) -> None:
        self.release.set()
        self.sock.close()


@pytest.mark.parametrize("sent", [None, b"x" * RAW_CHUNK_SIZE], ids=["opening", "reading"])
async def test_cancel_interrupts_a_direct_read_of_a_stalled_store(
    fake: FakeBroker, fake_client: JournalClient, sent: bytes | None
) -> None:
    # cancel() aborts a read in progress, as Gazette's RetryReader.Cancel does (its context
    # aborts the fragment's HTTP request too). A read waiting on a store's GET, to open a
    # fragment URL or for more of its body, went on waiting until the GET timed out (60 s).
    store = _StallingStore(sent)
    try:
        end = RAW_CHUNK_SIZE + 1000
        fake.journal.read_scripts.append([metadata(0, begin=0, end=end, url=store.url)])
        rr = RetryReader(fake_client, J, do_not_proxy=True, backoff=no_backoff)
        if sent is not None:
            assert await rr.read() == sent
        task = asyncio.create_task(rr.read())
        assert await asyncio.to_thread(store.requested.wait, 30)
        await asyncio.sleep(0.1)  # The read waits on the store.
        assert not task.done()
        rr.cancel()
        async with asyncio.timeout(10):
            with pytest.raises(ReaderCancelled):
                await task
        with pytest.raises(ReaderCancelled):
            await rr.read()
        await rr.aclose()
    finally:
        store.close()


async def test_a_reader_closed_while_a_direct_read_waits_on_a_stalled_store(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    # cancel() and aclose() at once, as the recovery-log player drops a reader: aclose
    # released the fragment by closing its HTTP body, which waits for the read in flight on
    # it: up to the GET's timeout (60 s).
    store = _StallingStore(b"x" * RAW_CHUNK_SIZE)
    try:
        end = RAW_CHUNK_SIZE + 1000
        fake.journal.read_scripts.append([metadata(0, begin=0, end=end, url=store.url)])
        rr = RetryReader(fake_client, J, do_not_proxy=True, backoff=no_backoff)
        assert await rr.read() == store.sent
        task = asyncio.create_task(rr.read())
        await asyncio.sleep(0.2)  # The read waits on the store.
        assert not task.done()
        async with asyncio.timeout(10):
            rr.cancel()
            await rr.aclose()
            with pytest.raises(ReaderCancelled):
                await task
    finally:
        store.close()


async def test_aclose_ends_a_direct_read_waiting_on_a_stalled_store(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    # aclose() aborts the read in progress, as it aborts a Read RPC a read waits on: a read
    # waiting on a store's GET went on waiting until the GET timed out (60 s).
    store = _StallingStore(b"x" * RAW_CHUNK_SIZE)
    try:
        end = RAW_CHUNK_SIZE + 1000
        fake.journal.read_scripts.append([metadata(0, begin=0, end=end, url=store.url)])
        reader = Reader(fake_client, J, do_not_proxy=True)
        assert await reader.read() == store.sent
        task = asyncio.create_task(reader.read())
        await asyncio.sleep(0.2)  # The read waits on the store.
        assert not task.done()
        async with asyncio.timeout(10):
            await reader.aclose()
            with pytest.raises(ReaderCancelled):
                await task
    finally:
        store.close()


async def test_cancel_interrupts_a_retry_reader_backing_off(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    # cancel() ends a RetryReader waiting out its backoff between attempts at once, as
    # Gazette's (which selects on its context and the backoff timer); it slept the backoff
    # out first (up to 5 s between attempts).
    fake.journal.read_scripts.extend([[Abort()]] * 3)
    rr = RetryReader(fake_client, J, backoff=lambda attempt: 30.0)
    task = asyncio.create_task(rr.read())
    assert await asyncio.to_thread(fake.journal.read_started.wait, 30)
    await asyncio.sleep(0.2)  # The attempt failed: the reader backs off.
    assert not task.done()
    rr.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(ReaderCancelled):
            await task


async def test_task_cancellation_propagates(fake: FakeBroker, fake_client: JournalClient) -> None:
    fake.journal.read_scripts.append([Hang()])
    rr = RetryReader(fake_client, J, block=True, backoff=no_backoff)
    task = asyncio.create_task(rr.read())
    assert await asyncio.to_thread(fake.journal.read_started.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_seek_restarts_the_read_at_the_new_offset(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.read_scripts.extend(
        [
            [metadata(0, begin=0, end=4), content(0, b"abcd")],
            [metadata(2, begin=0, end=4), content(2, b"cd")],
        ]
    )
    rr = RetryReader(fake_client, J, backoff=no_backoff)
    assert await rr.read(1) == b"a"
    assert await rr.seek(2) == 2
    assert await rr.read() == b"cd"
    assert fake.journal.read_requests[-1].offset == 2
