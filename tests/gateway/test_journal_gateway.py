"""The HTTP journal gateway of real broker processes, driven with the real `curl` binary."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from pygazette.protocol.fragment_name import fragment_file_name, sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.support.broker_process import BrokerProcess
from tests.support.cluster import Cluster, read_range
from tests.support.etcd_process import EtcdProcess
from tests.support.http_scrape import scrape, value, wait_status
from tests.support.ports import free_port

CURL = shutil.which("curl") or "/usr/bin/curl"
MAX_INT64 = (1 << 63) - 1

pytestmark = pytest.mark.skipif(not Path(CURL).exists(), reason="needs the curl binary")


class Curl:
    """One curl invocation: status, headers and trailers (lower-cased names) and body."""

    def __init__(self, args: list[str], *, timeout: float = 30.0) -> None:
        with tempfile.NamedTemporaryFile() as dump:
            proc = subprocess.run(
                [CURL, "-sS", "-D", dump.name, *args],
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            head = Path(dump.name).read_bytes()
        self.returncode = proc.returncode
        self.body = proc.stdout
        head, _, trailers = head.partition(b"\r\n\r\n")
        while head.startswith(b"HTTP/1.1 1"):  # An interim response (100 Continue).
            head, _, trailers = trailers.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1]) if lines and lines[0] else 0
        self.headers = _fields(lines[1:])
        self.trailers = _fields(trailers.decode().split("\r\n"))


def _fields(lines: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, val = line.partition(":")
            fields[name.strip().lower()] = val.strip()
    return fields


async def curl(*args: str, within: float = 30.0) -> Curl:
    return await asyncio.to_thread(Curl, list(args), timeout=within)


@pytest.fixture(scope="module")
def gateway_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    http_port = free_port()
    proc = BrokerProcess(
        tmp_path_factory.mktemp("gateway") / "data", extra_args=["--http-port", str(http_port)]
    )
    proc.start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_status(base + "/debug/ready")
        yield proc, base
    finally:
        proc.kill()


@pytest.fixture
async def stub(
    gateway_broker: tuple[BrokerProcess, str],
) -> AsyncIterator[pb_grpc.JournalStub]:
    async with grpc.aio.insecure_channel(gateway_broker[0].address) as channel:
        yield pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]


async def test_put_appends_and_get_reads(
    gateway_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub, tmp_path: Path
) -> None:
    proc, base = gateway_broker
    journal = "gateway/put-get"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK

    first = b"hello, gateway\n"
    put = await curl("-X", "PUT", "--data-binary", "@-", f"{base}/{journal}", "-o", "/dev/null")
    assert put.status == 204  # An empty body appends nothing, and commits.
    body_file = tmp_path / "body"
    body_file.write_bytes(first)
    put = await curl("-X", "PUT", "--data-binary", f"@{body_file}", f"{base}/{journal}")
    assert put.status == 204, put.body
    assert put.headers["x-commit-begin"] == "0"
    assert put.headers["x-commit-end"] == str(len(first))
    assert put.headers["x-write-head"] == str(len(first))
    assert put.headers["x-commit-sha1-sum"] == hashlib.sha1(first).hexdigest()
    assert put.headers["location"] == f"{proc.url}/{journal}"
    assert put.headers["x-route-token"]

    # A larger body streams (chunked, no Content-Length) into one atomic append.
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB.
    big_file = tmp_path / "big"
    big_file.write_bytes(big)
    put = await curl(
        "-X", "PUT", "-H", "Transfer-Encoding: chunked", "-T", str(big_file), f"{base}/{journal}"
    )
    assert put.status == 204, put.body
    assert int(put.headers["x-commit-end"]) - int(put.headers["x-commit-begin"]) == len(big)
    assert put.headers["x-commit-sha1-sum"] == hashlib.sha1(big).hexdigest()
    content, _ = await read_all(stub, journal)
    assert content == first + big

    # GET from an offset: 206, Gazette's headers, and the content to the write head.
    head = len(first) + len(big)
    got = await curl(f"{base}/{journal}?offset=7")
    assert got.status == 206
    assert got.body == (first + big)[7:]
    assert got.headers["content-range"] == f"bytes 7-{MAX_INT64}/{MAX_INT64}"
    assert got.headers["x-write-head"] == str(head)
    # Typed by its first bytes, as Go's server types it; why it ended in its trailer.
    assert got.headers["content-type"] == "text/plain; charset=utf-8"
    assert got.trailers == {"x-close-error": "OFFSET_NOT_YET_AVAILABLE"}
    _, metas = await read_all(stub, journal, offset=7)
    frag = next(m.fragment for m in metas if m.HasField("fragment"))
    assert got.headers["x-fragment-name"] == fragment_file_name(frag)
    # The route as Gazette's gateway writes it (gogo's CompactTextString; primary 0 left out).
    member = metas[0].header.route.members[0]
    token = f'members:<zone:"{member.zone}" suffix:"{member.suffix}" > endpoints:"{proc.url}"'
    assert got.headers["x-route-token"] == put.headers["x-route-token"] == token

    # HEAD: the same metadata, no body.
    meta = await curl("-I", "-o", "/dev/null", f"{base}/{journal}?offset=3")
    assert meta.status == 206
    assert meta.body == b""
    assert meta.headers["content-range"] == f"bytes 3-{MAX_INT64}/{MAX_INT64}"
    assert meta.headers["x-write-head"] == str(head)
    assert "x-fragment-name" in meta.headers
    assert "content-type" not in meta.headers

    # Offset -1 reads from the write head: a non-blocking read has nothing there.
    at_head = await curl(f"{base}/{journal}?offset=-1")
    assert at_head.status == 416
    assert at_head.headers["x-write-head"] == str(head)


async def test_blocking_get_streams_new_appends(
    gateway_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = gateway_broker
    journal = "gateway/blocking"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    assert (await append(stub, journal, b"old\n")).status == pb.OK

    # curl waits on the blocking read; appends reach it as they commit.
    reader = await asyncio.create_subprocess_exec(
        CURL, "-sS", "-N", "--max-time", "20", f"{base}/{journal}?offset=4&block=true",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert reader.stdout is not None
        await asyncio.sleep(0.3)  # Let the read open (appends before it would still arrive).
        assert (await append(stub, journal, b"new-1\n")).status == pb.OK
        assert (await append(stub, journal, b"new-2\n")).status == pb.OK
        got = b""
        async with asyncio.timeout(15):
            while got != b"new-1\nnew-2\n":
                chunk = await reader.stdout.read(1024)
                assert chunk, got
                got += chunk
    finally:
        if reader.returncode is None:
            reader.kill()
        await reader.wait()


async def test_error_statuses(
    gateway_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    _, base = gateway_broker
    journal = "gateway/errors"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    assert (await append(stub, journal, b"0123456789")).status == pb.OK

    missing = await curl(f"{base}/gateway/no-such-journal")
    assert missing.status == 404
    assert missing.body == b"JOURNAL_NOT_FOUND\n"
    put_missing = await curl("-X", "PUT", "--data-binary", "x", f"{base}/gateway/no-such-journal")
    # Gazette's gateway answers what its client.Appender returns: a 500 for any status.
    assert (put_missing.status, put_missing.body) == (500, b"JOURNAL_NOT_FOUND\n")

    past_head = await curl(f"{base}/{journal}?offset=11")
    assert past_head.status == 416
    assert past_head.body == b"OFFSET_NOT_YET_AVAILABLE\n"
    assert past_head.headers["x-write-head"] == "10"

    assert (await curl(f"{base}/{journal}?offset=abc")).status == 400
    assert (await curl(f"{base}/{journal}?unknown=1")).status == 400
    assert (await curl(f"{base}/{journal}?offset=-2")).status == 400
    assert (
        await curl("-X", "PUT", "--data-binary", "x", f"{base}/{journal}?offset=1")
    ).status == 400
    assert (await curl("-X", "POST", "--data-binary", "x", f"{base}/{journal}")).status == 400
    assert (await curl(f"{base}/bad%20journal")).status == 400

    # Nothing was appended by the refused requests.
    content, _ = await read_all(stub, journal)
    assert content == b"0123456789"


@pytest.mark.slow
async def test_get_is_proxied_to_the_primary(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    cluster = Cluster(tmp_path, etcd, etcd_root)
    brokers = [cluster.add("zone-a", "broker-1"), cluster.add("zone-b", "broker-2")]
    http = {}
    for b in brokers:
        port = free_port()
        b.extra_args += ["--http-port", str(port)]
        http[b.suffix] = f"http://127.0.0.1:{port}"
    try:
        await cluster.start()
        journal = "gateway/proxied"
        resp = await apply_specs(cluster.stub(brokers[0]), journal_spec(journal))
        assert resp.status == pb.OK
        await cluster.wait_ready([journal], 1)
        primary = cluster.primary_of(journal)
        assert primary is not None
        other = next(b for b in brokers if b is not primary)
        for b in brokers:
            await asyncio.to_thread(wait_status, http[b.suffix] + "/debug/ready")

        # Appended through the broker that is not the journal's primary; read through it too.
        data = b"proxied record\n" * 100
        put = await curl("-X", "PUT", "--data-binary", "@-", f"{http[other.suffix]}/{journal}")
        assert put.status == 204  # (Empty body.)
        body = cluster.tmp / "body"
        body.write_bytes(data)
        put = await curl(
            "-X", "PUT", "--data-binary", f"@{body}", f"{http[other.suffix]}/{journal}"
        )
        assert put.status == 204, put.body
        assert put.headers["location"] == f"{primary.url}/{journal}"
        got = await curl(f"{http[other.suffix]}/{journal}?offset=0")
        assert got.status == 206
        assert got.body == data
        assert got.headers["location"] == f"{primary.url}/{journal}"
        assert got.headers["x-write-head"] == str(len(data))
        content, _ = await read_range(cluster.stub(primary), journal)
        assert content == data

        # Cluster state in the metrics: membership, lease, assignments.
        samples = await asyncio.to_thread(scrape, http[primary.suffix])
        assert value(samples, "gazette_allocator_members") == 2
        assert value(samples, "pygazette_etcd_lease", state="alive") == 1
        assert value(samples, "pygazette_allocator_local_assignments", role="primary") >= 1
        assert value(samples, "pygazette_broker_journals", role="primary") >= 1
        assert value(samples, "gazette_write_head", journal=journal) == len(data)
    finally:
        await cluster.close()


async def test_authorization_header_is_forwarded(tmp_path: Path) -> None:
    from pygazette.auth.capability import Capability
    from pygazette.auth.claims import Claims
    from pygazette.auth.keyed_auth import KeyedAuth

    keys = "c2VjcmV0LWdhdGV3YXkta2V5"  # base64("secret-gateway-key")
    auth = KeyedAuth(keys)
    http_port = free_port()
    proc = BrokerProcess(
        tmp_path / "data", extra_args=["--http-port", str(http_port), "--auth-keys", keys]
    )
    base = f"http://127.0.0.1:{http_port}"
    journal = "gateway/authorized"

    def bearer(cap: int) -> str:
        return f"Authorization: Bearer {auth.sign(Claims(cap))}"

    try:
        await asyncio.to_thread(proc.start)
        await asyncio.to_thread(wait_status, base + "/debug/ready")
        async with grpc.aio.insecure_channel(proc.address) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=journal_spec(journal))])
            applied = await stub.Apply(req, metadata=auth.metadata(Claims(Capability.APPLY)))
            assert applied.status == pb.OK

        for _ in range(20):  # The broker's refusal races the body's writes: never a 500.
            no_token = await curl("-X", "PUT", "--data-binary", "x", f"{base}/{journal}")
            assert no_token.status == 401, no_token.body
        read_only = await curl(
            "-X", "PUT", "--data-binary", "x", "-H", bearer(Capability.READ), f"{base}/{journal}"
        )
        assert read_only.status == 403, read_only.body
        wrong_key = KeyedAuth("b3RoZXIta2V5").sign(Claims(Capability.ALL))
        forged = await curl(
            "-X", "PUT", "--data-binary", "x", "-H", f"Authorization: Bearer {wrong_key}",
            f"{base}/{journal}",
        )  # fmt: skip
        assert forged.status in (401, 403), forged.body
        # A header gRPC cannot carry (not printable ASCII) is an unusable token: 401, and no
        # RPC, not a 500 "Invalid metadata" and three lines of gRPC errors in the log each.
        for method in (["-X", "GET"], ["-X", "PUT", "--data-binary", "x"]):
            bad = await curl(*method, "-H", "Authorization: Bearer caf\u00e9", f"{base}/{journal}")
            assert bad.status == 401, bad.body
            assert b"printable ASCII" in bad.body
        assert "Illegal header value" not in proc.log_path.read_text()
        ok = await curl(
            "-X", "PUT", "--data-binary", "record\n", "-H", bearer(Capability.APPEND),
            f"{base}/{journal}",
        )  # fmt: skip
        assert ok.status == 204, ok.body

        assert (await curl(f"{base}/{journal}")).status == 401
        assert (await curl("-H", bearer(Capability.APPEND), f"{base}/{journal}")).status == 403
        got = await curl("-H", bearer(Capability.READ), f"{base}/{journal}")
        assert got.status == 206
        assert got.body == b"record\n"
    finally:
        proc.kill()


async def test_https_with_client_certificates(tmp_path: Path) -> None:
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
            "--server-ca-file", str(m.ca),  # mTLS: clients must present a certificate.
            "--peer-ca-file", str(m.ca),
        ],
        tls=ClientTLS(m.ca, m.client_cert, m.client_key),
    )  # fmt: skip
    base = f"https://127.0.0.1:{http_port}"
    tls = ["--cacert", str(m.ca), "--cert", str(m.client_cert), "--key", str(m.client_key)]
    journal = "gateway/tls"
    try:
        await asyncio.to_thread(proc.start)
        credentials = channel_credentials(ClientTLS(m.ca, m.client_cert, m.client_key))
        async with grpc.aio.secure_channel(proc.address, credentials) as channel:
            stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
            assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK

        ready = await curl(*tls, f"{base}/debug/ready")
        assert ready.status == 200
        put = await curl(*tls, "-X", "PUT", "--data-binary", "secure\n", f"{base}/{journal}")
        assert put.status == 204, put.body
        got = await curl(*tls, f"{base}/{journal}")
        assert (got.status, got.body) == (206, b"secure\n")
        # Without a client certificate the TLS handshake is refused; plain HTTP gets nowhere.
        assert (await curl("--cacert", str(m.ca), f"{base}/debug/ready")).status == 0
        assert (await curl(f"http://127.0.0.1:{http_port}/debug/ready")).status in (0, 400)
    finally:
        proc.kill()


async def test_get_ends_at_an_offset_jump(
    gateway_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    """A jump in offsets after content was written ends the response (as Gazette's gateway:
    the client retries from where it got to); the content past the gap is never written
    right after the content before it, as if the two were contiguous."""
    proc, base = gateway_broker
    journal = "gateway/offset-jump"
    # Two fragments in the journal's store, with a gap [5, 10) between them (one removed by
    # hand, or lost).
    for begin, data in ((0, b"hello"), (10, b"world")):
        frag = pb.Fragment(
            journal=journal, begin=begin, end=begin + len(data), compression_codec=pb.NONE
        )
        frag.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(data).digest()))
        path = proc.file_root / journal / fragment_file_name(frag)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        old = time.time() - 7 * 3600  # A broker jumps a gap only before fragments this old.
        os.utime(path, (old, old))
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    content, metas = await read_all(stub, journal)
    assert content == b"helloworld"
    assert [m.offset for m in metas if m.HasField("fragment")] == [0, 10]  # The broker jumps.

    got = await curl(f"{base}/{journal}?offset=0")
    assert got.status == 206
    assert got.headers["content-range"] == f"bytes 0-{MAX_INT64}/{MAX_INT64}"
    assert got.body == b"hello"  # Not b"helloworld": bytes 5-9 are not "world".
    # A retry from where it got to is told of the jump (Content-Range) and reads on.
    again = await curl(f"{base}/{journal}?offset=5")
    assert again.headers["content-range"] == f"bytes 10-{MAX_INT64}/{MAX_INT64}"
    assert again.body == b"world"


async def test_a_journal_named_with_a_metadata_suffix(
    gateway_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub
) -> None:
    """`<journal>;<meta>` names the journal (readers add such a suffix, as Gazette's do): the
    broker resolves it without the suffix, for reads and appends alike (Gazette's
    StripMeta), through the gateway and over gRPC."""
    _, base = gateway_broker
    journal = "gateway/with-meta"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK

    put = await curl("-X", "PUT", "--data-binary", "one\n", f"{base}/{journal};reader/a")
    assert put.status == 204, put.body
    assert (await append(stub, f"{journal};reader/b", b"two\n")).status == pb.OK
    content, _ = await read_all(stub, journal)
    assert content == b"one\ntwo\n"

    got = await curl(f"{base}/{journal};reader/a?offset=4")
    assert got.status == 206, got.body
    assert got.body == b"two\n"
    content, metas = await read_all(stub, f"{journal};reader/b")
    assert content == b"one\ntwo\n"
    assert metas[0].fragment.journal == journal


def _open_reads(base: str) -> float:
    """Read RPCs the broker started and has not completed (the parser names a counter's
    samples <name>_total)."""
    samples = scrape(base)
    started = value(samples, "gazette_journal_server_started_totals_total", operation="Read")
    completed = sum(
        v
        for (name, labels), v in samples.items()
        if name == "gazette_journal_server_completed_totals_total"
        and ("operation", "Read") in labels
    )
    return started - completed


async def _wait_open_reads(base: str, want: float, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while (have := await asyncio.to_thread(_open_reads, base)) != want:
        assert time.monotonic() < deadline, f"{have} open Read RPCs, not {want}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("offset", ["-1", "0"], ids=["waiting-for-its-first-byte", "streaming"])
async def test_a_blocking_get_whose_client_went_away_ends_its_read(
    gateway_broker: tuple[BrokerProcess, str], stub: pb_grpc.JournalStub, offset: str
) -> None:
    """A client leaving a blocking GET ends its Read RPC, as Gazette's gateway (whose read
    runs under the HTTP request's context) does: at the head of an idle journal, before any
    byte (offset -1) or after some (offset 0), the gateway would otherwise hold the broker's
    blocking read open for as long as nothing is appended, one per abandoned request."""
    _, base = gateway_broker
    journal = f"gateway/abandoned{offset}"
    assert (await apply_specs(stub, journal_spec(journal))).status == pb.OK
    assert (await append(stub, journal, b"content\n")).status == pb.OK
    # Reads left by earlier tests' clients end (as this test checks): none is open here.
    await _wait_open_reads(base, 0)
    before = 0
    reader = await asyncio.create_subprocess_exec(
        CURL, "-sS", "-N", "--max-time", "30", f"{base}/{journal}?offset={offset}&block=true",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert reader.stdout is not None
        if offset == "0":
            assert await reader.stdout.readexactly(8) == b"content\n"
        await _wait_open_reads(base, before + 1)
    finally:
        if reader.returncode is None:
            reader.kill()
        await reader.wait()
    await _wait_open_reads(base, before)
