"""Sending on a client-streaming gRPC call without losing the server's status.

When a server ends a stream (a refused Append, a replica out of disk) while the client is
writing to it, grpc-python's `grpc.aio` write fails inside gRPC's core, and the call then
records its *own* status, INTERNAL "Internal error from Core", in place of the server's:
measured, the client saw INTERNAL in 140 of 200 such races. `send` writes the message the
same way but leaves the call's status alone, so that awaiting the call (or `call.code()`)
gives the server's status, as gRPC's Go client gives it.

A call made through client interceptors (an authorizing channel's) relays its writes to an
inner call through a task of gRPC's own: `send` gives that inner call the same write. Both
rely on `grpc.aio`'s call internals (grpcio 1.60 to 1.85 have them); a call without them is
written with `call.write`, race and all.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterable
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message
from grpc._cython import cygrpc  # type: ignore[attr-defined]

# Marks an inner call whose writes keep its status (see `_keep_status`).
_KEEPS_STATUS = "_pygazette_keeps_status"


class CallEnded(Exception):
    """The call ended before the message could be sent: the call's status says why."""


def _plain(call: Any) -> bool:
    return (
        hasattr(call, "_cython_call")
        and hasattr(call, "_metadata_sent")
        and hasattr(call, "_done_writing_flag")
    )


async def send(call: Any, message: Message, *, buffered: bool = False) -> None:
    """Send `message` on `call` (a stream-unary or stream-stream call), or raise CallEnded
    if the call has ended (await the call, or its `code()`, for the server's status).

    With `buffered`, gRPC may hold the message back until the next one is sent (the write
    flag `GRPC_WRITE_BUFFER_HINT`): for a message with another already due behind it, so
    that both go out in one write. Only a call without interceptors takes the hint."""
    if not _plain(call):
        inner = await _inner_call(call)
        if inner is not None:
            _keep_status(inner)
        try:
            await call.write(message)
        except asyncio.InvalidStateError as exc:
            raise CallEnded(str(exc)) from None
        return
    if call.done() or call._done_writing_flag:
        raise CallEnded("the call already ended, or was half-closed")
    if not call._metadata_sent.is_set():
        await call._metadata_sent.wait()
        if call.done():
            raise CallEnded("the call already ended")
    try:
        if buffered and _BUFFER_HINT is not None:
            await _send_buffered(call._cython_call, message.SerializeToString())
        else:
            await call._cython_call.send_serialized_message(message.SerializeToString())
    except cygrpc.InternalError:
        # The call ended in gRPC's core; its status (the server's) is on its way.
        raise CallEnded("the call ended while the message was being sent") from None
    except asyncio.CancelledError:
        if not call.cancelled():
            call.cancel()
        raise


# `grpc.aio`'s own send with a write flag (`_send_message(call, message, initial_metadata_op,
# write_flag, loop)`, which `send_serialized_message` calls with flag 0, as grpcio 1.85 has
# it); where it is not so, `buffered` is ignored.
_BUFFER_HINT: int | None = None
_cy_send: Any = getattr(cygrpc, "_send_message", None)
_flags = getattr(cygrpc, "WriteFlag", None)
_code = getattr(_cy_send, "__code__", None)
if (
    _code is not None
    and _code.co_varnames[: _code.co_argcount]
    == ("grpc_call_wrapper", "message", "send_initial_metadata_op", "write_flag", "loop")
    and hasattr(_flags, "buffer_hint")
):
    _BUFFER_HINT = int(_flags.buffer_hint)  # type: ignore[union-attr]


async def _send_buffered(cython_call: Any, data: bytes) -> None:
    await _cy_send(cython_call, data, None, _BUFFER_HINT, asyncio.get_running_loop())


async def send_all(call: Any, messages: AsyncIterable[Message]) -> None:
    """Send every message of `messages` on `call` with `send`, then half-close it; stop
    quietly if the call ends first (await the call for the server's answer or status)."""
    try:
        async for message in messages:
            await send(call, message)
        await call.done_writing()
    except CallEnded:
        pass  # The server answered already.


async def _inner_call(call: Any) -> Any:
    """The call an intercepted call relays to (None: not intercepted, or it failed)."""
    task = getattr(call, "_interceptors_task", None)
    if not isinstance(task, asyncio.Future):
        return None
    if not task.done():
        await asyncio.wait([task])  # Our cancellation is ours: it doesn't cancel the task.
    if task.cancelled() or task.exception() is not None:
        return None
    inner = task.result()
    return inner if _plain(inner) and hasattr(inner, "_write") else None


def _keep_status(inner: Any) -> None:
    """Have the inner call's request consumer write as `send` does: when the call ended, it
    stops (gRPC's consumer takes an AioRpcError for that) and the status stays the server's."""
    if getattr(inner, _KEEPS_STATUS, False):
        return

    async def write(self: Any, request: Message) -> None:
        try:
            await send(self, request)
        except CallEnded as exc:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNKNOWN, grpc.aio.Metadata(), grpc.aio.Metadata(), str(exc), None
            ) from None

    inner._write = types.MethodType(write, inner)
    setattr(inner, _KEEPS_STATUS, True)
