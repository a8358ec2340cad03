"""Gazette's JSON API (`POST /v1/journals/list`, `/v1/journals/read`) on the HTTP port of real
broker processes: bodies byte for byte against the broker's own gRPC answers, errors as
grpc-gateway writes them, authorization through the broker's, and a blocking read that ends
(its RPC too) when the HTTP client goes away. Side by side with Gazette's broker:
tests/interop/test_json_api_vs_gazette.py."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import pytest

from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.gateway.json_api import trailer_value
from pygazette.gateway.jsonpb import marshal
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.support.broker_process import BrokerProcess
from tests.support.http_scrape import scrape, value, wait_status
from tests.support.ports import free_port

KEYS = base64.b64encode(b"json-api-test-key".ljust(32, b"k")).decode()
NOT_IMPLEMENTED = b'{"code":12,"message":"Not Implemented","details":[]}'


def _serve(root: Path, *args: str) -> tuple[BrokerProcess, str]:
    http_port = free_port()
    proc = BrokerProcess(root / "data", extra_args=["--http-port", str(http_port), *args])
    proc.start()
    base = f"http://127.0.0.1:{http_port}"
    wait_status(base + "/debug/ready")
    return proc, base


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    proc, base = _serve(tmp_path_factory.mktemp("json-api"))
    try:
        yield proc, base
    finally:
        proc.kill()


@pytest.fixture
async def stub(served: tuple[BrokerProcess, str]) -> AsyncIterator[pb_grpc.JournalStub]:
    async with grpc.aio.insecure_channel(served[0].address) as channel:
        yield pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]


async def post(
    url: str, body: bytes | str, headers: dict[str, str] | None = None, method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.request(
            method, url, data=body, headers=headers, allow_redirects=False
        ) as resp:
            return resp.status, dict(resp.headers), await resp.read()


def content_of(lines: list[bytes], responses: list[dict[str, Any]], at: int = 0) -> bytes:
    """The content of a Read's responses; each content response checked to be, byte for byte,
    what Gazette's gateway writes (`{"status":"OK","header":null,"offset":…,"writeHead":"0",…`)."""
    content = b""
    for line, resp in zip(lines, responses, strict=True):
        if resp["content"]:
            assert line == (
                b'{"result":{"status":"OK","header":null,"offset":"%d","writeHead":"0",'
                b'"fragment":null,"fragmentUrl":"","content":"%s"}}'
                % (at + len(content), resp["content"].encode())
            )
            content += base64.b64decode(resp["content"])
    return content


async def assigned(
    stub: pb_grpc.JournalStub, journal: str, metadata: tuple[tuple[str, str], ...] = ()
) -> None:
    """Wait until `journal` has its primary (the allocator has assigned it)."""
    req = pb.ListRequest()
    req.selector.include.labels.add(name="name", value=journal)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        [resp] = [r async for r in stub.List(req, metadata=metadata)]
        if resp.journals and resp.journals[0].route.primary >= 0:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{journal} has no primary")


def results(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(b"\n"), body
    return [json.loads(line)["result"] for line in body.splitlines()]


async def test_list_is_the_list_rpc_in_json(
    served: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = served
    spec = journal_spec("json-api/list", labels={"topic": "a=b"})
    spec.fragment.path_postfix_template = 'x{{/* <&>" */}}'
    spec.fragment.refresh_interval.FromSeconds(90)
    spec.fragment.flush_interval.FromMilliseconds(90500)
    assert (await apply_specs(stub, spec)).status == pb.OK
    await assigned(stub, "json-api/list")
    sel = '{"selector":{"include":{"labels":[{"name":"topic","value":"a=b"}]}}}'
    req = pb.ListRequest(selector=pb.LabelSelector())
    req.selector.include.labels.add(name="topic", value="a=b")
    for _ in range(5):  # (The keyspace's revision may move between the two.)
        status, headers, body = await post(base + "/v1/journals/list", sel)
        [grpc_resp] = [r async for r in stub.List(req)]
        # Byte for byte the broker's own answer to the same request, as gogo jsonpb writes it.
        if body == b'{"result":' + marshal(grpc_resp) + b"}\n":
            break
    assert body == b'{"result":' + marshal(grpc_resp) + b"}\n"
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert headers["Grpc-Metadata-Content-Type"] == "application/grpc"
    assert headers["Transfer-Encoding"] == "chunked"
    text = body.decode()
    assert '"pathPostfixTemplate":"x{{/* \\u003c\\u0026\\u003e\\" */}}"' in text  # As Go.
    assert '"refreshInterval":"90s"' in text and '"flushInterval":"90.500s"' in text
    assert '"length":"1048576"' in text and '"suspend":null' in text  # int64s as strings.
    assert '"compressionCodec":"NONE"' in text  # Enums by name.
    # Field names either way, unknown fields ignored, an empty body an empty request.
    for other in (sel + " trailing", sel[:-1] + ',"x":1}'):
        assert (await post(base + "/v1/journals/list", other))[2] == body
    assert (await post(base + "/v1/journals/list", ""))[0] == 200


async def test_read_streams_each_response(
    served: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = served
    journal = "json-api/read"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    assert (await append(stub, journal, b"hello\n", b"world\n")).status == pb.OK
    status, headers, body = await post(base + "/v1/journals/read", f'{{"journal":"{journal}"}}')
    assert status == 200 and headers["Transfer-Encoding"] == "chunked"
    lines, responses = body.splitlines(), results(body)
    meta = responses[0]
    assert meta["status"] == "OK" and meta["writeHead"] == "12" and meta["content"] is None
    assert meta["fragment"]["end"] == "12"  # type: ignore[index]
    # Content responses byte for byte as Gazette's gateway writes them (recorded from Gazette
    # v0.103's broker), however the broker chunks the content.
    assert content_of(lines, responses) == b"hello\nworld\n"
    assert lines[-1] == (
        b'{"result":{"status":"OFFSET_NOT_YET_AVAILABLE","header":null,"offset":"12",'
        b'"writeHead":"12","fragment":null,"fragmentUrl":"","content":null}}'
    )
    # Quoted or not, snake_case or camelCase: the same request.
    ranged = f'{{"journal":"{journal}","offset":3,"end_offset":"7"}}'
    body = (await post(base + "/v1/journals/read", ranged))[2]
    assert content_of(body.splitlines(), results(body), at=3) == b"lo\nw"
    # Not found is the RPC's status, in a result.
    [missing] = results((await post(base + "/v1/journals/read", '{"journal":"json-api/no"}'))[2])
    assert missing["status"] == "JOURNAL_NOT_FOUND"


async def test_refusals_as_grpc_gateway_writes_them(served: tuple[BrokerProcess, str]) -> None:
    _, base = served
    read = base + "/v1/journals/read"
    cases = [
        ("x", b'{"code":3,"message":"invalid character \'x\' looking for beginning of value",'),
        ("{", b'{"code":3,"message":"unexpected EOF",'),
        ('{"block":"yes"}', b'{"code":3,"message":"json: cannot unmarshal string into Go value '),
        ('{"journal":5}', b'{"code":3,"message":"json: cannot unmarshal number into Go value of'),
        ('{"offset":1.5}', b'{"code":3,"message":"json: cannot unmarshal number 1.5 into Go v'),
        ("[]", b'{"code":3,"message":"json: cannot unmarshal array into Go value of type map'),
    ]
    for body, start in cases:
        status, headers, got = await post(read, body)
        assert (status, headers["Content-Type"]) == (400, "application/json"), body
        assert got.startswith(start) and got.endswith(b',"details":[]}'), (body, got)
    # An invalid request reaches the broker, whose error ends the stream (no result before it):
    # UNKNOWN, as Gazette's broker answers it.
    status, headers, got = await post(read, '{"journal":"bad name"}')
    assert status == 500 and headers["Transfer-Encoding"] == "chunked"
    assert got == (
        b'{"error":{"grpcCode":2,"httpCode":500,"message":"Journal: not a valid token '
        b'(bad name)","httpStatus":"Internal Server Error","details":[]}}'
    )
    # Other methods and paths: 501; OPTIONS (CORS preflight) 200; /v1 redirected.
    for method, url in [
        ("GET", read),
        ("PUT", read),
        ("POST", base + "/v1/journals/append"),
        ("POST", read + "/"),
        ("POST", read + ":watch"),
    ]:
        status, headers, got = await post(url, "{}", method=method)
        assert (status, got) == (501, NOT_IMPLEMENTED), (method, url)
    assert (await post(read, "", method="OPTIONS"))[:3:2] == (200, b"")
    status, headers, got = await post(base + "/v1", "{}")
    assert (status, headers["Location"], got) == (307, "/v1/", b"")


async def test_authorization_is_the_brokers(tmp_path: Path) -> None:
    proc, base = _serve(tmp_path, "--auth-keys", KEYS)
    try:
        journal = "json-api/auth"
        token = "Bearer " + KeyedAuth(KEYS).sign(Claims(Capability.ALL))
        async with grpc.aio.insecure_channel(proc.address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            await stub.Apply(
                pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=journal_spec(journal))]),
                metadata=(("authorization", token),),
            )
            await assigned(stub, journal, (("authorization", token),))
        body = f'{{"journal":"{journal}"}}'
        status, _, got = await post(base + "/v1/journals/read", body)
        assert status == 401, got
        error = json.loads(got)["error"]
        assert error["httpCode"] == status and error["grpcCode"] == 16
        status, _, got = await post(base + "/v1/journals/list", "{}")
        assert status == 401, got
        # A token without the capability: UNAUTHENTICATED, as Gazette's broker answers it.
        read_only = "Bearer " + KeyedAuth(KEYS).sign(Claims(Capability.READ))
        status, _, got = await post(base + "/v1/journals/list", "{}", {"Authorization": read_only})
        error = json.loads(got)["error"]
        assert (status, error["grpcCode"]) == (401, 16), got
        assert error["message"] == "authorization is missing required LIST capability"
        status, _, got = await post(base + "/v1/journals/read", body, {"Authorization": token})
        assert status == 200
        assert [r["status"] for r in results(got)] == ["OFFSET_NOT_YET_AVAILABLE"]
    finally:
        proc.kill()


def _reads_open(base: str, operation: str = "Read") -> float:
    """RPCs of `operation` the broker has open (started, not completed)."""
    samples = scrape(base)
    started = value(samples, "gazette_journal_server_started_totals_total", operation=operation)
    completed = sum(
        v
        for (name, labels), v in samples.items()
        if name == "gazette_journal_server_completed_totals_total"
        and ("operation", operation) in labels
    )
    return started - completed


async def _wait_open(base: str, operation: str, count: int, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_reads_open, base, operation) == count:
            return
        await asyncio.sleep(0.05)
    assert await asyncio.to_thread(_reads_open, base, operation) == count, operation


async def test_a_blocking_read_streams_and_ends_with_its_client(
    served: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = served
    journal = "json-api/blocking"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    assert await asyncio.to_thread(_reads_open, base) == 0
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"journal": journal, "block": True}).encode()
    writer.write(
        b"POST /v1/journals/read HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    # Nothing is written until the broker sends a response (nor does Gazette's gateway): the
    # read waits, open on the broker.
    await _wait_open(base, "Read", 1)

    async def next_result() -> dict[str, object]:
        size = int((await reader.readline()).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        return results(chunk[:-2])[0]

    # An append reaches the open response as it commits.
    assert (await append(stub, journal, b"streamed\n")).status == pb.OK
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Transfer-Encoding: chunked" in head
    while not (streamed := await asyncio.wait_for(next_result(), 30))["content"]:
        assert streamed["status"] == "OK"  # Metadata of the fragment the content is in.
    assert streamed["content"] == base64.b64encode(b"streamed\n").decode()
    # The read blocks for more, until the client goes away: the gateway's call to the broker
    # ends with it.
    assert await asyncio.to_thread(_reads_open, base) == 1
    # The client goes away: the gateway's call to the broker ends with it.
    writer.close()
    await writer.wait_closed()
    await _wait_open(base, "Read", 0)  # Else the Read RPC outlived its client.


async def test_cors_of_allowed_origins() -> None:
    """As Gazette's CORSWrapper (--allow-origin): headers for an allowed Origin, OPTIONS 200."""
    from pygazette.gateway.exposition import MetricsExposition
    from pygazette.gateway.health import ReadyState
    from pygazette.gateway.http_server import HttpServer
    from pygazette.gateway.json_api import JOURNAL_METHODS, JsonApi

    async with grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}") as channel:
        api = JsonApi(channel, JOURNAL_METHODS, allow_origins=["http://app.example"])
        server = HttpServer.for_server(
            readiness=ReadyState(), metrics=MetricsExposition(), json_api=api
        )
        port = await server.start("127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{port}/v1/journals/read"
            allowed = {"Origin": "http://app.example"}
            status, headers, body = await post(url, "", allowed, method="OPTIONS")
            assert (status, body) == (200, b"")
            assert headers["Access-Control-Allow-Origin"] == "http://app.example"
            assert headers["Access-Control-Allow-Methods"] == "GET, POST, OPTIONS"
            assert "Authorization" in headers["Access-Control-Allow-Headers"]
            status, headers, body = await post(url, "x", allowed)
            assert status == 400 and headers["Access-Control-Allow-Origin"] == "http://app.example"
            status, headers, _ = await post(url, "x", {"Origin": "http://other.example"})
            assert status == 400 and "Access-Control-Allow-Origin" not in headers
        finally:
            await server.stop()


async def test_a_watched_listing_streams_and_ends_with_its_client(
    served: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = served
    await _wait_open(base, "List", 0)
    body = json.dumps(
        {"watch": True, "selector": {"include": {"labels": [{"name": "watched", "value": "w"}]}}}
    )
    async with aiohttp.ClientSession() as session:
        async with session.post(base + "/v1/journals/list", data=body) as resp:
            assert resp.status == 200
            first = json.loads(await asyncio.wait_for(resp.content.readline(), 30))["result"]
            assert first["status"] == "OK"
            await _wait_open(base, "List", 1)
            spec = journal_spec("json-api/watched", labels={"watched": "w"})
            assert (await apply_specs(stub, spec)).status == pb.OK
            names: list[str] = []
            while "json-api/watched" not in names:
                line = await asyncio.wait_for(resp.content.readline(), 30)
                result = json.loads(line)["result"]
                names += [j["spec"]["name"] for j in result["journals"]]
    # The client went away: the watch's List RPC ends with it.
    await _wait_open(base, "List", 0)


async def test_over_https_with_client_certificates(tmp_path: Path) -> None:
    """With the server's TLS material the API is HTTPS (mTLS here), and its calls reach the
    broker's TLS gRPC port."""
    from pygazette.auth.tls import ClientTLS, channel_credentials
    from tests.support.tls_material import generate_tls_material

    m = generate_tls_material(tmp_path / "tls")
    http_port = free_port()
    proc = BrokerProcess(
        tmp_path / "data",
        extra_args=[
            "--http-port", str(http_port),
            "--server-cert-file", str(m.server_cert),
            "--server-cert-key-file", str(m.server_key),
            "--server-ca-file", str(m.ca),
            "--peer-ca-file", str(m.ca),
        ],
        tls=ClientTLS(m.ca, m.client_cert, m.client_key),
    )  # fmt: skip
    journal = "json-api/tls"
    try:
        await asyncio.to_thread(proc.start)
        credentials = channel_credentials(ClientTLS(m.ca, m.client_cert, m.client_key))
        async with grpc.aio.secure_channel(proc.address, credentials) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
            assert (await append(stub, journal, b"secure\n")).status == pb.OK
        curl = [
            "curl", "-sS", "--cacert", str(m.ca), "--cert", str(m.client_cert),
            "--key", str(m.client_key), "-X", "POST", "--data-binary",
            json.dumps({"journal": journal}), f"https://127.0.0.1:{http_port}/v1/journals/read",
        ]  # fmt: skip
        out = await asyncio.to_thread(subprocess.run, curl, capture_output=True, timeout=60)
        responses = results(out.stdout)
        content = [r["content"] for r in responses if r["content"]]
        assert content == [base64.b64encode(b"secure\n").decode()], out
    finally:
        proc.kill()


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("OFFSET_NOT_YET_AVAILABLE", "OFFSET_NOT_YET_AVAILABLE"),
        ("store: a\r\nX-Forged: 1", "store: a  X-Forged: 1"),
        ("two\nlines ", "two lines"),
    ],
)
def test_a_trailer_value_stays_on_its_line_as_go_writes_it(value: str, written: str) -> None:
    """A message of several lines (a store's error, say) must not end the trailer block or
    forge another field: Go's net/http turns line breaks into spaces."""
    assert trailer_value(value) == written
