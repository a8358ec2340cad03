"""`Appender` (one atomic Append RPC) and `append` (an append with safe retries).

The Append protocol: a first request names the journal and options (expected offset,
register checks and updates), then content chunks follow, then an empty chunk commits. Ending
the stream without that empty chunk aborts: the broker discards everything sent. Nothing of an
append is visible to readers before it commits, and it commits all or nothing.

The broker's response is checked with Gazette's rules (`response_check`): one that breaks a
rule raises `InvalidResponse`, and the append's outcome is then unknown (it is not retried).

Small writes are coalesced into chunks of at most `CHUNK_SIZE` bytes; a content chunk is never
empty, because an empty chunk means "commit".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TypeAlias

import grpc
import grpc.aio

from pygazette.auth.capability import Capability
from pygazette.auth.client_interceptor import journal_claims_scope
from pygazette.client.errors import ClientError
from pygazette.client.journal_client import JournalClient
from pygazette.client.response_check import check_response, invalid_response
from pygazette.client.retry_reader import backoff
from pygazette.protocol.errors import (
    InsufficientJournalBrokers,
    NoJournalPrimaryBroker,
    NotJournalPrimaryBroker,
    error_for_status,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import format_selector
from pygazette.protocol.stream_write import CallEnded, send
from pygazette.protocol.validation import validate_append_response, validate_journal_name

log = logging.getLogger(__name__)

CHUNK_SIZE = 1 << 20
# How long an abort waits for the broker to acknowledge the discarded append.
ABORT_TIMEOUT_SECONDS = 5.0

BytesLike: TypeAlias = bytes | bytearray | memoryview
AppendContent: TypeAlias = BytesLike | Iterable[BytesLike] | AsyncIterable[BytesLike]


class ChunkCoalescer:
    """Packs a sequence of writes into content chunks of exactly `chunk_size` bytes.

    `add` returns the chunks that became full; `flush` returns the partial remainder. No chunk
    is ever empty.
    """

    def __init__(self, chunk_size: int = CHUNK_SIZE) -> None:
        if chunk_size <= 0:
            raise ValueError(f"invalid chunk size {chunk_size}")
        self.chunk_size = chunk_size
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held back, waiting for a chunk to fill."""
        return len(self._buf)

    def add(self, data: BytesLike) -> list[bytes]:
        size = self.chunk_size
        if not self._buf and type(data) is bytes and len(data) == size:
            return [data]  # A whole chunk already: no copy.
        view = memoryview(data).cast("B")
        out: list[bytes] = []
        if self._buf:
            take = min(size - len(self._buf), len(view))
            self._buf += view[:take]
            view = view[take:]
            if len(self._buf) < size:
                return out
            out.append(bytes(self._buf))
            self._buf.clear()
        while len(view) >= size:
            out.append(bytes(view[:size]))
            view = view[size:]
        if len(view):
            self._buf += view
        return out

    def flush(self) -> bytes | None:
        if not self._buf:
            return None
        chunk = bytes(self._buf)
        self._buf.clear()
        return chunk


class AppenderStateError(ClientError):
    """The Appender was used after it committed or aborted."""


class Appender:
    """Streams one atomic append to a journal.

    The RPC starts with the first write (or `start()`); content is streamed as it is written.
    Brokers expect a started append to be completed promptly, so write content that is
    readily available. `commit()` returns the broker's AppendResponse or raises the broker's
    status as an exception (`WrongAppendOffset`, `RegisterMismatch`, ...); `abort()` discards.
    As an async context manager it commits on a clean exit and aborts on an exception.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str | pb.AppendRequest,
        *,
        offset: int = 0,
        check_registers: pb.LabelSelector | None = None,
        union_registers: pb.LabelSet | None = None,
        subtract_registers: pb.LabelSet | None = None,
        do_not_proxy: bool = False,
        suspend: pb.AppendRequest.Suspend = pb.AppendRequest.SUSPEND_RESUME,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        self.client = client
        if isinstance(journal, pb.AppendRequest):
            self.request = pb.AppendRequest()
            self.request.CopyFrom(journal)
            self.request.ClearField("content")
        else:
            self.request = pb.AppendRequest(
                journal=journal, offset=offset, do_not_proxy=do_not_proxy, suspend=suspend
            )
            if check_registers is not None:
                self.request.check_registers.CopyFrom(check_registers)
            if union_registers is not None:
                self.request.union_registers.CopyFrom(union_registers)
            if subtract_registers is not None:
                self.request.subtract_registers.CopyFrom(subtract_registers)
        self.response: pb.AppendResponse | None = None
        self.bytes_written = 0
        # True once the commit chunk may have reached the broker: from then on, the append may
        # have committed even if the RPC fails.
        self.commit_sent = False

        self._coalescer = ChunkCoalescer(chunk_size)
        self._call: grpc.aio.StreamUnaryCall[pb.AppendRequest, pb.AppendResponse] | None = None
        # The callable the RPC was opened with: the client's own broker, or the journal's
        # primary when the client routes (`JournalClient.append_rpc`).
        self._rpc: grpc.aio.StreamUnaryMultiCallable[pb.AppendRequest, pb.AppendResponse] | None = (
            None
        )
        self._state = "new"  # new -> started -> committed | aborted | failed

    @property
    def journal(self) -> str:
        return self.request.journal

    @property
    def started(self) -> bool:
        return self._call is not None

    @property
    def done(self) -> bool:
        return self._state in ("committed", "aborted", "failed")

    async def start(self) -> None:
        """Open the RPC and send the request preamble (done implicitly by the first write)."""
        self._check_usable()
        if self._call is not None:
            return
        validate_journal_name(self.request.journal)
        with journal_claims_scope(Capability.APPEND, self.request.journal):
            self._rpc = self.client.append_rpc(self.request.journal)
            self._call = self._rpc(None)
        self._state = "started"
        preamble = pb.AppendRequest()
        preamble.CopyFrom(self.request)
        await self._send(preamble)

    async def write(self, data: BytesLike) -> None:
        """Add content to the append (nothing is visible to readers before `commit`)."""
        self._check_usable()
        if not len(data):
            return  # An empty chunk would mean "commit".
        await self.start()
        for chunk in self._coalescer.add(data):
            await self._send(pb.AppendRequest(content=chunk))
        self.bytes_written += _size(data)

    async def commit(self) -> pb.AppendResponse:
        """Commit everything written; returns the broker's response (see `response.commit`)."""
        self._check_usable()
        await self.start()
        call = self._call
        assert call is not None
        rest = self._coalescer.flush()
        if rest is not None:
            await self._send(pb.AppendRequest(content=rest))
        self.commit_sent = True
        await self._send(pb.AppendRequest())
        try:
            await call.done_writing()
            resp = await call
        except grpc.aio.AioRpcError as exc:
            self._state = "failed"
            self._rpc_failed(exc)
            raise
        except BaseException:
            self._state = "failed"
            raise
        return self._finish(resp)

    async def abort(self) -> None:
        """Discard the append: end the stream without the commit chunk. Never raises."""
        if self.done:
            return
        self._state = "aborted"
        call, self._call = self._call, None
        if call is None:
            return
        try:
            await call.done_writing()
            async with asyncio.timeout(ABORT_TIMEOUT_SECONDS):
                await _await_call(call)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
            pass
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            if not call.done():
                call.cancel()

    async def _send(self, request: pb.AppendRequest) -> None:
        call = self._call
        assert call is not None
        try:
            await send(call, request)
        except (CallEnded, grpc.aio.AioRpcError):
            # The RPC already ended: typically the broker refused the append (at its preamble,
            # say) and closed the stream while we were still writing. The write fails; the
            # broker's response, or final status, says why (`send` keeps that status).
            self._state = "failed"
            try:
                resp = await call  # Raises the RPC's final status if it ended without one.
            except grpc.aio.AioRpcError as exc:
                self._rpc_failed(exc)
                raise
            self._finish(resp)
            raise invalid_response(
                "Append", self.journal, "status OK before the append's commit was sent"
            ) from None
        except BaseException:
            self._state = "failed"
            call.cancel()
            raise

    def _rpc_failed(self, exc: grpc.aio.AioRpcError) -> None:
        if self._rpc is not None:
            self.client.append_failed(self.journal, self._rpc, exc)

    def _finish(self, resp: pb.AppendResponse) -> pb.AppendResponse:
        self.response = resp
        try:
            # Gazette's rules (e.g. an OK response carries its commit and the registers).
            check_response("Append", self.journal, validate_append_response, resp)
        except BaseException:
            self._state = "failed"
            raise
        if resp.header.HasField("route"):
            # Where the journal is served now (also with a refusal, e.g. NOT_JOURNAL_PRIMARY_
            # BROKER): a routing client sends the next append there.
            self.client.note_route(self.journal, resp.header.route)
        if resp.status != pb.OK:
            self._state = "failed"
            raise error_for_status(
                resp.status,
                self._status_detail(resp),
                resp.header if resp.HasField("header") else None,
            )
        self._state = "committed"
        return resp

    def _status_detail(self, resp: pb.AppendResponse) -> str:
        req = self.request
        if resp.status == pb.REGISTER_MISMATCH:
            registers = ", ".join(f"{lb.name}={lb.value}" for lb in resp.registers.labels)
            return (
                f"{req.journal}: selector {format_selector(req.check_registers)!r} "
                f"does not match registers {{{registers}}}"
            )
        if resp.status == pb.WRONG_APPEND_OFFSET:
            return f"{req.journal}: append offset {req.offset} is not the write head"
        if resp.status == pb.FRAGMENT_STORE_UNHEALTHY and resp.store_health_error:
            return f"{req.journal}: {resp.store_health_error}"
        return req.journal

    def _check_usable(self) -> None:
        if self.done:
            raise AppenderStateError(f"appender of {self.journal} is already {self._state}")

    async def __aenter__(self) -> Appender:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            await self.abort()
        elif not self.done:
            await self.commit()

    def __repr__(self) -> str:
        return f"Appender({self.journal!r}, state={self._state})"


async def _await_call(call: grpc.aio.StreamUnaryCall[pb.AppendRequest, pb.AppendResponse]) -> None:
    await call


def _is_bytes_like(content: object) -> bool:
    return isinstance(content, (bytes, bytearray, memoryview))


def _size(data: BytesLike) -> int:
    """Bytes of `data` (a memoryview's len() counts its items, which may be wider)."""
    return data.nbytes if isinstance(data, memoryview) else len(data)


# Content drawn from an iterator is kept, up to this many bytes, so that an append refused
# before it committed (a journal without a primary yet, e.g. resuming from a full
# suspension; a transport failure before the commit chunk) can send it again: the refusal
# comes at the first response, after the first pieces went out. An append that drew more
# before failing is not retried.
REPLAY_LIMIT = 8 << 20


class _Source:
    """Iterates append content, across attempts: bytes and sequences from their start; an
    iterator's pieces drawn so far (while they fit REPLAY_LIMIT) again, then on from it."""

    def __init__(self, content: AppendContent) -> None:
        self.content = content
        self.drawn = False
        self.replayable = _is_bytes_like(content) or (
            isinstance(content, Sequence) and not isinstance(content, str)
        )
        self._iterator: Iterator[BytesLike] | AsyncIterator[BytesLike] | None = None
        self._kept: list[bytes] | None = []  # None: more was drawn than REPLAY_LIMIT.
        self._kept_size = 0
        # The iterator raised: it is over, and what it would have yielded next is lost.
        self.failed = False

    @property
    def can_replay(self) -> bool:
        if self.failed:
            return False  # A replay would commit what was drawn as if it were all.
        return self.replayable or not self.drawn or self._kept is not None

    async def pieces(self) -> AsyncIterator[BytesLike]:
        content = self.content
        self.drawn = True
        if isinstance(content, (bytes, bytearray, memoryview)):
            yield content
            return
        if self.replayable:
            assert isinstance(content, Iterable)
            for piece in content:
                yield piece
            return
        if self._iterator is None:
            self._iterator = aiter(content) if isinstance(content, AsyncIterable) else iter(content)
        for piece in list(self._kept or ()):
            yield piece
        iterator = self._iterator
        while True:
            try:
                if isinstance(iterator, AsyncIterator):
                    piece = await anext(iterator)
                else:
                    piece = next(iterator)
            except (StopIteration, StopAsyncIteration):
                return
            except BaseException:
                # The content's own failure (its error may look like the append's, e.g. a
                # reader's UNAVAILABLE) ends the append: nothing is retried.
                self.failed = True
                raise
            self._keep(piece)
            yield piece

    def _keep(self, piece: BytesLike) -> None:
        if self._kept is None:
            return
        self._kept_size += _size(piece)
        if self._kept_size > REPLAY_LIMIT:
            self._kept = None
        else:
            self._kept.append(bytes(piece))


# Statuses of a broker refusing an append for where the journal is served: nothing committed.
_ROUTING_REFUSALS = (NotJournalPrimaryBroker, NoJournalPrimaryBroker, InsufficientJournalBrokers)


def _safe_to_retry(exc: BaseException, appender: Appender, source: _Source) -> bool:
    """Whether the append provably did not commit and its content can be sent again."""
    if not source.can_replay:
        return False
    if isinstance(exc, _ROUTING_REFUSALS):
        return True  # The broker refused the append (as Gazette's Append retries): nothing
        # committed.
    if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE:
        # Without the commit chunk the broker cannot have committed.
        return not appender.commit_sent
    return False


async def append(
    client: JournalClient,
    journal: str,
    content: AppendContent = b"",
    *,
    offset: int = 0,
    check_registers: pb.LabelSelector | None = None,
    union_registers: pb.LabelSet | None = None,
    subtract_registers: pb.LabelSet | None = None,
    suspend: pb.AppendRequest.Suspend = pb.AppendRequest.SUSPEND_RESUME,
    chunk_size: int = CHUNK_SIZE,
    max_attempts: int = 8,
) -> pb.AppendResponse:
    """Append `content` (bytes, or an iterable / async iterable of bytes) atomically.

    Transport failures and primary hand-offs are retried, with backoff, only where that is
    safe: the commit chunk was never sent (so the broker cannot have committed), and the
    content can be produced again (bytes or a sequence, or an iterator of which at most
    REPLAY_LIMIT bytes were drawn, and which did not raise).
    Every other failure, including broker statuses and the content iterator's own, is raised.
    """
    source = _Source(content)
    attempt = 0
    while True:
        appender = Appender(
            client,
            journal,
            offset=offset,
            check_registers=check_registers,
            union_registers=union_registers,
            subtract_registers=subtract_registers,
            suspend=suspend,
            chunk_size=chunk_size,
        )
        try:
            await appender.start()
            async for piece in source.pieces():
                await appender.write(piece)
            return await appender.commit()
        except BaseException as exc:
            await appender.abort()
            attempt += 1
            if attempt >= max_attempts or not _safe_to_retry(exc, appender, source):
                raise
            # As Gazette's Append: a first refusal for routing (a journal resuming, a primary
            # hand-off) is expected, and not worth a warning.
            log.log(
                logging.DEBUG
                if attempt == 1 and isinstance(exc, _ROUTING_REFUSALS)
                else logging.WARNING,
                "append failure (will retry)",
                extra={"journal": journal, "err": str(exc), "attempt": attempt},
            )
        await asyncio.sleep(backoff(attempt - 1))
