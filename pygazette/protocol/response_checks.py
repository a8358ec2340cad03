"""Servers checking their own responses before sending them (`PYGAZETTE_CHECK_RESPONSES=1`).

`ResponseCheckInterceptor` is a `grpc.aio` server interceptor that validates every message a
`protocol.Journal` or `consumer.Shard` handler answers with Gazette's rules
(`validation`, `shard_validation`: the `Validate()` methods Gazette's clients apply to what
they receive), and the contracts that span a stream as Gazette's clients check them:

- Read: a response's offset is never before the reader's position (the requested offset,
  advanced by the content sent so far), as Gazette's Reader requires;
- List: a snapshot's first response is validated whole (status, header, journals); its later
  responses carry journals only (checked one by one), and an empty one ends a watch's snapshot.

A response that fails is not sent: the error is logged, with the response, and the RPC is
aborted INTERNAL ("response failed validation: ReadResponse: ..."), so that a test driving a
server into breaking an invariant fails, wherever the test looks. Brokers and consumers
install it when `response_checks_enabled()` (the test suite sets the variable); it costs a
full validation of each metadata response, so production servers run without it.

Handlers are wrapped once per method; methods without a validator (pygazette's own services)
pass untouched. A streaming handler must yield its responses (as every handler here does):
messages written with `context.write` are not seen.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import grpc.aio

from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.shard_validation import (
    validate_get_hints_response,
    validate_shard_apply_response,
    validate_shard_list_response,
    validate_stat_response,
    validate_unassign_response_status,
)
from pygazette.protocol.validation import (
    validate_append_response,
    validate_apply_response,
    validate_fragment_store_health_response,
    validate_fragments_response,
    validate_list_journals,
    validate_list_response,
    validate_read_response,
    validate_replicate_response,
    validate_whole_replicate_response,
)

__all__ = [
    "CHECK_RESPONSES_ENV",
    "ResponseCheckInterceptor",
    "StreamCheck",
    "response_checks_enabled",
]

if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[Any, Any]
    Handler = grpc.RpcMethodHandler[Any, Any]

log = logging.getLogger(__name__)

CHECK_RESPONSES_ENV = "PYGAZETTE_CHECK_RESPONSES"


def response_checks_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether `PYGAZETTE_CHECK_RESPONSES` asks servers to check their responses ("1")."""
    value = (os.environ if env is None else env).get(CHECK_RESPONSES_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class StreamCheck:
    """Checks the responses of one RPC in order; `check` raises `ValidationError`."""

    def __init__(self, request: Any) -> None:
        self.request = request

    def check(self, resp: Any) -> None:
        raise NotImplementedError


def _single(validate: Callable[[Any], None]) -> type[StreamCheck]:
    """A check of each response on its own."""

    class Single(StreamCheck):
        def check(self, resp: Any) -> None:
            validate(resp)

    return Single


class ReadCheck(StreamCheck):
    """Each ReadResponse valid, and none at an offset before the reader's position."""

    def __init__(self, request: Any) -> None:
        super().__init__(request)
        offset = request.offset if isinstance(request, pb.ReadRequest) else -1
        self.position = offset if offset >= 0 else -1

    def check(self, resp: pb.ReadResponse) -> None:
        validate_read_response(resp)
        if resp.status != pb.OK:
            return
        if self.position >= 0 and resp.offset < self.position:
            raise ValidationError(
                f"invalid ReadResponse offset ({resp.offset}; expected >= {self.position})"
            )
        self.position = resp.offset + len(resp.content)


class ListCheck(StreamCheck):
    """A snapshot's first ListResponse whole; its later ones (journals, or the empty response
    that ends a watch's snapshot) journal by journal."""

    def __init__(self, request: Any) -> None:
        super().__init__(request)
        self.first = True

    def check(self, resp: pb.ListResponse) -> None:
        if self.first:
            validate_list_response(resp)
            self.first = False
            return
        if _nonzero_header(resp) or resp.status != pb.OK:
            raise ValidationError("unexpected Header or Status within a snapshot")
        validate_list_journals(resp)
        if not resp.journals:
            self.first = True  # The end of a watch's snapshot: the next one starts.


def _nonzero_header(resp: pb.ListResponse) -> bool:
    """Whether a continuation ListResponse carries a header with anything in it. Gazette's
    Header is non-nullable, so its continuations (and pygazette's, `_list_chunk`) encode a
    zero-valued one; Gazette's client never looks at it."""
    if not resp.HasField("header"):
        return False
    h = resp.header
    return bool(
        h.process_id.zone
        or h.process_id.suffix
        or h.route.members
        or h.route.endpoints
        or h.route.primary
        or h.etcd.cluster_id
        or h.etcd.member_id
        or h.etcd.revision
        or h.etcd.raft_term
    )


J = "/protocol.Journal/"
S = "/consumer.Shard/"

# The checks of each method's responses, and the name of its response message.
CHECKS: dict[str, tuple[type[StreamCheck], str]] = {
    J + "Read": (ReadCheck, "ReadResponse"),
    J + "Append": (_single(validate_append_response), "AppendResponse"),
    "/pygazette.PeerJournal/AppendWhole": (_single(validate_append_response), "AppendResponse"),
    J + "Replicate": (_single(validate_replicate_response), "ReplicateResponse"),
    "/pygazette.PeerJournal/ReplicateWhole": (
        _single(validate_whole_replicate_response),
        "WholeReplicateResponse",
    ),
    J + "List": (ListCheck, "ListResponse"),
    J + "Apply": (_single(validate_apply_response), "ApplyResponse"),
    J + "ListFragments": (_single(validate_fragments_response), "FragmentsResponse"),
    J + "FragmentStoreHealth": (
        _single(validate_fragment_store_health_response),
        "FragmentStoreHealthResponse",
    ),
    S + "List": (_single(validate_shard_list_response), "ListResponse"),
    S + "Stat": (_single(validate_stat_response), "StatResponse"),
    S + "Apply": (_single(validate_shard_apply_response), "ApplyResponse"),
    S + "GetHints": (_single(validate_get_hints_response), "GetHintsResponse"),
    S + "Unassign": (_single(validate_unassign_response_status), "UnassignResponse"),
}


class ResponseCheckInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, type-arg]
    """Aborts an RPC INTERNAL instead of sending a response that breaks Gazette's rules.

    Put it last among a server's interceptors (innermost), so that it sees exactly what the
    handler answers.
    """

    def __init__(
        self,
        checks: Mapping[str, tuple[type[StreamCheck], str]] = CHECKS,
        *,
        logger: logging.Logger | None = None,
    ) -> None:
        self.checks = dict(checks)
        self.log = logger or log
        self.refused = 0  # Responses refused so far (for tests and the curious).
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # type: ignore[return-value]
        method: str = handler_call_details.method
        spec = self.checks.get(method)
        if spec is None:
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method, *spec)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Handler, method: str, check: type[StreamCheck], name: str) -> Handler:
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method, check, name), **kw
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, method, check, name), **kw
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, method, check, name), **kw
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, method, check, name), **kw
        )

    def _unary(
        self, behavior: Callable[..., Any], method: str, check: type[StreamCheck], name: str
    ) -> Callable[..., Any]:
        async def checked(request: Any, context: Context) -> Any:
            resp = await behavior(request, context)
            if resp is not None:
                await self._check(check(request), resp, method, name, context)
            return resp

        return checked

    def _streaming(
        self, behavior: Callable[..., Any], method: str, check: type[StreamCheck], name: str
    ) -> Callable[..., Any]:
        if not inspect.isasyncgenfunction(behavior):
            return self._unary(behavior, method, check, name)

        async def checked_gen(request: Any, context: Context) -> AsyncIterator[Any]:
            stream = check(request)
            responses = behavior(request, context)
            try:
                async for resp in responses:
                    await self._check(stream, resp, method, name, context)
                    yield resp
            finally:
                await responses.aclose()

        return checked_gen

    async def _check(
        self, stream: StreamCheck, resp: Any, method: str, name: str, context: Context
    ) -> None:
        try:
            stream.check(resp)
        except ValidationError as err:
            await self._refuse(method, f"{name}: {err}", resp, context)

    async def _refuse(self, method: str, error: str, resp: Any, context: Context) -> NoReturn:
        self.refused += 1
        self.log.error(
            "response failed validation (not sent)",
            extra={"method": method, "error": error, "response": _brief(resp)},
        )
        await context.abort(grpc.StatusCode.INTERNAL, f"response failed validation: {error}")
        raise AssertionError("not reached: abort raises")


def _brief(resp: Any, limit: int = 2000) -> str:
    """The response as text, content elided, at most `limit` characters."""
    if isinstance(resp, pb.ReadResponse) and resp.content:
        copy = pb.ReadResponse()
        copy.CopyFrom(resp)
        copy.content = f"<{len(resp.content)} bytes>".encode()
        resp = copy
    text = str(resp).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."
