"""The server side of authorization: a `grpc.aio` interceptor that verifies every RPC's
`authorization` metadata before its handler runs.

The capability a method requires comes from `rpc_claims.REQUIRED_CAPABILITY` (methods not
listed there require ALL). A missing, malformed, expired or wrongly signed token is refused
with UNAUTHENTICATED, one lacking the capability with PERMISSION_DENIED (Gazette's messages,
e.g. "authorization is missing required APPEND capability"); the handler never runs. The
verified claims are set for the handler's task (`verified_claims.current_claims`).

A token is honoured for as long as it is valid, not only when the RPC starts: as Gazette
binds the claims' expiry to the RPC's deadline, an RPC still running when its token expires
(past the verifier's clock-skew leeway) ends: a Read or a List (a blocking read, a watch) as
Gazette's handlers end them at their deadline, its stream closed without an error (Gazette's
RetryReader resumes one quietly), any other with DEADLINE_EXCEEDED. A long read or a
replication stream so comes back with a fresh token (the client libraries retry those).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import grpc.aio

from pygazette.auth.authorizer import AUTHORIZATION
from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims
from pygazette.auth.keyed_auth import AuthRefused
from pygazette.auth.rpc_claims import REQUIRED_CAPABILITY
from pygazette.auth.verified_claims import set_current_claims

__all__ = ["AuthServerInterceptor", "Verifier"]

if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[Any, Any]
    Handler = grpc.RpcMethodHandler[Any, Any]


class Verifier(Protocol):
    # Seconds past a token's expiry it is still accepted (clock skew between processes).
    leeway: float

    def verify(self, authorization: str | None, require: int) -> Claims: ...


EXPIRED = "authorization expired while the RPC was running"
# Streams whose Gazette handlers suppress their context's deadline (SuppressCancellationError):
# they end cleanly when their token expires.
ENDED_CLEANLY_AT_EXPIRY = frozenset(["/protocol.Journal/Read", "/protocol.Journal/List"])


def _authorization(context: Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION:
            return value if isinstance(value, str) else None
    return None


class AuthServerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, type-arg]
    def __init__(
        self, verifier: Verifier, required: Mapping[str, int] = REQUIRED_CAPABILITY
    ) -> None:
        self.verifier = verifier
        self.required = dict(required)
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:  # An unknown method: gRPC answers UNIMPLEMENTED.
            return handler  # type: ignore[return-value]
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(
            handler,
            self.required.get(method, int(Capability.ALL)),
            clean_expiry=method in ENDED_CLEANLY_AT_EXPIRY,
        )
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    async def _check(self, context: Context, require: int) -> float | None:
        """Verify the RPC's token; the loop time its claims expire at (None: never)."""
        try:
            claims = self.verifier.verify(_authorization(context), require)
        except AuthRefused as exc:
            code = (
                grpc.StatusCode.UNAUTHENTICATED
                if exc.unauthenticated
                else grpc.StatusCode.PERMISSION_DENIED
            )
            await context.abort(code, str(exc))
            raise  # Not reached: abort raises.
        set_current_claims(claims)
        if claims.expires_at is None:
            return None
        remaining = claims.expires_at + self.verifier.leeway - time.time()
        return asyncio.get_running_loop().time() + remaining

    def _wrap(self, handler: Handler, require: int, *, clean_expiry: bool = False) -> Handler:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, require),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, require, clean_expiry),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, require),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, require),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _unary(self, behavior: Callable[..., Any], require: int) -> Callable[..., Any]:
        async def verified(request: Any, context: Context) -> Any:
            deadline = await self._check(context, require)
            if deadline is None:
                return await behavior(request, context)
            expiry = asyncio.timeout_at(deadline)
            try:
                async with expiry:
                    return await behavior(request, context)
            except TimeoutError:
                if not expiry.expired():
                    raise  # The handler's own.
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED)

        return verified

    def _streaming(
        self, behavior: Callable[..., Any], require: int, clean_expiry: bool = False
    ) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):

            async def verified_gen(request: Any, context: Context) -> AsyncIterator[Any]:
                deadline = await self._check(context, require)
                responses = behavior(request, context)
                if deadline is None:
                    async for resp in responses:
                        yield resp
                    return
                # The deadline bounds the handler's work for each response (where it waits:
                # a read at the journal's head, say), never a yield: the task is gRPC's then.
                try:
                    while True:
                        expiry = asyncio.timeout_at(deadline)
                        try:
                            async with expiry:
                                resp = await anext(responses)
                        except StopAsyncIteration:
                            return
                        except TimeoutError:
                            if not expiry.expired():
                                raise  # The handler's own.
                            if clean_expiry:
                                return  # The stream ends, as Gazette's Read and List do.
                            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED)
                        yield resp
                finally:
                    await responses.aclose()

            return verified_gen

        return self._unary(behavior, require)
