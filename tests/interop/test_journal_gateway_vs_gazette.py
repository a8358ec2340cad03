"""The HTTP journal gateway (GET/HEAD/PUT of /<journal>) side by side with Gazette's: the same
requests (real `curl`) to Gazette's broker (interop/bin/gazette, its http_gateway on the
service port) and to a pygazette broker's HTTP port, holding the same journals and content.
Status lines, headers (but Date and Server; names as sent) and bodies, trailers included, must
be identical once ports are masked.

Left out: `X-Fragment-Location` and `X-Fragment-Last-Modified`, which a fragment has once
persisted, and pygazette persists a fragment as soon as it closes (README, "Differences from
Gazette"); and authorization (Gazette's gateway signs its own RPCs with the broker's key,
whatever the request's `Authorization`: it refuses nothing, pygazette's passes the token on).
"""

from __future__ import annotations

import gzip
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import journal_spec
from tests.interop.test_json_api_vs_gazette import CURL, _serve_pygazette
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import GazetteBroker

pytestmark = [
    pytest.mark.skipif(not Path(CURL).exists(), reason="needs the curl binary"),
    pytest.mark.timeout(240),
]

CONTENT = {
    "gwt/plain": b"hello\nworld\n",
    "gwt/html": b"  <HTML><body>x</body></html>\n",
    "gwt/binary": bytes(range(256)),
    "gwt/gzip": gzip.compress(b"zipped\n", mtime=0),
    "gwt/png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 20,
    "gwt/json": b'{"a": 1, "b": [true, null]}\n' * 30,
    "gwt/late-binary": b"x" * 600 + b"\x00",  # Text in its first 512 bytes.
}
EMPTY = "gwt/empty"
READ_ONLY, WRITE_ONLY = "gwt/read-only", "gwt/write-only"
_HOSTPORT = re.compile(r"127\.0\.0\.1:[0-9]+")
_UNCOMPARED = ("x-fragment-location", "x-fragment-last-modified")  # (Lower case.)

Answer = tuple[str, list[tuple[str, str]], bytes]


def answer(base: str, args: list[str]) -> Answer:
    """Status line, headers (names as sent, sorted) and body (trailers included)."""
    out = subprocess.run(
        [CURL, "-s", "-i", "-m", "10", *[a.replace("BASE", base) for a in args]],
        capture_output=True,
        timeout=30,
        check=False,
    ).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = sorted(
        (k, _HOSTPORT.sub("HOST", v.strip()))
        for k, _, v in (line.partition(":") for line in lines[1:])
        if k.lower() not in ("date", "server", *_UNCOMPARED)
    )
    return lines[0], headers, _HOSTPORT.sub("HOST", body.decode("latin-1")).encode("latin-1")


def _prepare(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        specs = [journal_spec(name) for name in [*CONTENT, EMPTY]]
        specs += [
            journal_spec(READ_ONLY, flags=pb.JournalSpec.O_RDONLY),
            journal_spec(WRITE_ONLY, flags=pb.JournalSpec.O_WRONLY),
        ]
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in specs])
        assert stub.Apply(req).status == pb.OK
        for journal, content in CONTENT.items():
            deadline = time.monotonic() + 30
            while True:
                chunks = [pb.AppendRequest(journal=journal), pb.AppendRequest(content=content)]
                resp = stub.Append(iter([*chunks, pb.AppendRequest()]))
                if resp.status == pb.OK or time.monotonic() > deadline:
                    break  # (A journal just created may not have its primary yet.)
                time.sleep(0.05)
            assert resp.status == pb.OK, pb.Status.Name(resp.status)


@pytest.fixture
def pygazette_http(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    proc, base = _serve_pygazette(tmp_path / "pygazette")
    try:
        yield proc, base
    finally:
        proc.kill()


def _get(path: str, *extra: str) -> list[str]:
    return [*extra, f"BASE/{path}"]


CASES: list[list[str]] = [
    # Reads to the write head, typed by their first bytes.
    *[_get(journal) for journal in CONTENT],
    _get("gwt/plain?offset=3"),
    _get("gwt/plain?Offset=%2B3&BLOCK=false"),
    _get("gwt/plain?offset=1&offset=2"),
    _get("gwt/plain?offset=1&offset="),
    _get("gwt/plain?offset=&block="),
    _get("gwt/plain?offset"),
    _get("gwt/json?offset=100"),
    _get("gwt/late-binary?offset=90"),
    ["--http1.0", "BASE/gwt/plain?offset=5"],  # Not chunked: no trailer.
    # Headers only.
    ["-I", "BASE/gwt/plain"],
    ["-I", "BASE/gwt/plain?offset=7"],
    ["-I", "BASE/gwt/plain?offset=-1"],
    ["-I", "BASE/gwt/none"],
    # Refused: at or past the write head, no journal, a bad request.
    _get("gwt/plain?offset=-1"),
    _get("gwt/plain?offset=12"),
    _get("gwt/plain?offset=1000"),
    _get(EMPTY),
    _get("gwt/none"),
    _get("gwt/plain?offset=-2"),
    _get("bad%20name"),
    _get(""),
    *[
        _get(f"gwt/plain?{query}")
        for query in [
            "offset=x",
            "OFFSET=0x10",
            "offset=1_0",
            "offset=%20",
            "offset=99999999999999999999",
            "block=yes",
            "block=true&block=x",
            "block=on&offset=3",
            "foo=1",
            "=1",
            "offset.x=1",
            "offset=%zz",
            "offset=1&x=%4",
            "a;b",
            "foo=%C3%A9%ff",
        ]
    ],
    # Unclean paths: redirected to their clean form, as Go's ServeMux does.
    ["--path-as-is", "BASE//gwt/plain"],
    ["--path-as-is", "BASE/gwt/./plain?offset=3&x=%41"],
    ["--path-as-is", "-I", "BASE/gwt/../gwt/plain"],
    ["--path-as-is", "-X", "PUT", "BASE//gwt/plain", "--data-binary", "x"],
    ["--path-as-is", "BASE/gwt/a%20b/../plain;x"],
    ["--path-as-is", "BASE//debug/metrics"],
    _get("gwt/plain/"),
    # A journal named with a metadata suffix, and escaped.
    _get("gwt/plain;reader/a?offset=4"),
    ["-I", "BASE/gwt/plain;x"],
    _get("gwt%2Fplain?offset=4"),
    ["-X", "DELETE", "BASE/gwt/plain"],
    ["-X", "POST", "BASE/gwt/plain", "-d", "x"],
    ["-X", "OPTIONS", "BASE/gwt/plain"],
    # Appends.
    ["-X", "PUT", "BASE/gwt/none", "--data-binary", "abc"],
    ["-X", "PUT", "BASE/gwt/none", "--data-binary", ""],
    ["-X", "PUT", "BASE/gwt/plain?x=1", "--data-binary", "abc"],
    ["-X", "PUT", "BASE/bad%20name", "--data-binary", "abc"],
    ["-X", "PUT", f"BASE/{EMPTY}", "--data-binary", "more\n", "-H", "Expect:"],
    _get(EMPTY),
    ["-X", "PUT", f"BASE/{EMPTY}", "--data-binary", "", "-H", "Expect:"],
    _get(f"{EMPTY}?offset=2"),
    ["-X", "PUT", f"BASE/{EMPTY};meta", "--data-binary", "x", "-H", "Expect:"],
    ["-X", "PUT", f"BASE/{EMPTY}?", "--data-binary", "y", "-H", "Expect:"],
    _get(f"{EMPTY}?offset=6"),
    # Journals one may not read, or append to.
    ["-X", "PUT", f"BASE/{READ_ONLY}", "--data-binary", "x"],
    _get(READ_ONLY),
    ["-X", "PUT", f"BASE/{WRITE_ONLY}", "--data-binary", "x", "-H", "Expect:"],
    _get(WRITE_ONLY),
    ["-I", f"BASE/{WRITE_ONLY}"],
]


def test_journal_gateway_answers_as_gazettes(
    gazette: GazetteBroker, pygazette_http: tuple[BrokerProcess, str]
) -> None:
    proc, py_base = pygazette_http
    _prepare(gazette.address)
    _prepare(proc.address)
    differ = []
    for args in CASES:
        theirs, ours = answer(gazette.url, args), answer(py_base, args)
        if theirs != ours:
            differ.append((args, theirs, ours))
    assert differ == [], "\n".join(f"{a}\n  gazette:   {t}\n  pygazette: {o}" for a, t, o in differ)


def test_a_blocking_read_answers_as_gazettes(
    gazette: GazetteBroker, pygazette_http: tuple[BrokerProcess, str]
) -> None:
    """A blocking read at the write head: nothing (not even headers) until content comes,
    then the headers, typed by that content, and the content as it comes."""
    proc, py_base = pygazette_http
    _prepare(gazette.address)
    _prepare(proc.address)
    answers: dict[str, Answer] = {}

    def read(base: str) -> None:
        answers[base] = answer(base, ["-m", "4", "BASE/gwt/binary?offset=-1&block=true"])

    readers = [threading.Thread(target=read, args=(b,)) for b in (gazette.url, py_base)]
    for reader in readers:
        reader.start()
    time.sleep(1.5)  # (The reads wait at the head: nothing to wait on from here.)
    for base in (gazette.url, py_base):
        put = answer(base, ["-X", "PUT", "BASE/gwt/binary", "--data-binary", "<p>later\n"])
        assert put[0] == "HTTP/1.1 204 No Content", put
    for reader in readers:
        reader.join()
    theirs, ours = answers[gazette.url], answers[py_base]
    assert theirs[0] == "HTTP/1.1 206 Partial Content" and theirs[2] == b"<p>later\n", theirs
    assert ("Content-Type", "text/html; charset=utf-8") in theirs[1]
    assert theirs == ours
