"""`WatchedList`: the live set of journals matching a selector, kept current by a List watch.

The broker's List RPC with `watch` streams a snapshot of the matching journals, and a new
snapshot whenever a matching spec changes; snapshots are delimited by an empty response.
`WatchedList` runs that stream in a background task, resuming it after failures (from the
last revision seen, with backoff; a snapshot breaking Gazette's rules is such a failure, counted
by `response_check`), and exposes the latest snapshot through `snapshot()`. Message
mappings use it to spread messages over a changing set of partitions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType

import grpc.aio

from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import as_selector
from pygazette.client.response_check import check_response, invalid_response
from pygazette.client.retry_reader import backoff
from pygazette.protocol.errors import error_for_status
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import format_selector
from pygazette.protocol.validation import validate_list_journals, validate_list_response

log = logging.getLogger(__name__)


class WatchedList:
    """The journals matching `selector`, updated as they change.

    Start it with `await start()` (which waits for the first snapshot) or `async with`;
    `snapshot()` then returns the latest snapshot, a ListResponse that is replaced, never
    modified, so its identity changes exactly when the listing does.
    """

    def __init__(
        self,
        client: JournalClient,
        selector: str | pb.LabelSelector = "",
        *,
        backoff: Callable[[int], float] = backoff,
    ) -> None:
        self.client = client
        self.selector = as_selector(selector)
        self._backoff = backoff
        self._resp: pb.ListResponse | None = None
        self._task: asyncio.Task[None] | None = None
        self._updated = asyncio.Event()
        self._error: BaseException | None = None
        self.updates = 0

    def snapshot(self) -> pb.ListResponse:
        """The latest snapshot. Raises if none has arrived yet."""
        if self._resp is None:
            raise RuntimeError(f"{self!r} has no snapshot yet (await start() first)")
        return self._resp

    @property
    def journals(self) -> list[pb.ListResponse.Journal]:
        return list(self.snapshot().journals)

    async def start(self) -> pb.ListResponse:
        """Start watching and wait for the first snapshot (raising a terminal error, such
        as a malformed selector, instead)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._watch(), name=f"watched-list:{format_selector(self.selector)}"
            )
        await self._first()
        return self.snapshot()

    async def _first(self) -> None:
        while self._resp is None:
            if self._error is not None:
                raise self._error
            if self._task is not None and self._task.done():
                self._task.result()
                raise RuntimeError("watch ended before a snapshot arrived")
            await self.wait_update()

    async def wait_update(self) -> pb.ListResponse | None:
        """Wait for the next snapshot (or failure) and return the latest snapshot."""
        self._updated.clear()
        await self._updated.wait()
        return self._resp

    async def _watch(self) -> None:
        request = pb.ListRequest(selector=self.selector, watch=True)
        attempt = 0
        while True:
            call = self.client.rpc_list(request)
            try:
                while True:
                    resp = await self._read_snapshot(call, request)
                    self._resp = resp
                    self.updates += 1
                    request.watch_resume.CopyFrom(resp.header)
                    attempt = 0
                    self._updated.set()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.UNIMPLEMENTED,
                ):
                    self._fail(exc)
                    return
                self._retrying(exc, attempt)
            except Exception as exc:
                self._retrying(exc, attempt)
            finally:
                call.cancel()
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._updated.set()

    def _retrying(self, exc: BaseException, attempt: int) -> None:
        self._updated.set()
        if attempt:
            log.warning(
                "watched journal listing failed (will retry)",
                extra={"selector": format_selector(self.selector), "err": str(exc)},
            )

    @staticmethod
    async def _read_snapshot(
        call: grpc.aio.UnaryStreamCall[pb.ListRequest, pb.ListResponse], request: pb.ListRequest
    ) -> pb.ListResponse:
        watching = f"watch of {format_selector(request.selector) or 'all journals'}"
        first = await call.read()
        if not isinstance(first, pb.ListResponse):
            raise EOFError("the List watch ended")
        check_response("List", watching, validate_list_response, first)
        if first.status != pb.OK:
            raise error_for_status(first.status, "watching journals", first.header)
        if (
            request.HasField("watch_resume")
            and first.header.etcd.revision <= request.watch_resume.etcd.revision
        ):
            raise invalid_response(
                "List",
                watching,
                f"unexpected ListResponse revision ({first.header.etcd.revision}; "
                f"expected > {request.watch_resume.etcd.revision})",
            )
        while True:
            nxt = await call.read()
            if not isinstance(nxt, pb.ListResponse):
                raise EOFError("the List watch ended within a snapshot")
            if not nxt.journals:
                return first
            check_response("List", watching, validate_list_journals, nxt)
            first.journals.extend(nxt.journals)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # A cancellation of our caller still propagates.

    async def __aenter__(self) -> WatchedList:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"WatchedList({format_selector(self.selector)!r})"
