"""Gazette's JSON API side by side: the same HTTP requests (real `curl`) to Gazette's broker
(interop/bin/gazette on etcd: grpc-gateway on its service port) and to a pygazette broker's
HTTP port, holding the same journals and content. Status lines, headers (all but Date and
Server) and bodies must be byte-identical once the values that differ between two clusters
are masked (etcd cluster/member ids and revisions, ports, where a fragment is persisted).

A request the broker's validation refuses is UNKNOWN (HTTP 500) on Gazette's, whose handler
returns a plain error, and a token lacking a capability UNAUTHENTICATED (401): pygazette's
gRPC codes for them (INVALID_ARGUMENT, PERMISSION_DENIED) are answered as those, so both are
compared byte for byte. A malformed token's message is Gazette's for the refusals an operator
meets (tests/interop/test_auth_interop.py), else PyJWT's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims
from pygazette.auth.keyed_auth import KeyedAuth
from pygazette.gateway.exposition import MetricsExposition
from pygazette.gateway.health import ReadyState
from pygazette.gateway.http_server import HttpServer
from pygazette.gateway.json_api import JOURNAL_METHODS, SHARD_METHODS, JsonApi
from pygazette.gateway.jsonpb import JsonError, decode, marshal
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import consumer_pb2_grpc as cpb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import journal_spec
from tests.interop.conftest import BROKER_ID
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker
from tests.support.http_scrape import wait_status
from tests.support.listening_process import start_listening
from tests.support.ports import free_port

CURL = shutil.which("curl") or "/usr/bin/curl"
KEYS = base64.b64encode(b"json-api-interop-key".ljust(32, b"k")).decode()

pytestmark = [
    pytest.mark.skipif(not Path(CURL).exists(), reason="needs the curl binary"),
    pytest.mark.timeout(240),
]

_VOLATILE = re.compile(
    rb'"(clusterId|memberId|revision|raftTerm|modRevision|createRevision)":"[0-9]+"'
)
_HOSTPORT = re.compile(rb"127\.0\.0\.1:[0-9]+")
_PERSISTED = re.compile(rb'"backingStore":"[^"]*","modTime":"[0-9]+"')
_URL = re.compile(rb'"fragmentUrl":"[^"]*"')


def masked(body: bytes) -> bytes:
    body = _VOLATILE.sub(rb'"\1":"N"', body)
    body = _HOSTPORT.sub(b"HOST", body)
    body = _PERSISTED.sub(b'"backingStore":"B","modTime":"M"', body)
    return _URL.sub(b'"fragmentUrl":"U"', body)


Answer = tuple[str, list[tuple[str, str]], bytes]


def curl(base: str, args: list[str], mask: bool = True) -> Answer:
    out = subprocess.run(
        [CURL, "-s", "-i", "-m", "10", *[a.replace("BASE", base) for a in args]],
        capture_output=True,
        timeout=30,
        check=False,
    ).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = sorted(
        (k.lower(), v.strip())
        for k, _, v in (line.partition(":") for line in lines[1:])
        if k.lower() not in ("date", "server")
    )
    return lines[0], headers, masked(body) if mask else body


def _post(path: str, body: str, *headers: str) -> list[str]:
    extra = [arg for h in headers for arg in ("-H", h)]
    return ["-X", "POST", *extra, f"BASE{path}", "--data-binary", body]


READ = "/v1/journals/read"
LIST = "/v1/journals/list"
JOURNAL = "interop/json-api/a=b%2C+c"

# Answered byte for byte alike.
SAME: list[list[str]] = [
    _post(LIST, "{}"),
    _post(LIST, '{"selector":{"include":{"labels":[{"name":"topic","value":"x"}]}}}'),
    _post(LIST, '{"selector":{"exclude":{"labels":[{"name":"topic","prefix":true}]}},"x":[]}'),
    _post(LIST, '{"watch_resume":{},"pageLimit":"x"}'),
    _post(READ, f'{{"journal":"{JOURNAL}"}}'),
    _post(READ, f'{{"journal":"{JOURNAL}","offset":"12"}}'),
    _post(READ, f'{{"journal":"{JOURNAL}","offset":3,"end_offset":"7"}}'),
    _post(READ, f'{{"journal":"{JOURNAL}","metadataOnly":true,"offset":-1}}'),
    _post(READ, f'{{"journal":"{JOURNAL}","offset":"\\u0031","doNotProxy":false}}'),
    _post(READ, '{"journal":"interop/json-api/none"}'),
    ["--http1.0", *_post(READ, f'{{"journal":"{JOURNAL}"}}')],  # Not chunked: closed.
    _post(READ, f'{{"journal":"{JOURNAL}"}}trailing'),
    # Go's decoding errors.
    *[
        _post(READ, body)
        for body in [
            "x",
            "{",
            "[]",
            '"str"x',
            "12x",
            '{"journal":5}',
            '{"offset":"abc"}',
            '{"offset":1.5}',
            '{"offset":99999999999999999999}',
            '{"offset":"-"}',
            '{"offset":"1e"}',
            '{"offset":"1 2"}',
            '{"offset":""}',
            '{"offset":"tr"}',
            '{"block":"yes"}',
            '{"header":5}',
            '{"a":}',
            '{"a" 1}',
            '{"a":1 "b":2}',
            "{1:2}",
            "[1 2]",
            '{"a":"\\x"}',
            '{"a":"\\u12g4"}',
            '{"a":-x}',
            '{"a":1.x}',
            '{"a":tru}',
            "{\"a\":'x'}",
            "é",
            '{"header":{"etcd":{"revision":"x"}}}',
            '{"header":{"processId":"x"}}',
            '{"header":{"route":{"members":5}}}',
            '{"header":{"route":{"primary":4294967296}}}',
            '{"header":{"etcd":{"clusterId":-1}}}',
        ]
    ],
    _post(LIST, '{"selector":{"include":{"labels":[{"name":5}]}}}'),
    _post(LIST, '{"selector":{"include":{"labels":{}}}}'),
    # Routing, methods, CORS preflight and redirects of Go's ServeMux.
    ["-X", "GET", f"BASE{LIST}"],
    ["-X", "PUT", f"BASE{LIST}", "-d", "{}"],
    ["-X", "HEAD", f"BASE{LIST}"],
    _post("/v1/journals/append", "{}"),
    _post(LIST + "/", "{}"),
    _post(LIST + ":watch", "{}"),
    _post("/v1/", "{}"),
    _post("/v1", "{}"),
    ["-X", "GET", "BASE/v1?x=1&y=<"],
    ["-X", "POST", "--path-as-is", "BASE/v1//journals/list", "-d", "{}"],
    ["-X", "OPTIONS", f"BASE{LIST}"],
    ["-X", "OPTIONS", "BASE/v1/zz", "-H", "Origin: http://x"],
    _post(LIST, "a=b", "Content-Type: application/x-www-form-urlencoded"),
    _post(
        LIST,
        "a=b",
        "X-HTTP-Method-Override: GET",
        "Content-Type: application/x-www-form-urlencoded",
    ),
    _post(READ, "{}", "Grpc-Timeout: xx"),
    _post(READ, "{}", "Grpc-Timeout: 1"),
    _post(READ, "{}", "Grpc-Timeout: 5x"),
    _post(READ, "{}", "Grpc-Timeout: 1n"),  # Past before the call starts.
    _post(READ, "{}", "Grpc-Timeout: -3S"),
    _post(READ, '{"journal":"interop/json-api/none"}', "Grpc-Timeout: 0S"),  # No deadline.
    _post(READ, '{"journal":"interop/json-api/none"}', "Grpc-Timeout: +99999999999S"),
    _post(READ, "{}", "Grpc-Metadata-Foo-Bin: !!"),
    _post(READ, '{"journal":"interop/json-api/none"}', "Grpc-Metadata-Foo: bar"),
]

# Refused by the broker's validation (UNKNOWN on Gazette's, INVALID_ARGUMENT on pygazette's gRPC).
VALIDATION = [
    _post(READ, '{"journal":"bad name"}'),
    _post(READ, '{"nope":1}'),
    _post(READ, ""),
    _post(READ, "null"),
    # A form POSTed with a method override: grpc-gateway's ParseForm reads it, the request is
    # empty.
    _post(
        READ,
        "a=b",
        "X-HTTP-Method-Override: post",
        "Content-Type: application/x-www-form-urlencoded",
    ),
    _post(LIST, '{"selector":{"include":{"labels":[{"name":"bad label"}]}}}'),
]


def _serve_pygazette(root: Path, *args: str) -> tuple[BrokerProcess, str]:
    http_port = free_port()
    proc = BrokerProcess(
        root / "data", extra_args=["--id", BROKER_ID, "--http-port", str(http_port), *args]
    )
    proc.data_dir.parent.mkdir(parents=True, exist_ok=True)
    proc.start()
    base = f"http://127.0.0.1:{http_port}"
    wait_status(base + "/debug/ready")
    return proc, base


@pytest.fixture
def pygazette_http(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    proc, base = _serve_pygazette(tmp_path / "pygazette")
    try:
        yield proc, base
    finally:
        proc.kill()


def _spec() -> pb.JournalSpec:
    spec = journal_spec(JOURNAL, codec=pb.SNAPPY, labels={"topic": "x", "content-type": "y"})
    spec.fragment.refresh_interval.FromSeconds(30)
    spec.fragment.retention.FromMilliseconds(5400500)
    spec.fragment.flush_interval.FromMilliseconds(90500)
    spec.fragment.path_postfix_template = '{{/* <&>" */}}'
    spec.flags = pb.JournalSpec.O_RDWR
    spec.max_append_rate = 1000
    return spec


def _prepare(address: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
    """The same journal and content on both brokers."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=_spec())])
        assert stub.Apply(req, metadata=metadata).status == pb.OK
        deadline = time.monotonic() + 30
        while True:
            resp = stub.Append(
                iter(
                    [
                        pb.AppendRequest(journal=JOURNAL),
                        pb.AppendRequest(content=b"hello\nworld\n"),
                        pb.AppendRequest(),
                    ]
                ),
                metadata=metadata,
            )
            if resp.status == pb.OK or time.monotonic() > deadline:
                break  # (A journal just created may not have its primary yet.)
            time.sleep(0.05)
        assert resp.status == pb.OK, pb.Status.Name(resp.status)


def test_json_api_answers_as_gazettes(
    gazette: GazetteBroker, pygazette_http: tuple[BrokerProcess, str]
) -> None:
    proc, py_base = pygazette_http
    _prepare(gazette.address)
    _prepare(proc.address)
    differ = []
    for args in SAME:
        theirs, ours = curl(gazette.url, args), curl(py_base, args)
        if theirs != ours:
            differ.append((args, theirs, ours))
    assert differ == [], "\n".join(f"{a}\n  gazette:   {t}\n  pygazette: {o}" for a, t, o in differ)

    # A blocking read cut by its Grpc-Timeout: 504 on both (the texts are each gRPC client's).
    blocking = _post(
        READ, f'{{"journal":"{JOURNAL}","offset":"12","block":true}}', "Grpc-Timeout: 300m"
    )
    for answer in (curl(gazette.url, blocking), curl(py_base, blocking)):
        assert answer[0] == "HTTP/1.1 504 Gateway Timeout", answer
        assert answer[2].startswith(b'{"error":{"grpcCode":4,"httpCode":504,"message":'), answer

    # Refused by the broker's validation: UNKNOWN, 500, on both.
    for args in VALIDATION:
        theirs, ours = curl(gazette.url, args), curl(py_base, args)
        assert theirs[0] == "HTTP/1.1 500 Internal Server Error", (args, theirs)
        assert theirs == ours, (args, theirs, ours)


def test_authorization_answers_as_gazettes(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    gazette = GazetteBroker(
        binaries.gazette, etcd, tmp_path / "gazette", broker_id=BROKER_ID, auth_keys=KEYS
    )
    gazette.start()
    proc, py_base = _serve_pygazette(tmp_path / "pygazette", "--auth-keys", KEYS)
    try:
        signer = KeyedAuth(KEYS)
        every = "Bearer " + signer.sign(Claims(Capability.ALL))
        for address in (gazette.address, proc.address):
            _prepare(address, (("authorization", every),))
        read = f'{{"journal":"{JOURNAL}"}}'
        other = KeyedAuth(base64.b64encode(b"another key".ljust(32, b"a")).decode())
        refused = [
            "Bearer " + other.sign(Claims(Capability.ALL)),  # No key of the broker's.
            "Bearer " + signer.sign(Claims(Capability.ALL), ttl=-10),  # Expired.
            "Bearer abc.def",
        ]
        for token in ["", "Basic abc", every, *refused]:
            header = [f"Authorization: {token}"] if token else []
            for args in (_post(READ, read, *header), _post(LIST, "{}", *header)):
                assert curl(gazette.url, args) == curl(py_base, args), (token, args)
        # A token without the capability: UNAUTHENTICATED (401) on both.
        read_only = "Authorization: Bearer " + signer.sign(Claims(Capability.READ))
        list_only = "Authorization: Bearer " + signer.sign(Claims(Capability.LIST))
        for args in (_post(LIST, "{}", read_only), _post(READ, read, list_only)):
            theirs, ours = curl(gazette.url, args), curl(py_base, args)
            assert theirs[0] == "HTTP/1.1 401 Unauthorized", theirs
            assert b"authorization is missing required" in theirs[2], theirs
            assert theirs == ours, (args, theirs, ours)
    finally:
        proc.kill()
        gazette.kill()


def test_cors_answers_as_gazettes(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    origin = "http://app.example"
    gazette = GazetteBroker(
        binaries.gazette,
        etcd,
        tmp_path / "gazette",
        broker_id=BROKER_ID,
        extra_args=[f"--broker.allow-origin={origin}"],
    )
    gazette.start()
    proc, py_base = _serve_pygazette(tmp_path / "pygazette", "--allow-origin", origin)
    try:
        for address in (gazette.address, proc.address):
            _prepare(address)
        read = f'{{"journal":"{JOURNAL}"}}'
        for header in (f"Origin: {origin}", "Origin: http://other.example"):
            for args in (
                ["-X", "OPTIONS", f"BASE{READ}", "-H", header],
                ["-X", "OPTIONS", "BASE/v1/anything", "-H", header],
                _post(READ, read, header),
                _post(LIST, "x", header),
                ["-X", "GET", f"BASE{LIST}", "-H", header],
            ):
                theirs, ours = curl(gazette.url, args), curl(py_base, args)
                assert theirs == ours, (args, theirs, ours)
        allowed = curl(py_base, ["-X", "OPTIONS", f"BASE{READ}", "-H", f"Origin: {origin}"])
        assert ("access-control-allow-origin", origin) in allowed[1]
    finally:
        proc.kill()
        gazette.kill()


async def test_the_gateway_in_front_of_gazettes_broker_answers_as_gazettes(
    gazette: GazetteBroker,
) -> None:
    """pygazette's JSON API calling Gazette's broker answers every request exactly as Gazette's
    own gateway does (nothing masked but Date and Server): the translation alone compared."""
    await asyncio.to_thread(_prepare, gazette.address)
    async with grpc.aio.insecure_channel(gazette.address) as channel:
        server = HttpServer.for_server(
            readiness=ReadyState(),
            metrics=MetricsExposition(),
            json_api=JsonApi(channel, JOURNAL_METHODS),
        )
        port = await server.start("127.0.0.1", 0)
        try:
            ours_base = f"http://127.0.0.1:{port}"
            differ = []
            for args in [*SAME, *VALIDATION]:
                theirs = await asyncio.to_thread(curl, gazette.url, args, False)
                ours = await asyncio.to_thread(curl, ours_base, args, False)
                if theirs != ours:
                    differ.append((args, theirs, ours))
            assert differ == [], "\n".join(
                f"{a}\n  gazette:   {t}\n  pygazette: {o}" for a, t, o in differ
            )
        finally:
            await server.stop()


SUMMER = Path(__file__).resolve().parents[2] / "interop" / "bin" / "summer"
CHUNKS = "interop/json-api/chunks/part-000"


@pytest.mark.skipif(not SUMMER.exists(), reason="needs Gazette's summer (build-stream-sum)")
async def test_the_gateway_in_front_of_gazettes_consumer_answers_as_gazettes(
    gazette: GazetteBroker, tmp_path: Path
) -> None:
    """Gazette's consumer (the stream-sum `summer`) answers /v1/shards/list and /stat through
    its own gateway and through pygazette's exactly alike (nothing masked but Date and Server);
    and pygazette's bodies are its gRPC answers in jsonpb."""
    labels = {"content-type": "application/x-ndjson"}
    with grpc.insecure_channel(gazette.address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        specs = [
            journal_spec(CHUNKS, labels={**labels, "app.gazette.dev/message-type": "Chunk"}),
            journal_spec(
                "interop/json-api/logs/part-000",
                labels={"content-type": "application/x-gazette-recoverylog"},
            ),
        ]
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in specs])
        assert stub.Apply(req).status == pb.OK
    tmp = tmp_path / "summer-tmp"
    tmp.mkdir()
    summer, port = start_listening(
        lambda p: [
            str(SUMMER),
            "serve",
            "--consumer.zone=local",
            "--consumer.host=127.0.0.1",
            f"--consumer.port={p}",
            "--consumer.id=summer-0",
            f"--broker.address={gazette.url}",
            f"--broker.file-root={gazette.file_root}",
            f"--etcd.address={gazette.etcd.url}",
            f"--etcd.prefix={gazette.prefix}-consumer",
            "--log.level=warn",
        ],
        tmp_path / "summer.log",
        env={**os.environ, "TMPDIR": str(tmp)},
        what="summer",
    )
    try:
        summer_url = f"http://127.0.0.1:{port}"
        spec = cpb.ShardSpec(
            id="part-000",
            recovery_log_prefix="interop/json-api/logs",
            hint_prefix="/interop-json-api-hints",
            sources=[cpb.ShardSpec.Source(journal=CHUNKS)],
        )
        spec.max_txn_duration.FromSeconds(1)
        spec.labels.labels.add(name="store", value="sqlite")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            shards = cpb_grpc.ShardStub(channel)  # type: ignore[no-untyped-call]
            applied = await shards.Apply(
                cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)])
            )
            assert applied.status == cpb.OK
            for _ in range(400):
                listed = await shards.List(cpb.ListRequest())
                codes = [s.code for shard in listed.shards for s in shard.status]
                if codes == [cpb.ReplicaStatus.PRIMARY]:
                    break
                await asyncio.sleep(0.05)
            assert codes == [cpb.ReplicaStatus.PRIMARY]
            server = HttpServer.for_server(
                readiness=ReadyState(),
                metrics=MetricsExposition(),
                json_api=JsonApi(channel, SHARD_METHODS),
            )
            ours_port = await server.start("127.0.0.1", 0)
            try:
                ours_base = f"http://127.0.0.1:{ours_port}"
                cases = [
                    _post("/v1/shards/list", "{}"),
                    _post("/v1/shards/list", ""),
                    _post("/v1/shards/list", '{"selector":{"include":{"labels":[{"name":"x"}]}}}'),
                    _post("/v1/shards/stat", '{"shard":"part-000"}'),
                    _post("/v1/shards/stat", '{"shard":"part-000","readThrough":{"a/b":"0"}}'),
                    _post("/v1/shards/stat", '{"shard":"none-such"}'),
                    _post("/v1/shards/stat", '{"shard":5}'),
                    _post("/v1/shards/stat", '{"readThrough":[]}'),
                    _post("/v1/shards/stat", '{"readThrough":{"a":"x"}}'),
                    _post("/v1/shards/stat", '{"extension":"!"}'),
                    _post("/v1/shards/stat", "{"),
                    ["--http1.0", *_post("/v1/shards/stat", '{"readThrough":{"a":"x"}}')],
                    ["--http1.0", *_post("/v1/shards/list", "{}")],
                    [
                        "--http1.0",
                        *_post(
                            "/v1/shards/list", '{"selector":{"include":{"labels":[{"name":"x"}]}}}'
                        ),
                    ],
                    _post("/v1/journals/list", "{}"),
                    ["-X", "GET", "BASE/v1/shards/list"],
                    ["-X", "OPTIONS", "BASE/v1/shards/list"],
                    # Other paths of a consumer (no journal gateway): Go's mux's answers.
                    ["BASE/not/served"],
                    ["-X", "PUT", "BASE/x", "-d", "x"],
                    ["-I", "BASE/"],
                    ["--path-as-is", "BASE//v1/shards/list?a=%41", "-d", "{}"],
                    ["--path-as-is", "BASE/x/../y"],
                ]
                for args in cases:
                    for _ in range(5):  # (The consumer's etcd revision may move in between.)
                        theirs = await asyncio.to_thread(curl, summer_url, args, False)
                        ours = await asyncio.to_thread(curl, ours_base, args, False)
                        if theirs == ours:
                            break
                    assert theirs == ours, (args, theirs, ours)
                # The bodies are the RPCs' answers in jsonpb (a unary RPC: no newline).
                body = (await asyncio.to_thread(curl, ours_base, cases[0], False))[2]
                assert body == marshal(await shards.List(cpb.ListRequest()))
            finally:
                await server.stop()
    finally:
        summer.kill()
        summer.wait(10)


_FUZZ_SEEDS = [
    b'{"journal":"a/b/c","offset":"3","endOffset":7,"block":false,"doNotProxy":true,'
    b'"metadataOnly":false,"beginModTime":"0"}',
    b'{"header":{"processId":{"zone":"a","suffix":"b"},"route":{"members":[{"zone":"a",'
    b'"suffix":"b"}],"primary":0,"endpoints":["http://x"]},"etcd":{"clusterId":"1","memberId":2,'
    b'"revision":"3","raftTerm":4}},"journal":"a/b/none"}',
]
_FUZZ_BYTES = b"{}[]\":,0123456789-+.eEtrufalsn \\/ux\t\n\x00\xc3\xa9ab\xff\x7f\x80\x1f'\xe2ABCDEF"


def _mutated(rng: random.Random) -> bytes:
    body = bytearray(rng.choice(_FUZZ_SEEDS))
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(body) + 1)
        op = rng.random()
        if op < 0.4 and body:
            del body[min(i, len(body) - 1)]
        elif op < 0.8:
            body.insert(i, rng.choice(_FUZZ_BYTES))
        else:
            del body[i:]
    return bytes(body)


def _gazettes_refusal(url: str, body: bytes) -> str | None:
    """The 400 message of Gazette's gateway for a Read body (None: it took the body)."""
    req = urllib.request.Request(url + READ, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, answer = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, answer = exc.code, exc.read()
    if status == 400 and answer.startswith(b'{"code":3,'):
        return str(json.loads(answer)["message"])
    return None


def test_mutated_bodies_are_refused_as_gazettes(gazette: GazetteBroker) -> None:
    """1,000 randomly mutated Read bodies (seeded): pygazette's decoder refuses exactly the
    ones Gazette's gateway refuses, with its message (14,500 such in development: none
    differed)."""
    rng = random.Random(20261130)
    bodies = [_mutated(rng) for _ in range(1000)]
    with ThreadPoolExecutor(8) as pool:
        theirs = list(pool.map(lambda b: _gazettes_refusal(gazette.url, b), bodies))
    differ = []
    for body, message in zip(bodies, theirs, strict=True):
        try:
            decode(body, pb.ReadRequest())
            ours = None
        except JsonError as exc:
            ours = str(exc)
        if ours != message:
            differ.append((body, message, ours))
    assert differ == []
