"""TLS material of servers and clients, as Gazette configures it (`server.BuildTLSConfig`).

`ServerTLS(cert_file, key_file, ca_file)` is what a server presents; with `ca_file` the server
requires client certificates and verifies them against it (mTLS), without it client
certificates are not asked for. `ClientTLS(ca_file, cert_file, key_file)` is what a client
trusts (`ca_file`; the system roots when absent) and optionally presents (`cert_file` and
`key_file`, for mTLS).

They turn into `grpc` credentials (`server_credentials`, `channel_credentials`) and into
`ssl.SSLContext`s (`server_ssl_context`, `client_ssl_context`) for HTTP endpoints. Every file
is read and checked when credentials are built (at start-up, not at the first RPC): a missing,
unreadable or non-PEM file, or a key that does not match its certificate, is a
`TLSConfigError` naming the file.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    # `cryptography` is imported where files are checked: a plaintext client needs none of it.
    from cryptography import x509

__all__ = [
    "ClientTLS",
    "ServerTLS",
    "TLSConfigError",
    "certificate_validity_problem",
    "channel_credentials",
    "check_client",
    "check_server",
    "client_ssl_context",
    "client_tls_from_files",
    "explain_connect_failure",
    "load_ca",
    "load_key_pair",
    "peer_tls_from_files",
    "server_credentials",
    "server_ssl_context",
    "server_tls_from_files",
]

Pathish = str | Path


class TLSConfigError(ValueError):
    """TLS material that cannot be used (the message names the file)."""


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """A server's certificate and key, and the CA that client certificates must chain to
    (given: mTLS, client certificates are required)."""

    cert_file: Pathish
    key_file: Pathish
    ca_file: Pathish | None = None

    @property
    def mutual(self) -> bool:
        return bool(self.ca_file)


@dataclass(frozen=True, slots=True)
class ClientTLS:
    """The CA a client trusts (None: the system roots), and the certificate and key it
    presents to servers that require one (both or neither)."""

    ca_file: Pathish | None = None
    cert_file: Pathish | None = None
    key_file: Pathish | None = None


def _read(path: Pathish, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise TLSConfigError(f"cannot read {what} file {str(path)!r}: {reason}") from None
    if not data.strip():
        raise TLSConfigError(f"{what} file {str(path)!r} is empty")
    return data


def _certificates(data: bytes, path: Pathish, what: str) -> list[x509.Certificate]:
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TLSConfigError(
            f"{what} file {str(path)!r} holds no PEM certificate ({exc})"
        ) from None
    if not certs:
        raise TLSConfigError(f"{what} file {str(path)!r} holds no PEM certificate")
    return certs


def load_ca(ca_file: Pathish, what: str = "CA") -> bytes:
    """The PEM bytes of a CA bundle, checked to hold at least one certificate."""
    data = _read(ca_file, what)
    _certificates(data, ca_file, what)
    return data


def load_key_pair(cert_file: Pathish, key_file: Pathish) -> tuple[bytes, bytes]:
    """The PEM bytes of a certificate (chain) and its private key, checked to match."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    cert_data = _read(cert_file, "certificate")
    key_data = _read(key_file, "private key")
    leaf = _certificates(cert_data, cert_file, "certificate")[0]
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        raise TLSConfigError(
            f"private key file {str(key_file)!r} is encrypted (a passphrase-less key is needed)"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise TLSConfigError(
            f"private key file {str(key_file)!r} holds no usable PEM private key ({exc})"
        ) from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        raise TLSConfigError(
            f"private key file {str(key_file)!r} does not match certificate {str(cert_file)!r}"
        )
    return cert_data, key_data


def _client_pair(tls: ClientTLS) -> tuple[bytes, bytes] | None:
    if bool(tls.cert_file) != bool(tls.key_file):
        missing = "key" if tls.cert_file else "certificate"
        raise TLSConfigError(
            f"a client certificate and its key go together: the {missing} file is missing"
        )
    if tls.cert_file and tls.key_file:
        return load_key_pair(tls.cert_file, tls.key_file)
    return None


def server_credentials(tls: ServerTLS) -> grpc.ServerCredentials:
    """gRPC server credentials; client certificates are required and verified with a CA."""
    cert, key = load_key_pair(tls.cert_file, tls.key_file)
    ca = load_ca(tls.ca_file) if tls.ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def channel_credentials(tls: ClientTLS | None) -> grpc.ChannelCredentials:
    """gRPC channel credentials (system roots and no client certificate for None)."""
    if tls is None:
        return grpc.ssl_channel_credentials()
    ca = load_ca(tls.ca_file) if tls.ca_file else None
    pair = _client_pair(tls)
    if pair is None:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    cert, key = pair
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def server_ssl_context(tls: ServerTLS) -> ssl.SSLContext:
    """A server-side SSLContext (for HTTP endpoints) with the same rules as the gRPC port."""
    load_key_pair(tls.cert_file, tls.key_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.ca_file:
        ctx.load_verify_locations(cadata=load_ca(tls.ca_file).decode("ascii", "replace"))
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_ssl_context(tls: ClientTLS | None) -> ssl.SSLContext:
    """A client-side SSLContext (for HTTPS requests): verifies the server against the CA (or
    the system roots), and presents the client certificate if there is one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # Verifies the server and its host name.
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls is None or not tls.ca_file:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        ctx.load_verify_locations(cadata=load_ca(tls.ca_file).decode("ascii", "replace"))
    if tls is not None and _client_pair(tls) is not None:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return ctx


def check_server(tls: ServerTLS) -> None:
    """Read and check every file of `tls` (TLSConfigError naming a bad one)."""
    load_key_pair(tls.cert_file, tls.key_file)
    if tls.ca_file:
        load_ca(tls.ca_file)


def check_client(tls: ClientTLS) -> None:
    """Read and check every file of `tls` (TLSConfigError naming a bad one)."""
    if tls.ca_file:
        load_ca(tls.ca_file)
    _client_pair(tls)


def server_tls_from_files(
    cert_file: Pathish | None, key_file: Pathish | None, ca_file: Pathish | None
) -> ServerTLS | None:
    """A server's TLS from its flags (`--server-cert-file`, `--server-cert-key-file`,
    `--server-ca-file`); None (plaintext) without a certificate. Checks the files."""
    if not cert_file:
        if key_file or ca_file:
            raise TLSConfigError("a server key or CA file was given without a server certificate")
        return None
    if not key_file:
        raise TLSConfigError(f"server certificate {str(cert_file)!r} was given without its key")
    tls = ServerTLS(cert_file, key_file, ca_file or None)
    check_server(tls)
    return tls


def client_tls_from_files(
    ca_file: Pathish | None, cert_file: Pathish | None, key_file: Pathish | None
) -> ClientTLS | None:
    """A client's TLS from its flags (`--…-trusted-ca-file`, `--…-cert-file`,
    `--…-cert-key-file`); None when none is given. Checks the files."""
    if not (ca_file or cert_file or key_file):
        return None
    tls = ClientTLS(ca_file or None, cert_file or None, key_file or None)
    check_client(tls)
    return tls


def peer_tls_from_files(
    server: ServerTLS | None,
    cert_file: Pathish | None,
    key_file: Pathish | None,
    ca_file: Pathish | None,
) -> ClientTLS | None:
    """What a server presents to and trusts of its `https://` peers: the peer flags, each
    defaulting to the server's own (certificate and key; CA). Checks the files."""
    if server is not None:
        if not cert_file and not key_file:
            cert_file, key_file = server.cert_file, server.key_file
        ca_file = ca_file or server.ca_file
    return client_tls_from_files(ca_file, cert_file, key_file)


_VERIFY_FAILED = re.compile(r"CERTIFICATE_VERIFY_FAILED:\s*([^:]+)")
_NAME_MISMATCH = re.compile(r"Peer name (\S+) is not in peer certificate")
# What gRPC (1.85) says of a server certificate that does not name the host it reached.
_HOSTNAME_CHECK_FAILED = "Hostname Verification Check failed"


def certificate_validity_problem(cert_file: Pathish, now: float | None = None) -> str | None:
    """Why the (leaf) certificate of `cert_file` is not valid at `now` (the time: default,
    the current time) — expired, or not valid yet —, or None if it is valid then, or cannot be
    read (its reading is checked where it is loaded)."""
    import time
    from datetime import UTC, datetime

    try:
        leaf = _certificates(_read(cert_file, "certificate"), cert_file, "certificate")[0]
    except TLSConfigError:
        return None
    at = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    if at > leaf.not_valid_after_utc:
        return (
            f"certificate {str(cert_file)!r} expired at "
            f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC"
        )
    if at < leaf.not_valid_before_utc:
        return (
            f"certificate {str(cert_file)!r} is not valid before "
            f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC"
        )
    return None


def explain_connect_failure(
    details: str,
    *,
    secure: bool,
    client_cert: bool,
    host: str | None = None,
    client_cert_problem: str | None = None,
) -> str | None:
    """What went wrong, in words, when gRPC's `details` of a failed connection point at TLS;
    None when they don't. `secure`: the client used TLS; `client_cert`: it presented one;
    `host`: the name or address it connected to; `client_cert_problem`: why its certificate is
    not valid now (`certificate_validity_problem`), if it isn't.

    gRPC reports a server that refused the handshake (no client certificate, or one from a CA
    it doesn't trust, or one expired) only as "Socket closed", so these cases are told apart
    by what the client did.
    """
    if m := _VERIFY_FAILED.search(details):
        reason = m.group(1).strip()
        if "expired" in reason:
            advice = "the server's certificate has expired (the server needs a renewed one)"
        elif "not yet valid" in reason:
            advice = (
                "the server's certificate is not valid yet (its validity starts later: check "
                "the certificate's dates and the clocks)"
            )
        else:
            advice = (
                "the server's certificate is not signed by a CA this client trusts (give its "
                "CA as the trusted CA file)"
            )
        return f"TLS handshake failed (certificate verify failed: {reason}): {advice}"
    if (m := _NAME_MISMATCH.search(details)) or _HOSTNAME_CHECK_FAILED in details:
        name = m.group(1) if m else host or "the address connected to"
        return (
            f"TLS handshake failed: the server's certificate is not valid for {name} "
            "(connect by a name or address the certificate lists)"
        )
    lowered = details.lower()
    if secure and any(
        s in details for s in ("WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")
    ):
        return "TLS handshake failed: the server does not speak TLS (use an http:// address)"
    if secure and ("handshake" in lowered or "ssl_error" in lowered):
        return f"TLS handshake failed ({' '.join(details.split())})"
    closed = "socket closed" in lowered or "connection reset" in lowered
    if not closed or "failed to connect" not in lowered:
        return None  # Not a failure to establish the connection.
    if not secure:
        return (
            "the server closed the connection: it may require TLS (use an https:// address "
            "and a trusted CA file)"
        )
    if not client_cert:
        return (
            "TLS handshake failed: the server closed the connection; it requires a client "
            "certificate (mTLS), and none was given"
        )
    if client_cert_problem:
        return (
            "TLS handshake failed: the server closed the connection; it does not accept the "
            f"client certificate: {client_cert_problem}"
        )
    return (
        "TLS handshake failed: the server closed the connection; it does not accept the "
        "client certificate (is it signed by a CA the server trusts?)"
    )
