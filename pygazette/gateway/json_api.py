"""Gazette's JSON REST API (its grpc-gateway), on a server's HTTP port.

    broker:    POST /v1/journals/list   Journal.List   (streamed)
               POST /v1/journals/read   Journal.Read   (streamed)
    consumer:  POST /v1/shards/list     Shard.List
               POST /v1/shards/stat     Shard.Stat

The request body is the RPC's request message in JSON, the response its response(s), byte
for byte as Gazette v0.103 writes them (`jsonpb`: gogo jsonpb with EmitDefaults, lowerCamelCase
names, 64-bit integers as strings, enums by name, bytes in base64). Each call is a gRPC call
to the server's own port, as Gazette's gateway calls its loopback connection: the same service
code and the same authorization serve it (an `Authorization` header is the call's
`authorization` metadata; `Grpc-Metadata-<Key>` headers are passed on as metadata `<key>`, and
`Grpc-Timeout` as the call's deadline).

What goes back, as grpc-gateway v1.16 writes it:

- a streamed RPC (List, Read): 200, `Content-Type: application/json`, chunked, one
  `{"result":<response>}` and a newline per response, written as each arrives, so that a
  blocking read or a watched listing streams for as long as the client keeps the request
  open (a client going away cancels the call). An RPC that fails ends the body with
  `{"error":{"grpcCode":…,"httpCode":…,"message":…,"httpStatus":…,"details":[]}}` (no
  newline); failing before any response, the HTTP status is the error's (UNAUTHENTICATED →
  401, NOT_FOUND → 404, UNAVAILABLE → 503, UNKNOWN → 500, … as `runtime.HTTPStatusFromCode`).
  The codes are those of Gazette's servers: a request the server's validation refuses
  (INVALID_ARGUMENT from pygazette's) is UNKNOWN → 500, and a token lacking a capability
  (PERMISSION_DENIED from pygazette's) UNAUTHENTICATED → 401, with the server's message.
- a unary RPC (Stat, shard List): 200 and the response, or the error as below.
- a request the gateway refuses itself: the status as `{"code":…,"message":…,"details":[]}`:
  a body that is not the request's JSON → 400 with Go's decoding error ("invalid character
  'x' looking for beginning of value", "json: cannot unmarshal string into Go value of type
  bool"); unknown fields are ignored, an empty body is an empty request; any other path
  under /v1/, or a method other than POST → 501 `{"code":12,"message":"Not
  Implemented","details":[]}`.
- A response that received the RPC's headers carries them as `Grpc-Metadata-<Key>` headers
  (`Grpc-Metadata-Content-Type: application/grpc`).

As Gazette's HTTP mux: `/v1` and unclean paths (`/v1//journals/list`) are redirected (307) to
their clean form; OPTIONS is answered 200 with an empty body (CORS preflight), and with
`allow_origins`, a request whose `Origin` is one of them gets `Access-Control-Allow-*`
headers (Gazette's `--broker.allow-origin` / `--consumer.allow-origin`; none by default).
"""

from __future__ import annotations

import base64
import binascii
import http
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import grpc
import grpc.aio
from aiohttp import web
from google.protobuf.message import Message

from pygazette.gateway.jsonpb import JsonError, decode, go_json_string, marshal
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = [
    "JOURNAL_METHODS",
    "SHARD_METHODS",
    "JsonApi",
    "Method",
    "clean_path",
    "end_with_trailers",
    "prepare_chunked",
    "redirect",
]


@dataclass(frozen=True)
class Method:
    """One RPC of the API: its HTTP path, gRPC method and messages."""

    path: str
    rpc: str
    request: type[Message]
    response: type[Message]
    streamed: bool


JOURNAL_METHODS = (
    Method("/v1/journals/list", "/protocol.Journal/List", pb.ListRequest, pb.ListResponse, True),
    Method("/v1/journals/read", "/protocol.Journal/Read", pb.ReadRequest, pb.ReadResponse, True),
)
SHARD_METHODS = (
    Method("/v1/shards/list", "/consumer.Shard/List", cpb.ListRequest, cpb.ListResponse, False),
    Method("/v1/shards/stat", "/consumer.Shard/Stat", cpb.StatRequest, cpb.StatResponse, False),
)

# runtime.HTTPStatusFromCode.
_HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 408,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}
# The codes pygazette's servers answer where Gazette's answer another: a request refused by
# validation (Gazette's handlers return a plain error: UNKNOWN) and a token lacking a
# capability (Gazette's verifier: UNAUTHENTICATED). The API answers Gazette's.
_GAZETTES_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.PERMISSION_DENIED: grpc.StatusCode.UNAUTHENTICATED,
}
JSON = "application/json"
_GRPC_TYPE = "application/grpc"
_CORS_METHODS = "GET, POST, OPTIONS"
_CORS_HEADERS = (
    "Cache-Control, Content-Language, Content-Length, Content-Type, Expires, Last-Modified, "
    "Pragma, Authorization"
)
_METADATA_PREFIX = "grpc-metadata-"
_TIMEOUT_NANOS = {"H": 3600 * 10**9, "M": 60 * 10**9, "S": 10**9, "m": 10**6, "u": 1000, "n": 1}
# Longer deadlines are as good as none (and more than gRPC's deadline arithmetic takes).
_MAX_DEADLINE = 10.0**8
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


class _Refused(Exception):
    """A request refused before its RPC starts: answered with a Status body."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _overridden(request: web.Request) -> bool:
    """Whether the request's method is overridden (`X-HTTP-Method-Override` on a POST of a
    form, grpc-gateway's "path length fallback")."""
    return bool(
        request.method == "POST"
        and request.headers.get("X-HTTP-Method-Override")
        and request.headers.get("Content-Type") == "application/x-www-form-urlencoded"
    )


def _status_body(code: grpc.StatusCode, message: str) -> bytes:
    """A google.rpc.Status as the gateway's DefaultHTTPProtoErrorHandler writes it."""
    return f'{{"code":{code.value[0]},"message":{go_json_string(message)},"details":[]}}'.encode()


def _stream_error(code: grpc.StatusCode, message: str) -> tuple[int, bytes]:
    """The HTTP status and the `{"error": …}` chunk that ends a streamed response."""
    status = _HTTP_STATUS.get(code, 500)
    body = (
        f'{{"error":{{"grpcCode":{code.value[0]},"httpCode":{status},'
        f'"message":{go_json_string(message)},'
        f'"httpStatus":{go_json_string(http.HTTPStatus(status).phrase)},"details":[]}}}}'
    )
    return status, body.encode()


def _canonical(key: str) -> str:
    """Go's textproto.CanonicalMIMEHeaderKey (of a valid token)."""
    return "-".join(part[:1].upper() + part[1:].lower() for part in key.split("-"))


def clean_path(path: str) -> str:
    """Go's ServeMux cleanPath: path.Clean, keeping a trailing slash."""
    if not path.startswith("/"):
        path = "/" + path
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    clean = "/" + "/".join(parts)
    if path.endswith("/") and clean != "/":
        clean += "/"
    return clean


def _grpc_timeout(value: str) -> float | None:
    """Seconds of a `Grpc-Timeout` header ("<integer><unit>"), as grpc-gateway's
    timeoutDecode reads it (0: no deadline). A deadline already past (at most a microsecond:
    gone before Go's client starts the call) fails the request as Go's client fails it."""
    digits, unit = value[:-1], value[-1:]
    if (
        len(value) < 2
        or unit not in _TIMEOUT_NANOS
        or not re.fullmatch(r"[+-]?[0-9]+", digits)
        or not -(1 << 63) <= int(digits) < 1 << 63
    ):
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"invalid grpc-timeout: {value}")
    # Go's int64 nanoseconds, overflow and all.
    nanos = (int(digits) * _TIMEOUT_NANOS[unit] + (1 << 63)) % (1 << 64) - (1 << 63)
    if nanos == 0:
        return None
    if nanos <= 1000:
        raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "context deadline exceeded")
    return min(nanos / 1e9, _MAX_DEADLINE)


def _call_options(request: web.Request) -> tuple[list[tuple[str, str | bytes]], float | None]:
    """The call's metadata and timeout from the HTTP request (grpc-gateway's AnnotateContext,
    less the `grpcgateway-*` and `x-forwarded-*` entries it adds for a server's information)."""
    metadata: list[tuple[str, str | bytes]] = []
    timeout = None
    for key, value in request.headers.items():
        lower = key.lower()
        if lower == "grpc-timeout":
            timeout = _grpc_timeout(value)
        elif lower == "authorization":
            metadata.append(("authorization", value))
        elif lower.startswith(_METADATA_PREFIX) and len(lower) > len(_METADATA_PREFIX):
            name = lower[len(_METADATA_PREFIX) :]
            if name.endswith("-bin"):
                try:
                    padded = value + "=" * (-len(value) % 4) if len(value) % 4 else value
                    metadata.append((name, base64.b64decode(padded, validate=True)))
                except (binascii.Error, ValueError) as exc:
                    raise _Refused(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"invalid binary header {_canonical(key)}: {_base64_error(value, exc)}",
                    ) from None
            elif _METADATA_KEY.fullmatch(name):
                metadata.append((name, value))
    for name, item in metadata:
        if isinstance(item, str) and not _PRINTABLE.fullmatch(item):
            # What grpc-go's client answers (gRPC metadata holds printable ASCII only).
            raise _Refused(
                grpc.StatusCode.INTERNAL,
                f"header key {go_json_string(name)} contains value with non-printable ASCII "
                "characters",
            )
    return metadata, timeout


def _base64_error(value: str, _exc: Exception) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
    for i, ch in enumerate(value):
        if ch not in alphabet:
            return f"illegal base64 data at input byte {i}"
    return f"illegal base64 data at input byte {len(value)}"


def _metadata_headers(initial: Any) -> list[tuple[str, str]]:
    """The RPC's response headers as grpc-gateway forwards them: `Grpc-Metadata-<Key>`
    (content-type first: gRPC's own, which grpc-go's client lists among them)."""
    headers = [("Grpc-Metadata-Content-Type", _GRPC_TYPE)]
    for key, value in initial or ():
        if key.endswith("-bin") or key == "content-type":
            continue
        headers.append(("Grpc-Metadata-" + _canonical(key), str(value)))
    return headers


class JsonApi:
    """The API's routes over `channel` (a gRPC channel to the server's own port)."""

    def __init__(
        self,
        channel: Callable[[], grpc.aio.Channel] | grpc.aio.Channel,
        methods: Sequence[Method],
        *,
        allow_origins: Sequence[str] = (),
    ) -> None:
        self._channel = channel
        self.methods = {m.path: m for m in methods}
        self.allow_origins = tuple(allow_origins)

    @property
    def channel(self) -> grpc.aio.Channel:
        if callable(self._channel):
            return self._channel()
        return self._channel

    def routes(self) -> list[web.RouteDef]:
        """Routes for /v1 and everything under it (add them before a catch-all)."""
        return [
            web.route("*", "/v1", self.handle),
            web.route("*", "/v1/{rest:.*}", self.handle),
        ]

    def _cors(self, request: web.Request) -> dict[str, str]:
        origin = request.headers.get("Origin", "")
        if origin and origin in self.allow_origins:
            return {
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": _CORS_METHODS,
                "Access-Control-Allow-Headers": _CORS_HEADERS,
            }
        return {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        clean = "/v1/" if path == "/v1" else clean_path(path)
        if clean != path:
            return redirect(request, clean)
        cors = self._cors(request)
        if request.method == "OPTIONS":
            return web.Response(status=200, headers=cors)
        method = self._match(request)
        try:
            if method is None:
                raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "Not Implemented")
            metadata, timeout = _call_options(request)
            body = await request.read()
            if _overridden(request):
                body = b""  # Go's ParseForm has read the form body: an empty request.
            req = method.request()
            try:
                decode(body, req)
            except JsonError as exc:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except _Refused as exc:
            return web.Response(
                status=_HTTP_STATUS.get(exc.code, 500),
                body=_status_body(exc.code, exc.message),
                headers={"Content-Type": JSON, **cors},
            )
        if method.streamed:
            return await self._streamed(request, method, req, metadata, timeout, cors)
        return await self._unary(request, method, req, metadata, timeout, cors)

    def _match(self, request: web.Request) -> Method | None:
        verb = request.method
        if _overridden(request):
            verb = request.headers["X-HTTP-Method-Override"].upper()
        if verb != "POST":
            return None  # Gazette's API has POST methods only (others: 501).
        last = posixpath.basename(request.path)
        if ":" in last:
            return None  # A custom verb (none is defined).
        return self.methods.get(request.path)

    async def _streamed(
        self,
        request: web.Request,
        method: Method,
        req: Message,
        metadata: list[tuple[str, str | bytes]],
        seconds: float | None,
        cors: dict[str, str],
    ) -> web.StreamResponse:
        call = self.channel.unary_stream(
            method.rpc,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )(req, metadata=metadata, timeout=seconds)
        resp: web.StreamResponse | None = None
        try:
            try:
                async for msg in call:
                    if resp is None:
                        headers = {"Content-Type": JSON, **cors}
                        resp = web.StreamResponse(status=200, headers=headers)
                        for key, value in _metadata_headers(await call.initial_metadata()):
                            resp.headers.add(key, value)
                        await prepare_chunked(request, resp)
                    await resp.write(b'{"result":' + marshal(msg) + b"}\n")
            except grpc.aio.AioRpcError as exc:
                status, chunk = _stream_error(_code(exc), _message(exc, seconds))
                if resp is None:
                    resp = web.StreamResponse(status=status, headers={"Content-Type": JSON, **cors})
                    await prepare_chunked(request, resp)
                await resp.write(chunk)
            if resp is None:  # The RPC ended without a response.
                resp = web.StreamResponse(status=200, headers={"Content-Type": JSON, **cors})
                await prepare_chunked(request, resp)
            await resp.write_eof()
            return resp
        finally:
            call.cancel()  # The client went away mid-stream (its handler cancelled): end the RPC.

    async def _unary(
        self,
        request: web.Request,
        method: Method,
        req: Message,
        metadata: list[tuple[str, str | bytes]],
        seconds: float | None,
        cors: dict[str, str],
    ) -> web.StreamResponse:
        call = self.channel.unary_unary(
            method.rpc,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )(req, metadata=metadata, timeout=seconds)
        try:
            msg = await call
        except grpc.aio.AioRpcError as exc:
            code = _code(exc)
            # A failed unary call ends trailers-only: grpc-go's client has gRPC's content-type
            # in its trailers, which grpc-gateway sends as HTTP trailers.
            resp = web.StreamResponse(
                status=_HTTP_STATUS.get(code, 500),
                headers={"Content-Type": JSON, "Trailer": "Grpc-Trailer-Content-Type", **cors},
            )
            await prepare_chunked(request, resp)
            await resp.write(_status_body(code, _message(exc, seconds)))
            await end_with_trailers(request, resp, [("Grpc-Trailer-Content-Type", _GRPC_TYPE)])
            return resp
        finally:
            call.cancel()
        resp = web.Response(status=200, body=marshal(msg), headers={"Content-Type": JSON, **cors})
        for key, value in _metadata_headers(await call.initial_metadata()):
            resp.headers.add(key, value)
        return resp


async def prepare_chunked(request: web.Request, resp: web.StreamResponse) -> None:
    """Send `resp`'s headers for a body of unknown length: chunked (HTTP/1.1), else ended by
    closing the connection (HTTP/1.0, as Go's net/http does)."""
    if request.version >= (1, 1):
        resp.enable_chunked_encoding()
    await resp.prepare(request)


def trailer_value(value: str) -> str:
    """`value` as Go's net/http writes a header value: line breaks become spaces (a message
    of several lines must not end the trailer block or forge another field), then trimmed."""
    return value.replace("\r", " ").replace("\n", " ").strip(" \t")


async def end_with_trailers(
    request: web.Request, resp: web.StreamResponse, trailers: list[tuple[str, str]]
) -> None:
    """End a chunked response with HTTP trailers (aiohttp writes none of its own: the last
    chunk is written here, the writer's chunking turned off for it)."""
    writer: Any = request.writer
    if not writer.chunked:  # HTTP/1.0: no trailers.
        await resp.write_eof()
        return
    writer.chunked = False
    last = (
        b"0\r\n"
        + b"".join(f"{k}: {trailer_value(v)}\r\n".encode() for k, v in trailers)
        + b"\r\n"
    )
    await writer.write(last)
    await resp.write_eof()


def _code(exc: grpc.aio.AioRpcError) -> grpc.StatusCode:
    """The failed call's code, as Gazette's server would have answered it."""
    code = exc.code()
    return _GAZETTES_CODE.get(code, code)


def _message(exc: grpc.aio.AioRpcError, seconds: float | None) -> str:
    """The failed call's message (a `Grpc-Timeout` expiring reads as Go's context's error)."""
    if seconds is not None and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "context deadline exceeded"
    return exc.details() or ""


def redirect(request: web.Request, path: str) -> web.Response:
    """Go's ServeMux redirect of an unclean path to `path` (307, as Go's http.Redirect writes
    it: the path escaped as url.URL writes it, the raw query kept)."""
    query = request.rel_url.raw_query_string
    location = quote(path, safe="/$&+,:;=@") + (f"?{query}" if query else "")
    headers = {"Location": location}
    body = b""
    if request.method in ("GET", "HEAD"):
        headers["Content-Type"] = "text/html; charset=utf-8"
    if request.method == "GET":
        href = (
            location.replace("&", "&amp;")
            .replace("<", "&lt;")
            .replace(">", "&gt;")
            .replace('"', "&#34;")
            .replace("'", "&#39;")
        )
        body = f'<a href="{href}">Temporary Redirect</a>.\n\n'.encode()
    return web.Response(status=307, body=body, headers=headers)
