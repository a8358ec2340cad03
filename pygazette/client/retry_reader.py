"""`RetryReader`: a journal byte stream that survives broker restarts and hand-offs.

It wraps `Reader`, starting a new Read RPC from the current offset whenever the broker closes
the stream or the transport fails, with backoff. Like Gazette's RetryReader it surfaces only:

- `OffsetJump` (the reader continues at the new offset on the next read),
- `OffsetNotYetAvailable` for a non-blocking read at the write head (and `Suspended` for a
  non-blocking read of a suspended journal); a later read asks a broker again, from the
  write head it was told if it read from -1,
- EOF (b"") once `end_offset` has been read through,
- `ReaderCancelled` after `cancel()`, and errors that a retry cannot fix (unknown journal,
  reads not allowed by the journal's flags, malformed requests, corrupt fragments).

With `do_not_proxy`, a fragment whose URL cannot be opened here (no `file_root` for a
`file://` store, a store failing the GET, a file just removed by retention) is read through
the broker, and the next fragment's URL is opened again (Gazette's RetryReader retries the
URL after a backoff instead).

A response that breaks Gazette's rules (`InvalidResponse`, counted by `response_check`) is
logged and read again after a backoff, as Gazette's RetryReader does.

`read_journal` builds the common loop on top: chunks until the write head or `end_offset`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import grpc
import grpc.aio

from pygazette.client.byte_stream import ByteStream
from pygazette.client.errors import (
    CorruptFragment,
    DidNotReadExpectedEOF,
    FragmentOpenError,
    FragmentReadError,
    InvalidResponse,
    OffsetJump,
    ProtocolViolation,
    ReaderCancelled,
)
from pygazette.client.journal_client import JournalClient
from pygazette.client.reader import Reader, read_request
from pygazette.protocol.errors import (
    BrokerError,
    JournalNotFound,
    NotAllowed,
    OffsetNotYetAvailable,
    Suspended,
    ValidationError,
)
from pygazette.protocol.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)

# gRPC codes that describe a request no retry can fix.
_FATAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)

# A freshly created journal may not have propagated to every broker yet.
_JOURNAL_NOT_FOUND_ATTEMPTS = 4


def backoff(attempt: int) -> float:
    """Seconds to wait before retry `attempt` (0-based): brief at first, then settling at 5s."""
    if attempt <= 1:
        return 0.05
    if attempt <= 3:
        return 0.1
    if attempt <= 5:
        return 1.0
    return 5.0


class RetryReader(ByteStream):
    """Reads a journal from `offset`, restarting Read RPCs as needed.

    Not safe for concurrent reads; `cancel()` may be called from another task to abort a read
    in progress. Options are those of `Reader`.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str | pb.ReadRequest,
        *,
        offset: int = 0,
        block: bool = False,
        end_offset: int = 0,
        metadata_only: bool = False,
        do_not_proxy: bool = False,
        file_root: str | Path | None = None,
        backoff: Callable[[int], float] = backoff,
    ) -> None:
        self.client = client
        self.file_root = file_root
        self._backoff = backoff
        if isinstance(journal, pb.ReadRequest):
            request = journal
        else:
            request = read_request(
                journal,
                offset=offset,
                block=block,
                end_offset=end_offset,
                metadata_only=metadata_only,
                do_not_proxy=do_not_proxy,
            )
        self.reader = Reader(client, request, file_root=file_root)
        self._cancelled = False
        self._cancel_event = asyncio.Event()  # Set by `cancel()`: ends a backoff at once.
        # Set while a fragment whose URL failed to open is read through the broker: its end,
        # where fragment URLs are asked for (`do_not_proxy`) again.
        self._proxied_until: int | None = None
        self._proxied_fragments = 0  # Fragments read so (the first is logged as a warning).

    @property
    def journal(self) -> str:
        return self.reader.request.journal

    @property
    def offset(self) -> int:
        """Journal offset of the next byte `read` returns."""
        return self.reader.request.offset

    @property
    def request(self) -> pb.ReadRequest:
        return self.reader.request

    async def read(self, n: int = -1) -> bytes:
        """The next bytes of the journal (at most `n`, if n > 0); b"" only at `end_offset`."""
        if n == 0:
            return b""
        attempt = 0
        while True:
            if self._cancelled:
                raise ReaderCancelled(f"read of {self.journal} was cancelled")
            until = self._proxied_until
            if until is not None and self.offset >= until:
                # Read through the fragment whose URL failed: open fragment URLs again.
                self._proxied_until = None
                self.reader.request.do_not_proxy = True
                await self._restart()
            reader = self.reader
            try:
                chunk = await reader.read(n)
            except (OffsetJump, ReaderCancelled):
                raise
            except OffsetNotYetAvailable:
                # The Reader is spent either way: a later read asks a broker again (as
                # Gazette's RetryReader restarts its Reader before surfacing the error).
                await self._restart()
                if not reader.request.block:
                    raise
                # `block` was switched on after a non-blocking read started: restart blocking.
            except Suspended:
                # A suspended journal has nothing to read until an append resumes it.
                await self._restart()
                if not reader.request.block:
                    raise
            except InvalidResponse as exc:
                # A response that breaks Gazette's rules (counted where it was caught): as
                # Gazette's RetryReader, log it and read again after a backoff.
                self._log_retry(exc, attempt, squelch=False)
                await self._restart()
            except JournalNotFound as exc:
                if attempt + 1 >= _JOURNAL_NOT_FOUND_ATTEMPTS:
                    raise
                self._log_retry(exc, attempt, squelch=attempt == 0)
                await self._restart()
            except (
                NotAllowed,
                ValidationError,
                ProtocolViolation,
                CorruptFragment,
                DidNotReadExpectedEOF,
            ):
                raise
            except BrokerError as exc:
                # NOT_JOURNAL_BROKER, INSUFFICIENT_JOURNAL_BROKERS... while the cluster converges.
                self._log_retry(exc, attempt, squelch=attempt == 0)
                await self._restart()
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _FATAL_CODES:
                    raise
                # An older pygazette broker ends a read with DEADLINE_EXCEEDED when its token
                # expires (Gazette's, and pygazette's since, end the stream cleanly): expected
                # of a long read, and the next one is signed afresh. Quiet the first time.
                expired = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                self._log_retry(exc, attempt, squelch=expired and attempt == 0)
                await self._restart()
            except FragmentOpenError as exc:
                # A fragment URL this process cannot open (a file:// store without
                # `file_root`, a store refusing or failing the GET, a file retention just
                # removed): read that fragment through the broker, and open the next
                # fragment's URL again, as the failure may well have been passing.
                fragment = reader.fragment
                if (
                    reader.request.do_not_proxy
                    and fragment is not None
                    and fragment.end > self.offset >= 0
                ):
                    (log.debug if self._proxied_fragments else log.warning)(
                        "reading a fragment through the broker: its URL cannot be opened here",
                        extra={
                            "journal": self.journal,
                            "offset": self.offset,
                            "fragment_end": fragment.end,
                            "err": str(exc),
                        },
                    )
                    self._proxied_fragments += 1
                    self._proxied_until = fragment.end
                    reader.request.do_not_proxy = False
                    await self._restart()
                    continue  # Nothing to wait for: the broker reads it.
                self._log_retry(exc, attempt, squelch=False)
                await self._restart()
            except FragmentReadError as exc:
                # A fragment URL that was cut short or corrupt: ask a broker again.
                self._log_retry(exc, attempt, squelch=False)
                await self._restart()
            else:
                if chunk:
                    return chunk
                request = reader.request
                if request.end_offset and request.offset >= request.end_offset:
                    return b""
                if request.metadata_only:
                    return b""
                # The broker closed the stream (a fragment read through, shutdown, hand-off):
                # continue where we are. Back off only if the stream delivered nothing.
                progressed = reader.bytes_read > 0
                await self._restart()
                if progressed:
                    continue
                attempt = 0
                await self._sleep(self._backoff(attempt))
                continue

            await self._sleep(self._backoff(attempt))
            attempt += 1

    def _log_retry(self, exc: BaseException, attempt: int, squelch: bool) -> None:
        if squelch:
            return
        log.warning(
            "read failure (will retry)",
            extra={
                "journal": self.journal,
                "offset": self.offset,
                "err": str(exc),
                "attempt": attempt,
            },
        )

    async def _sleep(self, seconds: float) -> None:
        """Back off for `seconds`, or until `cancel()`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._cancel_event.wait()
        if self._cancelled:
            raise ReaderCancelled(f"read of {self.journal} was cancelled")

    async def _restart(self, offset: int | None = None) -> None:
        """Replace the Reader with a fresh one at the current (or given) offset."""
        old = self.reader
        request = pb.ReadRequest()
        request.CopyFrom(old.request)
        if offset is not None:
            request.offset = offset
        await old.aclose()
        self.reader = Reader(self.client, request, file_root=self.file_root)
        self.reader.response = old.response

    async def seek(self, offset: int) -> int:
        """Continue reading at `offset` (which may be -1, the write head). Returns the offset.

        A forward seek within a directly opened fragment discards content up to `offset`;
        every other seek starts a new Read RPC.
        """
        if offset < -1:
            raise ValueError(f"invalid offset {offset}")
        if self._proxied_until is not None:
            # Wherever the seek goes, its fragment's URL is worth opening.
            self._proxied_until = None
            self.reader.request.do_not_proxy = True
        direct = self.reader.direct
        if direct is not None and self.offset <= offset < direct.fragment.end:
            end_offset = self.reader.request.end_offset
            if not end_offset or offset <= end_offset:
                while self.offset < offset:
                    if not await self.reader.read(offset - self.offset):
                        break
                if self.offset == offset:
                    return offset
        await self._restart(offset)
        return self.offset

    def cancel(self) -> None:
        """Abort the current read; it and every later read raise `ReaderCancelled`."""
        self._cancelled = True
        self._cancel_event.set()
        self.reader.cancel()

    async def aclose(self) -> None:
        """Abort the current Read RPC, if any."""
        await self.reader.aclose()

    def __repr__(self) -> str:
        return f"RetryReader({self.journal!r}, offset={self.offset})"


async def read_journal(
    client: JournalClient,
    journal: str,
    *,
    offset: int = 0,
    block: bool = False,
    end_offset: int = 0,
    do_not_proxy: bool = False,
    file_root: str | Path | None = None,
) -> AsyncGenerator[bytes, None]:
    """Chunks of a journal's content from `offset`.

    Ends at the write head when `block` is false, at `end_offset` when it is set, and never
    otherwise. Offset jumps (removed spans) are logged and skipped over.
    """
    rr = RetryReader(
        client,
        journal,
        offset=offset,
        block=block,
        end_offset=end_offset,
        do_not_proxy=do_not_proxy,
        file_root=file_root,
    )
    try:
        async for chunk in chunks_of(rr):
            yield chunk
    finally:
        await rr.aclose()


async def chunks_of(rr: RetryReader) -> AsyncGenerator[bytes, None]:
    """The chunks `rr` reads, until the write head (a non-blocking read), its end offset, or
    a suspended journal. Offset jumps (removed spans) are logged and skipped over. `rr.offset`
    is that of the content after each chunk; closing `rr` is the caller's."""
    while True:
        try:
            chunk = await rr.read()
        except OffsetJump as jump:
            log.warning(
                "offset jump",
                extra={"journal": rr.journal, "from": jump.requested, "to": jump.offset},
            )
            continue
        except (OffsetNotYetAvailable, Suspended):
            return
        if not chunk:
            return
        yield chunk
