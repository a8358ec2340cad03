"""`Reader`: one Read RPC of a journal, as an async byte stream.

A Reader starts its RPC on the first read and follows Gazette's Read protocol: metadata
responses (status, effective offset, write head, fragment, fragment URL) precede the content
chunks of their fragment. It tracks the next offset to read and the last metadata response.

End of stream (b"" from `read`, end of `async for`) happens when the broker closes the RPC
(for example at `end_offset`, or because it is shutting down), or when a directly opened
fragment is read through. Every response is checked with Gazette's rules as it arrives
(`response_check`): one that breaks a rule raises `InvalidResponse`. Errors invalidate the
Reader, except `OffsetJump`, after which it continues at the larger offset. Restarting after
EOF or errors is `RetryReader`'s job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc.aio

from pygazette.client.byte_stream import ByteStream
from pygazette.client.errors import OffsetJump, ReaderCancelled
from pygazette.client.fragment_reader import FragmentReader, open_fragment_url
from pygazette.client.journal_client import JournalClient
from pygazette.client.response_check import check_read_response, invalid_response
from pygazette.protocol.errors import error_for_status
from pygazette.protocol.pb import protocol_pb2 as pb

T = TypeVar("T")


def read_request(
    journal: str,
    *,
    offset: int = 0,
    block: bool = False,
    end_offset: int = 0,
    metadata_only: bool = False,
    do_not_proxy: bool = False,
) -> pb.ReadRequest:
    """A ReadRequest with the given options."""
    return pb.ReadRequest(
        journal=journal,
        offset=offset,
        block=block,
        end_offset=end_offset,
        metadata_only=metadata_only,
        do_not_proxy=do_not_proxy,
    )


class Reader(ByteStream):
    """Reads a journal through a single Read RPC.

    `journal` is a journal name (options as keywords) or a complete `pb.ReadRequest`.
    `request.offset` always holds the offset of the next byte to be returned; offset -1 starts
    at the write head. With `block=False`, reading at the write head raises
    `OffsetNotYetAvailable`. With `do_not_proxy=True` the broker may answer with a fragment URL
    instead of content, which the Reader then opens and reads directly (`file_root` roots
    `file://` URLs, see `open_fragment_url`).
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
    ) -> None:
        self.client = client
        if isinstance(journal, pb.ReadRequest):
            self.request = pb.ReadRequest()
            self.request.CopyFrom(journal)
        else:
            self.request = read_request(
                journal,
                offset=offset,
                block=block,
                end_offset=end_offset,
                metadata_only=metadata_only,
                do_not_proxy=do_not_proxy,
            )
        self.file_root = file_root
        # Last metadata response (content chunks do not replace it).
        self.response: pb.ReadResponse | None = None
        # Header of the RPC's first response, naming the broker and the journal's route.
        self.header: pb.Header | None = None
        self.bytes_read = 0

        self._call: grpc.aio.UnaryStreamCall[pb.ReadRequest, pb.ReadResponse] | None = None
        # The Read callable of the last call (the broker it went to).
        self._rpc: grpc.aio.UnaryStreamMultiCallable[pb.ReadRequest, pb.ReadResponse] | None = (
            None
        )
        self._direct: FragmentReader | None = None
        self._buf = b""
        self._pos = 0
        self._last_was_metadata = False
        self._eof = False
        self._error: BaseException | None = None
        self._cancelled = False
        # A direct fragment read (or open) in progress, which `cancel` interrupts.
        self._waiting: asyncio.Future[Any] | None = None

    # Inspection ---------------------------------------------------------------------------

    @property
    def journal(self) -> str:
        return self.request.journal

    @property
    def offset(self) -> int:
        """Journal offset of the next byte `read` returns."""
        return self.request.offset

    @property
    def fragment(self) -> pb.Fragment | None:
        """The fragment being read, from the last metadata response."""
        if self.response is None or not self.response.HasField("fragment"):
            return None
        return self.response.fragment

    @property
    def write_head(self) -> int:
        """The journal's write head as of the last metadata response (0 before one arrives)."""
        return self.response.write_head if self.response is not None else 0

    @property
    def fragment_url(self) -> str:
        return self.response.fragment_url if self.response is not None else ""

    @property
    def direct(self) -> FragmentReader | None:
        """The directly opened fragment being read, if any."""
        return self._direct

    # Reading ------------------------------------------------------------------------------

    async def read(self, n: int = -1) -> bytes:
        """The next bytes of the journal: up to `n` (or a whole chunk, if n < 0); b"" at EOF."""
        if n == 0:
            return b""
        if self._error is not None:
            raise self._error
        try:
            return await self._read(n)
        except OffsetJump:
            raise
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._cancelled and (task is None or task.cancelling() == 0):
                # Our own cancel() tore the RPC down under this read; the task is not cancelled.
                self._error = ReaderCancelled(f"read of {self.journal} was cancelled")
                raise self._error from None
            await self._teardown()
            raise
        except BaseException as exc:
            self._error = exc
            if isinstance(exc, grpc.aio.AioRpcError) and self._rpc is not None:
                # The client judges the broker the call went to (a routed client stops
                # routing to one that is unreachable).
                self.client.read_failed(self.journal, self._rpc, exc)
            await self._teardown()
            raise

    async def _read(self, n: int) -> bytes:
        while True:
            if self._pos < len(self._buf):
                return self._take(n)
            if self._eof:
                return b""
            if self._cancelled:
                raise ReaderCancelled(f"read of {self.journal} was cancelled")

            end_offset = self.request.end_offset
            if end_offset and self.request.offset >= end_offset:
                await self._finish()
                return b""

            if self._direct is not None:
                limit = n
                if end_offset:
                    remain = end_offset - self.request.offset
                    limit = remain if n < 0 else min(n, remain)
                chunk = await self._interruptible(self._direct.read(limit))
                if not chunk:
                    await self._finish()
                    return b""
                self.request.offset += len(chunk)
                self.bytes_read += len(chunk)
                return chunk

            if self._call is None:
                request = pb.ReadRequest()
                request.CopyFrom(self.request)
                # The journal's primary broker, where a routed client knows it.
                self._rpc = self.client.read_rpc(self.journal)
                self._call = self._rpc(request)

            resp = await self._call.read()
            if not isinstance(resp, pb.ReadResponse):  # grpc.aio.EOF
                await self._on_stream_end()
                continue
            self._on_response(resp)

    def _take(self, n: int) -> bytes:
        end = len(self._buf) if n < 0 else min(len(self._buf), self._pos + n)
        out = self._buf[self._pos : end]
        self._pos = end
        self.request.offset += len(out)
        self.bytes_read += len(out)
        return out

    def _on_response(self, resp: pb.ReadResponse) -> None:
        # Gazette's rules first (e.g. a fragment never reaches past the write head): a response
        # that breaks one raises InvalidResponse and invalidates the Reader.
        content = resp.content  # Taken once: each access copies the bytes.
        check_read_response(self.journal, resp, content)
        if self.header is None and resp.HasField("header"):
            self.header = resp.header
            self.client.note_route(self.journal, resp.header.route)

        if resp.status != pb.OK:
            # The broker closes the stream after a non-OK status; surface the status now.
            self.response = resp
            self._last_was_metadata = True
            if resp.status == pb.OFFSET_NOT_YET_AVAILABLE and (
                self.request.offset == -1 or resp.offset > self.request.offset
            ):
                # As Gazette's Reader: a read stays at the offset the broker resolved: from
                # -1, the write head (0 included), so what is appended next is read, not
                # skipped by resolving -1 again to a later head; past fragments it skipped
                # (persisted before begin_mod_time), where it got to.
                self.request.offset = resp.offset
            raise error_for_status(resp.status, self.journal, resp.header)

        requested = self.request.offset
        if resp.offset < requested:
            raise invalid_response(
                "Read",
                self.journal,
                f"invalid ReadResponse offset ({resp.offset}; expected >= {requested})",
            )

        if content:
            end_offset = self.request.end_offset
            if end_offset and resp.offset + len(content) > end_offset:
                content = content[: max(0, end_offset - resp.offset)]
            self._buf, self._pos = content, 0
            self._last_was_metadata = False
        else:
            self.response = resp
            self._last_was_metadata = True

        if resp.offset > requested:
            self.request.offset = resp.offset
            if requested != -1:
                raise OffsetJump(self.journal, requested, resp.offset)

    async def _on_stream_end(self) -> None:
        """The broker closed the RPC cleanly: open the fragment URL it sent, or reach EOF."""
        self._call = None
        resp = self.response
        if (
            self._last_was_metadata
            and resp is not None
            and not self.request.metadata_only
            and resp.status == pb.OK
            and resp.fragment_url
            and resp.HasField("fragment")
        ):
            self._last_was_metadata = False
            self._direct = await self._interruptible(
                open_fragment_url(
                    resp.fragment, self.request.offset, resp.fragment_url, file_root=self.file_root
                )
            )
            return
        self._eof = True

    async def _finish(self) -> None:
        self._eof = True
        await self._teardown()

    async def _teardown(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        direct, self._direct = self._direct, None
        if direct is not None:
            await direct.aclose()

    async def _interruptible(self, work: Coroutine[Any, Any, T]) -> T:
        """`work`, awaited so that `cancel` interrupts it (a direct read of a fragment URL
        waits on a store: Gazette's Reader has its context abort the HTTP request)."""
        if self._cancelled:
            work.close()
            raise ReaderCancelled(f"read of {self.journal} was cancelled")
        waiting: asyncio.Future[T] = asyncio.ensure_future(work)
        self._waiting = waiting
        try:
            return await waiting
        finally:
            self._waiting = None

    def cancel(self) -> None:
        """Abort the RPC. A read blocked in another task raises `ReaderCancelled`."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()
        if self._waiting is not None:
            self._waiting.cancel()

    async def aclose(self) -> None:
        """Abort the RPC (if still open) and release a directly opened fragment (a read in
        progress raises `ReaderCancelled`)."""
        self._cancelled = True
        self._eof = True
        if self._waiting is not None:
            self._waiting.cancel()
        await self._teardown()

    def __repr__(self) -> str:
        return f"Reader({self.journal!r}, offset={self.offset})"
