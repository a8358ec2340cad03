"""The request guard: a `grpc.aio` server interceptor that answers bad input and handler
failures with a status, at the cost of at most one rate-limited log line.

Without it, a request whose bytes do not decode as the method's protobuf raises inside
grpc.aio's Cython server (the request deserializer runs there, before the handler, or in a
streaming handler's request iterator): the client gets `UNKNOWN` and the server's log a full
traceback at error level, for every call. With it:

- a unary request that fails to decode reaches no handler: the deserializer hands the guard a
  marker, which the guard answers `INVALID_ARGUMENT` ("<method>: malformed request: <decode
  error>");
- a message of a request stream that fails to decode ends the handler's request iterator
  with `MalformedRequest` (an ordinary exception, so the handler unwinds as from any failed
  stream and sees no message), and the call is answered `INVALID_ARGUMENT`;
- an unexpected exception escaping a handler is answered `INTERNAL`, and logged with its
  traceback; a failed peer call escaping one (`grpc.aio.AioRpcError`) passes its status on.

Each kind of event is logged once per key — the method, or (method, exception type) — then
counted: one summary line ("N more ... suppressed") per interval while it keeps happening.
The per-message cost on streams is one Python call around the protobuf decoder; handlers are
wrapped once per method, not per call. Put the guard first in a server's interceptor list, so
that the marker never reaches another interceptor's wrapper.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import grpc.aio

__all__ = ["DEFAULT_LOG_INTERVAL", "MalformedRequest", "RequestGuard"]

if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[Any, Any]
    Handler = grpc.RpcMethodHandler[Any, Any]

log = logging.getLogger(__name__)

# Seconds between log lines about the same kind of event.
DEFAULT_LOG_INTERVAL = 30.0


class MalformedRequest(Exception):
    """A message of a request stream did not decode; raised by the handler's request iterator."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"malformed request: {_describe(error)}")
        self.error = error


class _Undecodable:
    """What the guard's deserializer hands back for unary request bytes that do not decode."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


@dataclass(slots=True)
class _KeyState:
    quiet_until: float
    suppressed: int = 0
    flush: asyncio.TimerHandle | None = None


class _Throttle:
    """At most one line per key and interval: the first event of a quiet key is logged in
    full, later ones are counted and summarised in one line when the interval ends."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self.clock = clock
        self._keys: dict[Hashable, _KeyState] = {}

    def admit(self, key: Hashable, summarize: Callable[[int], None]) -> bool:
        """True: log this event in full. False: it was counted, for `summarize(count)`."""
        now = self.clock()
        state = self._keys.get(key)
        if state is None:
            self._keys[key] = _KeyState(now + self.interval)
            return True
        if state.suppressed == 0 and now >= state.quiet_until:
            state.quiet_until = now + self.interval
            return True
        state.suppressed += 1
        if state.flush is None:
            delay = max(0.0, state.quiet_until - now)
            state.flush = asyncio.get_running_loop().call_later(
                delay, self._flush, state, summarize
            )
        return False

    def _flush(self, state: _KeyState, summarize: Callable[[int], None]) -> None:
        count, state.suppressed, state.flush = state.suppressed, 0, None
        state.quiet_until = self.clock() + self.interval
        if count:
            summarize(count)


class RequestGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc, type-arg]
    """Answers undecodable requests INVALID_ARGUMENT and handler failures INTERNAL, with
    rate-limited logging (see the module docstring)."""

    def __init__(
        self,
        *,
        log_interval: float = DEFAULT_LOG_INTERVAL,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logger or log
        self._throttle = _Throttle(log_interval, clock)
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
        wrapped = self._wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    # Wrapping handlers.

    def _wrap(self, handler: Handler, method: str) -> Handler:
        decode = handler.request_deserializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method, check_request=decode is not None),
                request_deserializer=_unary_decoder(decode),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, method, check_request=decode is not None),
                request_deserializer=_unary_decoder(decode),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, method, check_request=False),
                request_deserializer=_stream_decoder(decode),
                response_serializer=handler.response_serializer,
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, method, check_request=False),
            request_deserializer=_stream_decoder(decode),
            response_serializer=handler.response_serializer,
        )

    def _unary(
        self, behavior: Callable[..., Any], method: str, *, check_request: bool
    ) -> Callable[..., Any]:
        async def guarded(request: Any, context: Context) -> Any:
            if check_request and type(request) is _Undecodable:
                await self._malformed(method, request.error, context)
            try:
                return await behavior(request, context)
            except grpc.aio.BaseError:
                raise  # An abort, or the call's end (client gone, server stopping): gRPC's.
            except Exception as exc:
                await self._failed(method, exc, context)

        return guarded

    def _streaming(
        self, behavior: Callable[..., Any], method: str, *, check_request: bool
    ) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):

            async def guarded_gen(request: Any, context: Context) -> AsyncIterator[Any]:
                if check_request and type(request) is _Undecodable:
                    await self._malformed(method, request.error, context)
                try:
                    async for response in behavior(request, context):
                        yield response
                except grpc.aio.BaseError:
                    raise
                except Exception as exc:
                    await self._failed(method, exc, context)

            return guarded_gen
        return self._unary(behavior, method, check_request=check_request)

    # Answering and logging.

    async def _malformed(self, method: str, error: Exception, context: Context) -> NoReturn:
        description = _describe(error)
        if self._throttle.admit(("malformed", method), self._malformed_summary(method)):
            self.log.warning(
                "malformed request",
                extra={"method": method, "peer": _peer(context), "error": description},
            )
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"{method}: malformed request: {description}"
        )
        raise AssertionError("not reached: abort raises")

    def _malformed_summary(self, method: str) -> Callable[[int], None]:
        def summarize(count: int) -> None:
            self.log.warning(
                f"{count} more malformed requests suppressed",
                extra={"method": method, "suppressed": count},
            )

        return summarize

    async def _failed(self, method: str, exc: Exception, context: Context) -> NoReturn:
        if isinstance(exc, MalformedRequest):
            await self._malformed(method, exc.error, context)
        if isinstance(exc, grpc.aio.AioRpcError):
            # A peer's call failed and the handler let it through: pass its status on.
            code, details = exc.code(), exc.details() or ""
            if self._throttle.admit(("peer", method, code), self._failed_summary(method, code)):
                self.log.warning(
                    "peer call failed",
                    extra={
                        "method": method,
                        "peer": _peer(context),
                        "code": code.name,
                        "error": _describe(exc),
                    },
                )
            await context.abort(code, details)
            raise AssertionError("not reached: abort raises")
        kind = type(exc).__name__
        if self._throttle.admit(("error", method, type(exc)), self._failed_summary(method, kind)):
            self.log.error(
                "unexpected error serving a request",
                exc_info=exc,
                extra={"method": method, "peer": _peer(context), "error_type": kind},
            )
        await context.abort(
            grpc.StatusCode.INTERNAL, f"{method}: internal error: {kind}: {_describe(exc)}"
        )
        raise AssertionError("not reached: abort raises")

    def _failed_summary(self, method: str, kind: object) -> Callable[[int], None]:
        name = kind.name if isinstance(kind, grpc.StatusCode) else str(kind)

        def summarize(count: int) -> None:
            self.log.error(
                f"{count} more {name} errors suppressed",
                extra={"method": method, "error_type": name, "suppressed": count},
            )

        return summarize


def _peer(context: Context) -> str:
    try:
        return str(context.peer())
    except Exception:  # The call is gone.
        return ""


def _unary_decoder(decode: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """The request deserializer of a unary request: a marker instead of an exception."""
    if decode is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as exc:
            return _Undecodable(exc)

    return deserialize


def _stream_decoder(decode: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """The request deserializer of a request stream: `MalformedRequest` ends the stream."""
    if decode is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as exc:
            raise MalformedRequest(exc) from None

    return deserialize
