"""Throwaway TLS material for tests: a CA, a server certificate (SANs 127.0.0.1 and localhost,
usable for both server and client auth, as brokers present it to peers too), a client
certificate, and a second, unrelated CA with its own client certificate. Written as PEM files
to a directory.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TLSMaterial:
    """Paths of the generated PEM files."""

    ca: Path  # The CA certificate.
    server_cert: Path  # Signed by `ca`; SANs 127.0.0.1, localhost; server + client auth.
    server_key: Path
    client_cert: Path  # Signed by `ca`; client auth.
    client_key: Path
    other_ca: Path  # An unrelated CA ...
    other_client_cert: Path  # ... and a client certificate it signed.
    other_client_key: Path
    ca_key: Path  # The CA's private key, for `issue_certificate`.


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    common_name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    server: bool,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("localhost"),
                ]
            ),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def generate_tls_material(directory: Path) -> TLSMaterial:
    """Generate fresh material into `directory` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    m = TLSMaterial(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        other_ca=directory / "other-ca.pem",
        other_client_cert=directory / "other-client.pem",
        other_client_key=directory / "other-client-key.pem",
        ca_key=directory / "ca-key.pem",
    )
    ca = _ca("pygazette test CA")
    other = _ca("unrelated test CA")
    for cert_path, key_path, (cert, key) in [
        (m.server_cert, m.server_key, _leaf("pygazette server", ca, server=True)),
        (m.client_cert, m.client_key, _leaf("pygazette client", ca, server=False)),
        (
            m.other_client_cert,
            m.other_client_key,
            _leaf("stranger client", other, server=False),
        ),
    ]:
        _write_cert(cert_path, cert)
        _write_key(key_path, key)
    _write_cert(m.ca, ca[0])
    _write_key(m.ca_key, ca[1])
    _write_cert(m.other_ca, other[0])
    return m


def issue_certificate(
    m: TLSMaterial,
    stem: str,
    *,
    valid_from: datetime.timedelta = -datetime.timedelta(hours=1),
    valid_until: datetime.timedelta = datetime.timedelta(days=2),
    names: tuple[str, ...] = ("127.0.0.1", "localhost"),
) -> tuple[Path, Path]:
    """A server-and-client certificate signed by `m.ca`, valid from now + `valid_from` to now +
    `valid_until` (either may be past or future), for `names` (IP addresses or DNS names);
    written next to `m`'s files as `<stem>.pem` and `<stem>-key.pem`."""
    ca_cert = x509.load_pem_x509_certificate(m.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(m.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(stem))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + valid_from)
        .not_valid_after(now + valid_until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = m.ca.parent / f"{stem}.pem", m.ca.parent / f"{stem}-key.pem"
    _write_cert(cert_path, cert)
    _write_key(key_path, key)
    return cert_path, key_path
