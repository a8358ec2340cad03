"""Gazette's Journal RPC counters: `gazette_journal_server_started_totals`{operation} and
`gazette_journal_server_completed_totals`{operation,status}, counted by a gRPC interceptor.

Gazette names these counters with a trailing `_totals`; prometheus-client would expose a
Counter so named as `…_totals_total`, so they are kept here and rendered by `exposition()` in
the text format exactly as Gazette's Go client renders them (`# TYPE … counter`, samples
under the family's own name). The status label is Gazette's (`instrumentJournalServerRPC`):
"<error>" when the RPC failed with a gRPC error, else "ok" or, where Gazette labels one, the
`protocol.Status` name of what the RPC answered: an Append's any status (its state machine
keeps them all), a Read's, ListFragments' or Replicate's only a status of the journal's
resolution (JOURNAL_NOT_FOUND, SUSPENDED, ...: not OFFSET_NOT_YET_AVAILABLE, NOT_ALLOWED or
WRONG_ROUTE), and List's, Apply's and FragmentStoreHealth's none. A Read its client cancelled
(a blocking read left) is "ok": Gazette suppresses the cancellation.

An append a peer proxies whole (`pygazette.PeerJournal/AppendWhole`) counts as an Append, as
the proxied stream it replaces counts at Gazette's primary, and a replication a primary sends
whole (`pygazette.PeerJournal/ReplicateWhole`) as a Replicate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio

from pygazette.protocol.pb import protocol_pb2 as pb

if TYPE_CHECKING:
    _Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    _Interceptor: TypeAlias = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor

SERVICE_PREFIX = "/protocol.Journal/"
# Methods of other services counted as the Journal operation they stand for.
OTHER_OPERATIONS = {
    "/pygazette.PeerJournal/AppendWhole": "Append",
    "/pygazette.PeerJournal/ReplicateWhole": "Replicate",
}
STARTED = "gazette_journal_server_started_totals"
COMPLETED = "gazette_journal_server_completed_totals"
_STARTED_HELP = "Total number of started JournalServer RPC invocations, by operation."
_COMPLETED_HELP = (
    "Total number of completed JournalServer RPC invocations, by operation & response status"
)


class RpcCounters:
    """Started and completed Journal RPCs of this process (updated on its event loop)."""

    def __init__(self) -> None:
        self.started: dict[str, int] = {}
        self.completed: dict[tuple[str, str], int] = {}

    def start(self, op: str) -> None:
        self.started[op] = self.started.get(op, 0) + 1

    def complete(self, op: str, status: str) -> None:
        key = (op, status)
        self.completed[key] = self.completed.get(key, 0) + 1

    def exposition(self) -> str:
        """Both counter families in the Prometheus text format (version 0.0.4)."""
        lines = [f"# HELP {STARTED} {_STARTED_HELP}", f"# TYPE {STARTED} counter"]
        for op, n in sorted(self.started.items()):
            lines.append(f'{STARTED}{{operation="{_escape(op)}"}} {float(n)}')
        lines += [f"# HELP {COMPLETED} {_COMPLETED_HELP}", f"# TYPE {COMPLETED} counter"]
        for (op, status), n in sorted(self.completed.items()):
            lines.append(
                f'{COMPLETED}{{operation="{_escape(op)}",status="{_escape(status)}"}} {float(n)}'
            )
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# Statuses of a journal's resolution (Gazette's resolver.resolve): the only ones Gazette
# labels a Read, ListFragments or Replicate with.
RESOLUTION_STATUSES = frozenset(
    {
        pb.JOURNAL_NOT_FOUND,
        pb.SUSPENDED,
        pb.NO_JOURNAL_PRIMARY_BROKER,
        pb.NOT_JOURNAL_PRIMARY_BROKER,
        pb.NOT_JOURNAL_BROKER,
        pb.INSUFFICIENT_JOURNAL_BROKERS,
    }
)
# Operations whose label is any status they answer; with RESOLVED_OPERATIONS, a resolution
# status; the others are "ok" whatever they answered.
ANSWERED_OPERATIONS = frozenset({"Append"})
RESOLVED_OPERATIONS = frozenset({"Read", "ListFragments", "Replicate"})


def _status_of(resp: object, op: str = "Append") -> str:
    status = getattr(resp, "status", pb.OK)
    if status == pb.OK:
        return "ok"
    if op not in ANSWERED_OPERATIONS and (
        op not in RESOLVED_OPERATIONS or status not in RESOLUTION_STATUSES
    ):
        return "ok"
    try:
        return pb.Status.Name(status)
    except ValueError:
        return str(status)


class RpcMetricsInterceptor(_Interceptor):
    """Counts every `protocol.Journal` RPC (and `OTHER_OPERATIONS`) into `counters`; other
    services pass untouched."""

    def __init__(self, counters: RpcCounters) -> None:
        self.counters = counters
        # Handlers are wrapped once per method (not per call): method -> (handler, wrapped).
        self._wrapped: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None:
            return handler
        if method.startswith(SERVICE_PREFIX):
            op = method[len(SERVICE_PREFIX) :]
        elif method in OTHER_OPERATIONS:
            op = OTHER_OPERATIONS[method]
        else:
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, op)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Any, op: str) -> grpc.RpcMethodHandler[Any, Any]:
        counters = self.counters
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None or handler.stream_unary is not None:
            streaming_request = handler.unary_unary is None
            inner = handler.stream_unary if streaming_request else handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                counters.start(op)
                status = "<error>"
                try:
                    resp = await inner(request, context)
                    status = _status_of(resp, op)
                    return resp
                finally:
                    counters.complete(op, status)

            if streaming_request:
                return grpc.stream_unary_rpc_method_handler(unary, **kw)
            return grpc.unary_unary_rpc_method_handler(unary, **kw)

        streaming_request = handler.unary_stream is None
        inner_stream = handler.stream_stream if streaming_request else handler.unary_stream

        async def streams(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            counters.start(op)
            status = "<error>"
            first: str | None = None
            try:
                async for resp in inner_stream(request, context):
                    if first is None:
                        first = _status_of(resp, op)
                    yield resp
                status = first or "ok"
            except asyncio.CancelledError:
                if op == "Read":  # The client went away: Gazette's SuppressCancellationError.
                    status = first or "ok"
                raise
            finally:
                counters.complete(op, status)

        if streaming_request:
            return grpc.stream_stream_rpc_method_handler(streams, **kw)
        return grpc.unary_stream_rpc_method_handler(streams, **kw)
