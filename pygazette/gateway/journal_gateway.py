"""The HTTP journal gateway: Gazette's `http_gateway` semantics over a broker's gRPC port.

    GET  /<journal>?offset=N&block=true   Read RPC; 206 and the content, streamed
    HEAD /<journal>?offset=N              Read RPC with metadata_only; 206, headers only
    PUT  /<journal>                       Append RPC with the request body; 204

It is a gRPC client of a broker (normally its own process's port, so proxying to a journal's
primary, authorization and every check happen in the broker): `JournalClient` is handed in.
An HTTP `Authorization` header is forwarded as the `authorization` metadata of the RPC (one
that gRPC metadata cannot carry, not printable ASCII, is answered 401).

Responses carry Gazette's headers: `X-Route-Token` (the journal's route) and `Location` (the
journal at its primary broker); for reads `Content-Range: bytes <offset>-<MaxInt64>/<MaxInt64>`,
`X-Write-Head`, `X-Fragment-Name`, `X-Fragment-Location` (a fragment URL, when the broker gave
one) and `X-Fragment-Last-Modified`; for appends `X-Commit-Begin`, `X-Commit-End`,
`X-Commit-SHA1-Sum` and `X-Write-Head`. Response statuses map as Gazette maps them: a read's
OK → 206, JOURNAL_NOT_FOUND → 404, OFFSET_NOT_YET_AVAILABLE → 416, INSUFFICIENT_JOURNAL_BROKERS
→ 503, any other status → 500 with its name as the body; an append's OK → 204, any other
status → 500 with the error Gazette's client.Appender returns (JOURNAL_NOT_FOUND too); a
malformed request → 400 with gorilla/schema's or net/url's message; an unclean path (`//a/b`,
`a/./b`, `a/../b`) → 307 to its clean form, as Go's ServeMux answers it. Errors are written as
Go's http.Error writes them (`X-Content-Type-Options: nosniff`). Where Gazette answers a failed RPC
with 500, the gateway maps the gRPC code: UNAUTHENTICATED → 401, PERMISSION_DENIED → 403,
UNAVAILABLE → 503, INVALID_ARGUMENT → 400, DEADLINE_EXCEEDED → 408, the rest → 500 (Gazette's
gateway signs its RPCs with the broker's own key, whatever the request's `Authorization`, so
its answers never refuse one). A broker response that breaks Gazette's rules
(`client.response_check`) is 502, or ends a GET's streamed content.

A GET streams: each content chunk is written to the client as the broker sends it, and the
read follows the journal across fragments; it ends when the broker ends the stream (a
non-blocking read at the write head, the client going away, or a jump in offsets, which,
as in Gazette, ends the response and leaves the client to retry from where it got to). As
Gazette's (Go's net/http), the headers go with the first content, its `Content-Type` sniffed
from its first bytes (`sniff.detect_content_type`: text/plain, text/html, … or
application/octet-stream), and the `X-Close-Error` trailer says why the content ended
(`OFFSET_NOT_YET_AVAILABLE`, `offset jump`, `broker terminated RPC`, a gRPC error). A HEAD's 206
has no Content-Type.

A PUT is one atomic append: the body is streamed into the Append RPC in chunks as it
arrives, and commits only once all of it has; a client that goes away mid-body leaves
nothing appended. With `max_append_bytes`, larger bodies are refused with 413 (before any
byte is appended when the request declares its Content-Length).
"""

from __future__ import annotations

import email.utils
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from aiohttp import web

from pygazette.client.errors import InvalidResponse
from pygazette.client.journal_client import JournalClient
from pygazette.client.response_check import check_read_response, check_response
from pygazette.gateway.json_api import clean_path, end_with_trailers, prepare_chunked, redirect
from pygazette.gateway.jsonpb import go_quote
from pygazette.gateway.sniff import SNIFF_LEN, detect_content_type
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.fragment_name import fragment_file_name, sha1sum_to_hex
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.stream_write import send_all
from pygazette.protocol.validation import (
    validate_append_request,
    validate_append_response,
    validate_read_request,
)

log = logging.getLogger(__name__)

MAX_INT64 = (1 << 63) - 1
# Body bytes gathered into one AppendRequest chunk (aiohttp hands them over in small pieces).
APPEND_CHUNK = 1 << 20

FRAGMENT_LAST_MODIFIED_HEADER = "X-Fragment-Last-Modified"
FRAGMENT_LOCATION_HEADER = "X-Fragment-Location"
FRAGMENT_NAME_HEADER = "X-Fragment-Name"
ROUTE_TOKEN_HEADER = "X-Route-Token"
WRITE_HEAD_HEADER = "X-Write-Head"
CLOSE_ERROR_HEADER = "X-Close-Error"
BROKER_TERMINATED = "broker terminated RPC"
COMMIT_BEGIN_HEADER = "X-Commit-Begin"
COMMIT_END_HEADER = "X-Commit-End"
COMMIT_SUM_HEADER = "X-Commit-SHA1-Sum"

_READ_STATUS = {
    pb.JOURNAL_NOT_FOUND: 404,
    pb.INSUFFICIENT_JOURNAL_BROKERS: 503,
    pb.OFFSET_NOT_YET_AVAILABLE: 416,
}
_GRPC_STATUS = {
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 408,
}
# What Go's strconv.ParseInt takes in base 10 (Python's int() takes more: "1_0", " 5", other
# scripts' digits).
_DECIMAL = re.compile(r"[+-]?[0-9]+")
# strconv.ParseBool's, and gorilla/schema's "on".
_TRUE = {"1", "t", "T", "TRUE", "true", "True", "on"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_HEX = frozenset(b"0123456789abcdefABCDEF")


class BadRequest(ValueError):
    pass


class AppendTooLarge(Exception):
    pass


def _error(status: int, text: str) -> web.Response:
    """An error as Go's http.Error writes it."""
    return web.Response(
        status=status, text=text + "\n", headers={"X-Content-Type-Options": "nosniff"}
    )


def _read_status_error(resp: pb.ReadResponse) -> str:
    """The error Gazette's client.Reader returns for a response's non-OK status."""
    return pb.Status.Name(resp.status)


def _append_status_error(resp: pb.AppendResponse) -> str:
    """The error Gazette's client.Appender returns for a response's non-OK status."""
    name = pb.Status.Name(resp.status)
    if resp.status == pb.FRAGMENT_STORE_UNHEALTHY:
        return f"{resp.store_health_error}: {name}"  # errors.WithMessage.
    return name


def go_rpc_error(exc: grpc.aio.AioRpcError) -> str:
    """A failed call's error as grpc-go writes it ("rpc error: code = … desc = …")."""
    code = exc.code()
    name = "Canceled" if code == grpc.StatusCode.CANCELLED else code.name.title().replace("_", "")
    return f"rpc error: code = {name} desc = {exc.details() or ''}"


def _rpc_error(exc: grpc.aio.AioRpcError) -> web.Response:
    return _error(_GRPC_STATUS.get(exc.code(), 500), exc.details() or exc.code().name)


class Unauthorized(ValueError):
    """An Authorization header the gateway cannot forward (answered 401, no RPC started)."""


# What a gRPC metadata value may hold: printable ASCII.
_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")


def _metadata(request: web.Request) -> tuple[tuple[str, str], ...] | None:
    """The RPC's metadata: the request's `Authorization`, if it has one (Unauthorized if gRPC
    cannot carry it: no token holds other than printable ASCII)."""
    token = request.headers.get("Authorization")
    if not token:
        return None
    if not _METADATA_VALUE.fullmatch(token):
        raise Unauthorized(
            "invalid Authorization header (it holds characters other than printable ASCII)"
        )
    return (("authorization", token),)


def _unescape(text: str) -> str:
    """Go's url.QueryUnescape (BadRequest with its EscapeError's message)."""
    data = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(data):
        c = data[i]
        if c == 0x25:  # '%'
            pair = data[i + 1 : i + 3]
            if len(pair) < 2 or not all(b in _HEX for b in pair):
                raise BadRequest(f"invalid URL escape {go_quote(data[i : i + 3])}")
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if c == 0x2B else c)  # '+' is a space.
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _parse_query(raw: str) -> dict[str, list[str]]:
    """Go's url.ParseQuery of a raw query string (BadRequest with its first error)."""
    values: dict[str, list[str]] = {}
    error: str | None = None
    for part in raw.split("&"):
        if ";" in part:
            error = "invalid semicolon separator in query"
            continue
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            key, value = _unescape(key), _unescape(value)
        except BadRequest as exc:
            error = error or str(exc)
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise BadRequest(error)
    return values


def _schema_error(errors: list[str]) -> BadRequest:
    """gorilla/schema's MultiError of `errors` (one of them, and how many others)."""
    others = len(errors) - 1
    if others == 0:
        return BadRequest(errors[0])
    return BadRequest(f"{errors[0]} (and {others} other error{'s' if others > 1 else ''})")


def _decode_query(
    request: web.Request, fields: tuple[str, ...], errors: list[str]
) -> dict[str, tuple[str, str]]:
    """The query's (name, value) of each of `fields` it gives, as gorilla/schema decodes a query
    into a struct: names matched case-insensitively, the last value of a name taken, an empty
    one left out (the field keeps its zero value); any other name is an error (added to
    `errors`)."""
    decoded: dict[str, tuple[str, str]] = {}
    for key, values in _parse_query(request.rel_url.raw_query_string).items():
        field = key.lower()
        if field not in fields:
            errors.append(f"schema: invalid path {_quoted(key)}")
        elif values[-1]:
            decoded[field] = (key, values[-1])
    return decoded


def _quoted(text: str) -> str:
    return go_quote(text.encode("utf-8", "surrogateescape"))


def parse_read_request(request: web.Request) -> pb.ReadRequest:
    """The ReadRequest of a GET or HEAD, as Gazette's gateway decodes it (BadRequest with its
    message if not)."""
    offset, block = 0, False
    errors: list[str] = []
    query = _decode_query(request, ("offset", "block"), errors)
    if "offset" in query:
        key, value = query["offset"]
        if _DECIMAL.fullmatch(value) and -(1 << 63) <= int(value) <= MAX_INT64:
            offset = int(value)
        else:
            errors.append(f"schema: error converting value for {_quoted(key)}")
    if "block" in query:
        key, value = query["block"]
        if value in _TRUE:
            block = True
        elif value not in _FALSE:
            errors.append(f"schema: error converting value for {_quoted(key)}")
    if errors:
        raise _schema_error(errors)
    req = pb.ReadRequest(
        journal=request.path[1:],
        offset=offset,
        block=block,
        metadata_only=request.method == "HEAD",
    )
    try:
        validate_read_request(req)
    except ValidationError as exc:
        raise BadRequest(str(exc)) from exc
    return req


def parse_append_request(request: web.Request) -> pb.AppendRequest:
    errors: list[str] = []
    _decode_query(request, (), errors)
    if errors:
        raise _schema_error(errors)
    req = pb.AppendRequest(journal=request.path[1:])
    try:
        validate_append_request(req)
    except ValidationError as exc:
        raise BadRequest(str(exc)) from exc
    return req


_GO_ESCAPES = {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    ord('"'): '\\"',
    ord("\\"): "\\\\",
}


def _go_quoted(value: str) -> str:
    """`value` as Go's protobuf text marshaller quotes a string (byte by byte, UTF-8)."""
    out = []
    for byte in value.encode():
        if byte in _GO_ESCAPES:
            out.append(_GO_ESCAPES[byte])
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def route_token(route: pb.Route) -> str:
    """The `X-Route-Token` of `route`, as Gazette's gateway writes it: gogo/protobuf's
    `proto.CompactTextString` of the Route (proto3: a zero primary is left out), less the
    trailing space Go's net/http trims from a header value."""
    parts = [
        f"members:<zone:{_go_quoted(m.zone)} suffix:{_go_quoted(m.suffix)} >" for m in route.members
    ]
    if route.primary:
        parts.append(f"primary:{route.primary}")
    parts += [f"endpoints:{_go_quoted(e)}" for e in route.endpoints]
    return " ".join(parts)


def _add_route_headers(resp: web.StreamResponse, request: web.Request, header: pb.Header) -> None:
    route = header.route
    if not route.members:
        return
    resp.headers[ROUTE_TOKEN_HEADER] = route_token(route)
    if 0 <= route.primary < len(route.endpoints):
        base = route.endpoints[route.primary].rstrip("/")
        resp.headers["Location"] = base + request.path


def _add_read_headers(
    resp: web.StreamResponse, request: web.Request, first: pb.ReadResponse
) -> None:
    if first.HasField("header"):
        _add_route_headers(resp, request, first.header)
    if first.HasField("fragment"):
        frag = first.fragment
        resp.headers[FRAGMENT_NAME_HEADER] = fragment_file_name(frag)
        if frag.mod_time:
            resp.headers[FRAGMENT_LAST_MODIFIED_HEADER] = email.utils.formatdate(
                frag.mod_time, usegmt=True
            )
        if first.fragment_url:
            resp.headers[FRAGMENT_LOCATION_HEADER] = first.fragment_url
        resp.headers["Content-Range"] = f"bytes {first.offset}-{MAX_INT64}/{MAX_INT64}"
    if first.write_head:
        resp.headers[WRITE_HEAD_HEADER] = str(first.write_head)


class JournalGateway:
    """GET/HEAD/PUT of journals through `client` (see the module docstring)."""

    def __init__(self, client: JournalClient, *, max_append_bytes: int = 0) -> None:
        self.client = client
        self.max_append_bytes = max_append_bytes

    def routes(self) -> list[web.RouteDef]:
        return [web.route("*", "/{journal:.*}", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        clean = clean_path(request.path)
        if clean != request.path:
            return redirect(request, clean)  # As Go's ServeMux answers an unclean path.
        try:
            if request.method in ("GET", "HEAD"):
                return await self.serve_read(request)
            if request.method == "PUT":
                return await self.serve_append(request)
        except BadRequest as exc:
            return _error(400, str(exc))
        except Unauthorized as exc:
            return _error(401, str(exc))
        return _error(400, f"unknown method: {request.method}")

    # Reads.
    async def serve_read(self, request: web.Request) -> web.StreamResponse:
        req = parse_read_request(request)
        call = self.client.rpc_read(req, metadata=_metadata(request))
        try:
            return await self._stream_read(request, req, call)
        finally:
            call.cancel()  # Ends the RPC if the client went away mid-stream.

    async def _stream_read(
        self,
        request: web.Request,
        req: pb.ReadRequest,
        call: Any,
    ) -> web.StreamResponse:
        responses: AsyncIterator[pb.ReadResponse] = aiter(call)
        try:
            first = await anext(responses)
            check_read_response(req.journal, first)
        except StopAsyncIteration:
            return _error(500, "broker terminated RPC")
        except grpc.aio.AioRpcError as exc:
            return _rpc_error(exc)
        except InvalidResponse as exc:
            log.error("http gateway: invalid response from the broker", extra={"error": str(exc)})
            return _error(502, str(exc))
        if first.status != pb.OK:
            refused = _error(_READ_STATUS.get(first.status, 500), pb.Status.Name(first.status))
            _add_read_headers(refused, request, first)
            return refused

        resp = web.StreamResponse(status=206)
        _add_read_headers(resp, request, first)
        if req.metadata_only:
            # Go's server gives an empty HEAD response no Content-Type.
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        # As Gazette's: the X-Close-Error trailer says why the content ended.
        resp.headers["Trailer"] = CLOSE_ERROR_HEADER
        offset = first.offset
        close_error = BROKER_TERMINATED
        try:
            async for chunk in responses:
                content = chunk.content  # Taken once: each access copies the bytes.
                check_read_response(req.journal, chunk, content)
                if chunk.status != pb.OK:
                    # E.g. OFFSET_NOT_YET_AVAILABLE at the head of a non-blocking read.
                    close_error = _read_status_error(chunk)
                    break
                if chunk.offset != offset:
                    # An offset jump (metadata of a fragment past a gap, too) ends the
                    # response: its bytes would read as the ones at `offset`. The client
                    # retries from where it got to, and is told of the jump then.
                    close_error = "offset jump"
                    break
                if content:
                    if not resp.prepared:
                        # Headers go with the first content, typed as Go's server types a
                        # response from its first bytes (as Gazette's gateway answers).
                        resp.content_type = detect_content_type(content[:SNIFF_LEN])
                        await prepare_chunked(request, resp)
                    await resp.write(content)
                    offset += len(content)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.warning("http gateway: read failed mid-stream", extra={"error": str(exc)})
            close_error = go_rpc_error(exc)
        except InvalidResponse as exc:
            # Ends the response where the valid content ended; the client retries from there.
            log.error("http gateway: invalid response from the broker", extra={"error": str(exc)})
            close_error = str(exc)
        except (ConnectionResetError, ConnectionError):
            return resp  # The client went away.
        if not resp.prepared:
            await prepare_chunked(request, resp)
        await end_with_trailers(request, resp, [(CLOSE_ERROR_HEADER, close_error)])
        return resp

    # Appends.
    async def serve_append(self, request: web.Request) -> web.StreamResponse:
        first = parse_append_request(request)
        limit = self.max_append_bytes
        if limit and request.content_length is not None and request.content_length > limit:
            return _error(413, f"append body of {request.content_length} bytes exceeds {limit}")
        body = _Body(request, limit)
        call = self.client.rpc_append(None, metadata=_metadata(request))
        try:
            # Written with `send`: a broker refusing the append at once (no token, say) has
            # its status reach the client, not grpc-python's INTERNAL.
            await send_all(call, body.requests(first))
            resp = await call
        except BaseException as exc:
            call.cancel()  # A body cut short, or the client gone: the broker rolls it back.
            if body.too_large:
                return _error(413, f"append body exceeds {limit} bytes; nothing was appended")
            if body.failed is not None:
                log.info("http gateway: append body failed", extra={"error": body.failed})
                return _error(400, f"reading the body failed: {body.failed}; nothing was appended")
            if isinstance(exc, grpc.aio.AioRpcError):
                return _rpc_error(exc)
            raise
        try:
            check_response("Append", first.journal, validate_append_response, resp)
        except InvalidResponse as exc:
            log.error("http gateway: invalid response from the broker", extra={"error": str(exc)})
            return _error(502, f"{exc}; the append's outcome is unknown")
        if resp.status != pb.OK:
            # Gazette's gateway answers the error its client.Appender returns: a 500.
            return _error(500, _append_status_error(resp))
        out = web.Response(status=204)
        _add_route_headers(out, request, resp.header)
        commit = resp.commit
        out.headers[COMMIT_BEGIN_HEADER] = str(commit.begin)
        out.headers[COMMIT_END_HEADER] = str(commit.end)
        out.headers[WRITE_HEAD_HEADER] = str(commit.end)
        # As Go's Header.Add writes the name: canonically (X-Commit-Sha1-Sum).
        out.headers[COMMIT_SUM_HEADER.title()] = sha1sum_to_hex(commit.sum)
        return out


class _Body:
    """A PUT body as an Append stream (see `requests`)."""

    def __init__(self, request: web.Request, limit: int) -> None:
        self.request = request
        self.limit = limit
        self.too_large = False
        self.failed: str | None = None

    async def requests(self, first: pb.AppendRequest) -> AsyncIterator[pb.AppendRequest]:
        """`first`, the body in chunks, then the empty chunk that commits.

        A body that does not arrive in full (the client went away, or sent fewer bytes than
        its Content-Length) raises here, which cancels the RPC: the broker rolls the append
        back.
        """
        yield first
        total = 0
        buf = bytearray()
        body = self.request.content
        while True:
            try:
                piece = await body.readany()
            except Exception as exc:
                self.failed = str(exc) or type(exc).__name__
                raise
            if piece:
                buf += piece
                total += len(piece)
                if self.limit and total > self.limit:
                    self.too_large = True
                    raise AppendTooLarge(f"append body exceeds {self.limit} bytes")
                if len(buf) < APPEND_CHUNK:
                    continue
            if buf:
                yield pb.AppendRequest(content=bytes(buf))
                buf.clear()
            if not piece:
                break
        expected = self.request.content_length
        if expected is not None and total != expected:
            self.failed = f"received {total} of {expected} bytes"
            raise ConnectionResetError(self.failed)
        yield pb.AppendRequest()  # Commit.
