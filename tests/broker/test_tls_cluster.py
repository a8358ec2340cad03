"""TLS and mTLS broker pairs on a real etcd that itself requires TLS client certificates:
appends, reads, proxying and replication over TLS; and the clear one-line failures of a
plaintext client, a client without a certificate, and a certificate from another CA."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pygazette.auth.tls import ClientTLS
from pygazette.client.appender import append
from pygazette.client.journal_client import JournalClient
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster, append_once, read_range
from tests.support.etcd_process import EtcdProcess, etcd_binary
from tests.support.tls_material import TLSMaterial, generate_tls_material

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    return generate_tls_material(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_etcd(
    tmp_path_factory: pytest.TempPathFactory, material: TLSMaterial
) -> Iterator[EtcdProcess]:
    """An etcd serving https:// only, requiring client certificates of the test CA."""
    if etcd_binary() is None:
        pytest.fail("etcd is not installed; run .ci/install-system-deps")
    proc = EtcdProcess(tmp_path_factory.mktemp("etcd-tls") / "data", tls=material)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def cli(*args: str, env_vars: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **(env_vars or {}))
    env.pop("GRPC_VERBOSITY", None)  # The CLI quiets gRPC's own handshake logging itself.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pygazette.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def client_flags(
    ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> list[str]:
    flags = []
    if ca:
        flags += ["--broker-trusted-ca-file", str(ca)]
    if cert and key:
        flags += ["--broker-cert-file", str(cert), "--broker-cert-key-file", str(key)]
    return flags


async def exercise_pair(cluster: Cluster, journal: str) -> None:
    """Replication 2 over TLS: append through both brokers (one proxies to the primary),
    read everything back from both (each replica holds it), with a pygazette client too."""
    b1, b2 = cluster.brokers
    spec = journal_spec(journal, replication=2, length=1 << 16)
    assert (await apply_specs(cluster.stub(b1), spec)).status == pb.OK
    await cluster.wait_ready([journal], 2)
    primary = cluster.primary_of(journal)
    assert primary is not None
    # Brokers advertise https:// endpoints.
    route, _ = cluster.route(journal)
    assert all(e.startswith("https://127.0.0.1:") for e in route.endpoints), route

    expected = bytearray()
    for i in range(10):
        broker = cluster.brokers[i % 2]  # Half of these go through the non-primary.
        data = f"record-{i}\n".encode() * (i + 1) * 50
        resp = await append_once(cluster.stub(broker), journal, data)
        assert resp.status == pb.OK, resp
        assert resp.header.process_id.suffix == primary.suffix
        assert resp.commit.sum == sha1sum_from_digest(hashlib.sha1(data).digest())
        assert resp.commit.begin == len(expected)
        expected += data
    for broker in cluster.brokers:
        content, head = await read_range(cluster.stub(broker), journal)
        assert head == len(expected)
        assert content == bytes(expected)

    # The pygazette client over https://, through the non-primary.
    other = b2 if primary is b1 else b1
    async with JournalClient(other.url, tls=cluster.tls) as client:
        resp = await append(client, journal, b"through the client\n")
        assert resp.commit.end == len(expected) + len(b"through the client\n")


async def test_tls_broker_pair(
    tmp_path: Path, tls_etcd: EtcdProcess, etcd_root: str, material: TLSMaterial
) -> None:
    server_flags = [
        "--server-cert-file",
        str(material.server_cert),
        "--server-cert-key-file",
        str(material.server_key),
        "--peer-ca-file",  # No --server-ca-file: peers need to be told what to trust.
        str(material.ca),
    ]
    cluster = Cluster(
        tmp_path, tls_etcd, etcd_root, broker_args=server_flags, tls=ClientTLS(material.ca)
    )
    b1, _ = cluster.add("zone-a", "broker-tls-1"), cluster.add("zone-b", "broker-tls-2")
    try:
        await cluster.start()
        await exercise_pair(cluster, "tls/pair")

        # The CLI reads and appends over https:// with the CA.
        ok = cli(
            "--broker",
            b1.url,
            *client_flags(material.ca),
            "journals",
            "read",
            "-l",
            "name=tls/pair",
        )
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith("record-0\n")

        # A plaintext client of a TLS broker.
        plain = one_line_error(cli("--broker", f"http://127.0.0.1:{b1.port}", "journals", "list"))
        assert f"broker unavailable at http://127.0.0.1:{b1.port}:" in plain
        assert "it may require TLS (use an https:// address" in plain
        # A TLS client that doesn't trust the server's CA (the system roots, or another CA).
        for flags in ([], client_flags(material.other_ca)):
            untrusted = one_line_error(cli("--broker", b1.url, *flags, "journals", "list"))
            assert (
                f"broker unavailable at {b1.url}: TLS handshake failed (certificate verify "
                "failed" in untrusted
            ), untrusted
        # TLS material with an http:// address.
        mixed = one_line_error(
            cli(
                "--broker",
                f"http://127.0.0.1:{b1.port}",
                *client_flags(material.ca),
                "journals",
                "list",
            )
        )
        assert "not an https:// address" in mixed

        # An https:// client of a plaintext server.
        plain_server = await asyncio.to_thread(_plaintext_server_error, material)
        assert "the server does not speak TLS (use an http:// address)" in plain_server
    finally:
        await cluster.close()


def _plaintext_server_error(material: TLSMaterial) -> str:
    """The CLI's error for an https:// address of a plaintext gRPC server."""
    server = grpc.server(thread_pool=__import__("concurrent.futures").futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        return one_line_error(
            cli(
                "--broker",
                f"https://127.0.0.1:{port}",
                *client_flags(material.ca),
                "journals",
                "list",
            )
        )
    finally:
        server.stop(None)


async def test_mtls_broker_pair(
    tmp_path: Path, tls_etcd: EtcdProcess, etcd_root: str, material: TLSMaterial
) -> None:
    # Peers present the server certificate (it allows client auth) and trust the server CA.
    server_flags = [
        "--server-cert-file",
        str(material.server_cert),
        "--server-cert-key-file",
        str(material.server_key),
        "--server-ca-file",
        str(material.ca),
    ]
    client_tls = ClientTLS(material.ca, material.client_cert, material.client_key)
    cluster = Cluster(tmp_path, tls_etcd, etcd_root, broker_args=server_flags, tls=client_tls)
    b1, _ = cluster.add("zone-a", "broker-mtls-1"), cluster.add("zone-b", "broker-mtls-2")
    try:
        await cluster.start()
        await exercise_pair(cluster, "mtls/pair")

        good = cli(
            "--broker",
            b1.url,
            *client_flags(material.ca, material.client_cert, material.client_key),
            "journals",
            "list",
        )
        assert good.returncode == 0, good.stderr
        assert "mtls/pair" in good.stdout

        # Without a client certificate.
        nocert = one_line_error(
            cli("--broker", b1.url, *client_flags(material.ca), "journals", "list")
        )
        assert f"broker unavailable at {b1.url}: TLS handshake failed" in nocert
        assert "requires a client certificate (mTLS), and none was given" in nocert
        # With a certificate of another CA.
        stranger = one_line_error(
            cli(
                "--broker",
                b1.url,
                *client_flags(material.ca, material.other_client_cert, material.other_client_key),
                "journals",
                "list",
            )
        )
        assert f"broker unavailable at {b1.url}: TLS handshake failed" in stranger
        assert "does not accept the client certificate" in stranger
        # Environment variables as gazctl names them.
        env_ok = cli(
            "journals",
            "list",
            env_vars={
                "BROKER_ADDRESS": b1.url,
                "BROKER_CERT_FILE": str(material.client_cert),
                "BROKER_CERT_KEY_FILE": str(material.client_key),
                "BROKER_TRUSTED_CA_FILE": str(material.ca),
            },
        )
        assert env_ok.returncode == 0, env_ok.stderr

        # The pygazette client fails the same way, as an UNAVAILABLE RPC error.
        async with JournalClient(b1.url, tls=ClientTLS(material.ca)) as client:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in client.stub.List(pb.ListRequest(), timeout=10):
                    pass
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await cluster.close()


async def test_etcd_tls_needs_a_client_certificate(
    tls_etcd: EtcdProcess, etcd_root: str, material: TLSMaterial
) -> None:
    ks = EtcdKeyspace(tls_etcd.url, etcd_root, tls=tls_etcd.client_tls)
    await ks.open()
    await ks.close()
    with pytest.raises(ValueError, match="not an https:// URL"):
        EtcdKeyspace(tls_etcd.url.replace("https", "http"), etcd_root, tls=tls_etcd.client_tls)


def test_serve_reports_bad_tls_files_in_one_line(tmp_path: Path, material: TLSMaterial) -> None:
    missing = one_line_error(
        cli(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--port",
            "0",
            "--server-cert-file",
            str(tmp_path / "none.pem"),
            "--server-cert-key-file",
            str(material.server_key),
        )
    )
    assert "none.pem" in missing and "cannot read certificate file" in missing
    mismatch = one_line_error(
        cli(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--port",
            "0",
            "--server-cert-file",
            str(material.server_cert),
            "--server-cert-key-file",
            str(material.client_key),
        )
    )
    assert "does not match certificate" in mismatch
    no_https = one_line_error(
        cli(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--port",
            "0",
            "--etcd",
            "http://127.0.0.1:1",
            "--etcd-trusted-ca-file",
            str(material.ca),
        )
    )
    assert "need an https:// --etcd URL" in no_https
