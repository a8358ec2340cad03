"""Appender and append() against a scripted broker, and chunk coalescing."""

from __future__ import annotations

import asyncio
import logging
import threading
from array import array
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pygazette.auth.authorizer import BearerAuth
from pygazette.client import Appender, ChunkCoalescer, JournalClient, append
from pygazette.client import appender as appender_module
from pygazette.client.appender import AppenderStateError
from pygazette.protocol.errors import (
    NotJournalPrimaryBroker,
    RegisterMismatch,
    ValidationError,
    WrongAppendOffset,
)
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.selector import parse_selector
from tests.client.fake_broker import Abort, FakeBroker, committed, refused
from tests.support.ports import free_port

J = "a/journal"


@given(
    writes=st.lists(st.binary(max_size=40), max_size=30),
    size=st.integers(min_value=1, max_value=16),
)
def test_coalescer_packs_writes_into_full_chunks(writes: list[bytes], size: int) -> None:
    co = ChunkCoalescer(size)
    chunks: list[bytes] = []
    for w in writes:
        chunks.extend(co.add(w))
    assert all(len(c) == size for c in chunks)
    rest = co.flush()
    if rest is not None:
        assert 0 < len(rest) < size
        chunks.append(rest)
    assert b"".join(chunks) == b"".join(writes)
    assert co.pending == 0 and co.flush() is None


def test_coalescer_accepts_bytes_likes() -> None:
    co = ChunkCoalescer(4)
    assert co.add(bytearray(b"ab")) == []
    assert co.add(memoryview(b"cdefghij")) == [b"abcd", b"efgh"]
    assert co.flush() == b"ij"


def contents(call_requests: list[pb.AppendRequest]) -> list[bytes]:
    return [r.content for r in call_requests[1:]]


async def test_appender_streams_chunks_then_commits(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.append_responses.append(committed(J, 0, 25))
    async with Appender(fake_client, J, chunk_size=10) as app:
        for _ in range(5):
            await app.write(b"hello")
        await app.write(b"")  # Ignored: an empty chunk would commit.
    assert app.response is not None and app.response.commit.end == 25
    (call,) = fake.journal.append_calls
    assert call.committed
    assert call.requests[0].journal == J and not call.requests[0].content
    assert contents(call.requests) == [b"hellohello", b"hellohello", b"hello", b""]


async def test_preamble_carries_options(fake: FakeBroker, fake_client: JournalClient) -> None:
    check = parse_selector("owner=me")
    union = label_set({"owner": "me"})
    subtract = label_set({"lease": ""})
    app = Appender(
        fake_client,
        J,
        offset=123,
        check_registers=check,
        union_registers=union,
        subtract_registers=subtract,
    )
    await app.write(b"x")
    await app.commit()
    first = fake.journal.append_calls[0].requests[0]
    assert first.offset == 123
    assert first.check_registers == check
    assert first.union_registers == union
    assert first.subtract_registers == subtract


async def test_commit_without_content_sends_an_empty_append(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    await Appender(fake_client, J).commit()
    (call,) = fake.journal.append_calls
    assert call.committed and contents(call.requests) == [b""]


async def test_abort_ends_the_stream_without_a_commit_chunk(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with Appender(fake_client, J, chunk_size=4) as app:
            await app.write(b"partial")
            raise RuntimeError("boom")
    (call,) = fake.journal.append_calls
    assert not call.committed
    assert contents(call.requests) == [b"part"]  # "ial" was still coalescing.
    with pytest.raises(AppenderStateError):
        await app.write(b"more")


async def test_status_errors_are_raised(fake: FakeBroker, fake_client: JournalClient) -> None:
    fake.journal.append_responses.extend(
        [
            refused(pb.WRONG_APPEND_OFFSET),
            refused(pb.REGISTER_MISMATCH, registers=label_set({"owner": "other"})),
        ]
    )
    with pytest.raises(WrongAppendOffset, match="WRONG_APPEND_OFFSET"):
        await append(fake_client, J, b"x", offset=7)
    with pytest.raises(RegisterMismatch, match="owner=other"):
        await append(fake_client, J, b"x", check_registers=parse_selector("owner=me"))
    assert len(fake.journal.append_calls) == 2  # Neither is retried.


async def test_a_refusal_while_content_is_still_streaming(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    # The broker answers at the preamble and closes the RPC while the client still writes.
    fake.journal.append_refusal = refused(pb.WRONG_APPEND_OFFSET)
    with pytest.raises(WrongAppendOffset):
        await append(fake_client, J, [b"x" * 1024] * 4096, offset=3, chunk_size=1024)
    assert len(fake.journal.append_calls) == 1


async def test_invalid_journal_name_fails_before_any_rpc(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    with pytest.raises(ValidationError):
        await append(fake_client, "bad journal name", b"x")
    assert fake.journal.append_calls == []


async def test_append_retries_refusals_with_replayable_content(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    fake.journal.append_responses.extend(
        [
            refused(pb.NOT_JOURNAL_PRIMARY_BROKER),
            refused(pb.NO_JOURNAL_PRIMARY_BROKER),
            committed(J, 0, 6),
        ]
    )
    resp = await append(fake_client, J, [b"abc", b"def"])
    assert resp.commit.end == 6
    assert len(fake.journal.append_calls) == 3
    assert all(contents(c.requests) == [b"abcdef", b""] for c in fake.journal.append_calls)


async def test_append_retries_insufficient_journal_brokers(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    """INSUFFICIENT_JOURNAL_BROKERS refuses an append before anything commits (a journal
    whose route lacks its replication, as a broker restarts): as Gazette's Append, retried."""
    fake.journal.append_responses.extend(
        [refused(pb.INSUFFICIENT_JOURNAL_BROKERS), committed(J, 0, 6)]
    )
    resp = await append(fake_client, J, b"abcdef")
    assert resp.commit.end == 6
    assert len(fake.journal.append_calls) == 2


async def test_append_retries_while_the_broker_is_unreachable() -> None:
    port = free_port()
    retrying = asyncio.Event()

    class OnRetry(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            retrying.set()

    logger = logging.getLogger("pygazette.client.appender")
    handler = OnRetry(logging.WARNING)
    logger.addHandler(handler)
    async with JournalClient(f"127.0.0.1:{port}") as client:

        def pieces() -> Iterator[bytes]:
            yield b"one-shot"

        task = asyncio.create_task(append(client, J, pieces()))
        try:
            await asyncio.wait_for(retrying.wait(), 30)
        finally:
            logger.removeHandler(handler)
        # Nothing was drawn from the iterator yet, so the append can still be retried.
        fake = await asyncio.to_thread(FakeBroker, port)
        try:
            resp = await task
            assert resp.status == pb.OK
            (call,) = fake.journal.append_calls
            assert contents(call.requests) == [b"one-shot", b""]
        finally:
            await asyncio.to_thread(fake.stop)


async def test_append_retries_a_drawn_one_shot_iterator_with_what_it_drew(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    """A refusal comes after the first pieces went out (stdin, for `journals append`): what
    was drawn is sent again, then the rest, so the append commits whole, once."""
    fake.journal.append_responses.extend(
        [refused(pb.NO_JOURNAL_PRIMARY_BROKER), committed(J, 0, 3 * 1024)]
    )
    drawn = []

    def pieces() -> Iterator[bytes]:
        for i in range(3):
            drawn.append(i)
            yield bytes([65 + i]) * 1024

    resp = await append(fake_client, J, pieces(), chunk_size=1024)
    assert resp.commit.end == 3 * 1024
    assert drawn == [0, 1, 2]  # Each piece drawn once.
    calls = fake.journal.append_calls
    assert len(calls) == 2
    assert b"".join(contents(calls[-1].requests)) == b"A" * 1024 + b"B" * 1024 + b"C" * 1024


async def test_append_does_not_retry_an_iterator_drawn_beyond_the_replay_limit(
    fake: FakeBroker, fake_client: JournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(appender_module, "REPLAY_LIMIT", 2)
    fake.journal.append_responses.append(refused(pb.NOT_JOURNAL_PRIMARY_BROKER))

    def pieces() -> Iterator[bytes]:
        yield b"once"

    with pytest.raises(NotJournalPrimaryBroker):
        await append(fake_client, J, pieces())
    assert len(fake.journal.append_calls) == 1


@pytest.mark.parametrize(
    "failure",
    [
        grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "source gone"
        ),
        NotJournalPrimaryBroker(detail="the source journal moved"),
    ],
    ids=["unavailable", "not-primary"],
)
@pytest.mark.parametrize("kind", ["iterator", "async-iterator"])
async def test_append_raises_a_failure_of_its_content_and_commits_nothing(
    fake: FakeBroker, fake_client: JournalClient, failure: BaseException, kind: str
) -> None:
    """Content copied from elsewhere (another journal's reader, say) fails part way, with an
    error that would be retried were it the append's own. The iterator is over: a retry would
    replay what it drew and commit that, the rest silently lost. The append fails instead."""

    def pieces() -> Iterator[bytes]:
        yield b"first half "
        raise failure

    async def async_pieces() -> AsyncIterator[bytes]:
        for piece in pieces():
            yield piece

    content = pieces() if kind == "iterator" else async_pieces()
    with pytest.raises(type(failure)):
        await append(fake_client, J, content)
    assert not any(call.committed for call in fake.journal.append_calls)


async def test_the_replay_limit_counts_the_bytes_of_a_memoryview_not_its_items(
    fake: FakeBroker, fake_client: JournalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memoryview of 8-byte items has a len() of an eighth of its bytes: the replay limit
    (and the bytes an Appender counts as written) are bytes."""
    monkeypatch.setattr(appender_module, "REPLAY_LIMIT", 8)
    fake.journal.append_responses.append(refused(pb.NOT_JOURNAL_PRIMARY_BROKER))
    piece = memoryview(array("q", [1, 2]))  # 16 bytes, 2 items.

    def pieces() -> Iterator[memoryview]:
        yield piece

    with pytest.raises(NotJournalPrimaryBroker):
        await append(fake_client, J, pieces())
    assert len(fake.journal.append_calls) == 1

    async with Appender(fake_client, J) as app:
        await app.write(piece)
    assert app.bytes_written == 16
    assert contents(fake.journal.append_calls[-1].requests) == [piece.tobytes(), b""]


async def test_append_does_not_retry_after_the_commit_chunk_was_sent(
    fake: FakeBroker, fake_client: JournalClient
) -> None:
    # The broker fails the RPC after receiving the commit chunk: the append may have
    # committed, so retrying could duplicate it.
    fake.journal.append_responses.append(Abort(grpc.StatusCode.UNAVAILABLE))
    with pytest.raises(grpc.aio.AioRpcError):
        await append(fake_client, J, b"maybe committed")
    assert len(fake.journal.append_calls) == 1


async def test_append_streams_async_iterables(fake: FakeBroker, fake_client: JournalClient) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for i in range(3):
            yield b"%d" % i

    await append(fake_client, J, pieces())
    assert contents(fake.journal.append_calls[0].requests) == [b"012", b""]


class _RefusingBroker(pb_grpc.JournalServicer):  # type: ignore[misc]
    async def Append(self, request_iterator: Any, context: Any) -> pb.AppendResponse:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")


async def test_a_stream_refused_at_once_keeps_the_brokers_status() -> None:
    # The broker ends the stream (no token, say) while the client writes its requests: the
    # client must report the broker's status, never grpc-python's own INTERNAL (which a
    # plain `call.write` records when it races the end of the call: most of the time with a
    # broker in the same event loop, as here).
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(_RefusingBroker(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with JournalClient(f"127.0.0.1:{port}") as client:
            codes = []
            for _ in range(60):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await append(client, J, b"refused\n", max_attempts=1)
                codes.append(info.value.code())
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
    finally:
        await server.stop(None)


@pytest.mark.parametrize("auth", [False, True], ids=["plain", "intercepted"])
async def test_cancelling_a_commit_cancels_the_rpc(fake: FakeBroker, auth: bool) -> None:
    # The broker holds the append after its commit chunk (as while replicas confirm it); the
    # task committing is cancelled: the RPC goes with it, and the broker sees the client go
    # away (and rolls the append back). grpc.aio cancels a call whose awaiting task is
    # cancelled; an authorizing channel's calls go through interceptors, which must too.
    gate = fake.journal.append_gate = threading.Event()
    try:
        channel: dict[str, Any] = {"auth": BearerAuth("a-token")} if auth else {}
        async with JournalClient(fake.address, **channel) as client:
            app = Appender(client, J)
            await app.write(b"hello")
            commit = asyncio.create_task(app.commit())
            assert await asyncio.to_thread(fake.journal.append_at_gate.wait, 10)
            commit.cancel()
            with pytest.raises(asyncio.CancelledError):
                await commit
            assert await asyncio.to_thread(fake.journal.append_cancelled.wait, 10)
            assert app.done and app.response is None
    finally:
        gate.set()
