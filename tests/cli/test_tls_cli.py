"""The CLI against brokers whose TLS handshake must fail: a server certificate expired, not
valid yet, or issued for another name, and an mTLS broker given a client certificate that
expired. Each fails in one line that names the cause (never by falling back to plaintext)."""

from __future__ import annotations

import datetime
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_journals_cli import cli, one_line_error
from tests.support.broker_process import BrokerProcess
from tests.support.ports import PortInUse, listens_on, output_since, says_port_taken
from tests.support.tls_material import TLSMaterial, generate_tls_material, issue_certificate

HOUR = datetime.timedelta(hours=1)


class UnverifiableBroker(BrokerProcess):
    """A TLS broker whose certificate no client accepts: it is ready once it completes a TLS
    handshake that checks nothing (the usual readiness check is a verified gRPC channel)."""

    def _wait_listening(self, timeout: float, offset: int) -> None:
        port = self._port.peek()
        deadline = time.monotonic() + timeout
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                output = output_since(self.log_path, offset)
                if says_port_taken(output):
                    raise PortInUse(f"port {port} was taken:\n{output[-2000:]}")
                raise RuntimeError(f"broker exited early:\n{self.log()}")
            if listens_on(self.proc.pid, port):
                try:
                    with (
                        socket.create_connection(("127.0.0.1", port), timeout=1) as sock,
                        ctx.wrap_socket(sock),
                    ):
                        return
                except OSError:
                    pass
            time.sleep(0.02)
        raise TimeoutError(f"broker did not serve TLS on port {port}:\n{self.log()}")


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    return generate_tls_material(tmp_path_factory.mktemp("cli-tls"))


def tls_broker(tmp: Path, cert: Path, key: Path, ca: Path | None = None) -> BrokerProcess:
    flags = ["--server-cert-file", str(cert), "--server-cert-key-file", str(key)]
    if ca is not None:
        flags += ["--server-ca-file", str(ca)]
    tmp.mkdir(parents=True)
    return UnverifiableBroker(tmp / "data", extra_args=flags)


@pytest.fixture
def broker_with(tmp_path: Path, material: TLSMaterial) -> Iterator[dict[str, BrokerProcess]]:
    """Brokers serving TLS with certificates expired, not valid yet, and for another name."""
    m = material
    expired = issue_certificate(m, "expired", valid_from=-48 * HOUR, valid_until=-HOUR)
    future = issue_certificate(m, "future", valid_from=24 * HOUR, valid_until=48 * HOUR)
    elsewhere = issue_certificate(m, "elsewhere", names=("broker.example.com",))
    brokers = {
        "expired": tls_broker(tmp_path / "expired", *expired),
        "future": tls_broker(tmp_path / "future", *future),
        "elsewhere": tls_broker(tmp_path / "elsewhere", *elsewhere),
        "mtls": tls_broker(tmp_path / "mtls", m.server_cert, m.server_key, m.ca),
    }
    try:
        for b in brokers.values():
            b.start()
        yield brokers
    finally:
        for b in brokers.values():
            b.kill()


def https(broker: BrokerProcess, host: str = "127.0.0.1") -> str:
    return f"https://{host}:{broker.port}"


def test_unusable_certificates_fail_in_one_line_naming_the_cause(
    broker_with: dict[str, BrokerProcess], material: TLSMaterial
) -> None:
    m = material
    trust = ["--broker-trusted-ca-file", str(m.ca)]

    def error(url: str, *flags: str) -> str:
        return one_line_error(cli(url, *trust, *flags, "journals", "list", timeout=60))

    line = error(https(broker_with["expired"]))
    assert "certificate has expired" in line, line
    assert "the server's certificate has expired" in line, line
    assert "not signed by a CA" not in line, line

    line = error(https(broker_with["future"]))
    assert "certificate is not yet valid" in line, line
    assert "the server's certificate is not valid yet" in line, line
    assert "not signed by a CA" not in line, line

    # Each broker said so as it started (a certificate is read once, at start).
    assert "the server certificate is not valid now: certificate" in broker_with["expired"].log()
    assert "expired at" in broker_with["expired"].log()
    assert "is not valid before" in broker_with["future"].log()
    assert "not valid now" not in broker_with["mtls"].log()

    for host in ("127.0.0.1", "localhost"):
        line = error(https(broker_with["elsewhere"], host))
        assert f"the server's certificate is not valid for {host}" in line, line

    # An mTLS broker refuses a client certificate that expired: the client says which.
    expired_cert, expired_key = issue_certificate(
        m, "expired-client", valid_from=-48 * HOUR, valid_until=-HOUR
    )
    line = error(
        https(broker_with["mtls"]),
        "--broker-cert-file",
        str(expired_cert),
        "--broker-cert-key-file",
        str(expired_key),
    )
    assert "does not accept the client certificate" in line, line
    assert f"certificate {str(expired_cert)!r} expired at" in line, line
    # A valid client certificate is accepted (the broker itself is fine).
    listed = cli(
        https(broker_with["mtls"]),
        *trust,
        "--broker-cert-file",
        str(m.client_cert),
        "--broker-cert-key-file",
        str(m.client_key),
        "journals",
        "list",
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr.decode()
    # The same with gazctl's spellings of the flags, after the command as gazctl takes them.
    listed = cli(
        https(broker_with["mtls"]),
        "journals",
        "list",
        f"--broker.trusted-ca-file={m.ca}",
        "--broker.cert-file",
        str(m.client_cert),
        "--broker.cert-key-file",
        str(m.client_key),
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr.decode()
