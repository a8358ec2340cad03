"""TLS command-line flags, named as Gazette names them, and the TLS settings they make.

Servers (`serve`, `consumer serve`) take `--server-cert-file`, `--server-cert-key-file`,
`--server-ca-file` (a CA means mTLS) and `--peer-cert-file`, `--peer-cert-key-file`,
`--peer-ca-file` (towards `https://` peers; they default to the server's own material), with
environment variables `<ROLE>_SERVER_CERT_FILE`, … as Gazette's `--broker.*`/`--consumer.*`.
Clients of a service take `--<service>-cert-file`, `--<service>-cert-key-file` and
`--<service>-trusted-ca-file` (env `<SERVICE>_CERT_FILE`, …), as gazctl's `--broker.*`,
`--consumer.*` and `--etcd.*` groups.

Every file is read and checked when the flags are turned into settings: a bad file is one
`click.ClickException` line naming it, before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    # Imported where used: every run of the command line declares these flags, and
    # `pygazette.auth.tls` imports grpc and cryptography.
    from pygazette.auth.tls import ClientTLS, ServerTLS, TLSConfigError

__all__ = [
    "client_tls_flags",
    "client_tls_from_flags",
    "server_tls_flags",
    "server_tls_from_flags",
]

F = TypeVar("F", bound=Callable[..., Any])


def _file_option(flag: str, env: str, help_text: str, *aliases: str) -> Callable[[F], F]:
    return click.option(
        flag,
        *aliases,
        default="",
        envvar=env,
        metavar="FILE",
        help=f"{help_text} (also ${env}).",
    )


def _apply(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def server_tls_flags(env_prefix: str) -> Callable[[F], F]:
    """`--server-*` and `--peer-*` flags (parameters `server_cert_file`, …, `peer_ca_file`)."""
    e = env_prefix
    return _apply(
        [
            _file_option(
                "--server-cert-file",
                f"{e}_SERVER_CERT_FILE",
                "Server TLS certificate: serve TLS (https://) on the gRPC port",
            ),
            _file_option("--server-cert-key-file", f"{e}_SERVER_CERT_KEY_FILE", "Its private key"),
            _file_option(
                "--server-ca-file",
                f"{e}_SERVER_CA_FILE",
                "CA that client certificates must chain to; given, client certificates are "
                "required (mTLS)",
            ),
            _file_option(
                "--peer-cert-file",
                f"{e}_PEER_CERT_FILE",
                "Client certificate presented to https:// peers [default: the server's]",
            ),
            _file_option("--peer-cert-key-file", f"{e}_PEER_CERT_KEY_FILE", "Its private key"),
            _file_option(
                "--peer-ca-file",
                f"{e}_PEER_CA_FILE",
                "CA trusted for peers' certificates [default: --server-ca-file, else the "
                "system roots]",
            ),
        ]
    )


def client_tls_flags(service: str, env_prefix: str, what: str) -> Callable[[F], F]:
    """`--<service>-cert-file`, `--<service>-cert-key-file`, `--<service>-trusted-ca-file`
    (parameters `<service>_cert_file`, …) for connections to `what`; gazctl's spellings
    `--<service>.cert-file`, … are the same options."""
    e = env_prefix
    return _apply(
        [
            _file_option(
                f"--{service}-cert-file",
                f"{e}_CERT_FILE",
                f"Client TLS certificate presented to {what}",
                f"--{service}.cert-file",
            ),
            _file_option(
                f"--{service}-cert-key-file",
                f"{e}_CERT_KEY_FILE",
                "Its private key",
                f"--{service}.cert-key-file",
            ),
            _file_option(
                f"--{service}-trusted-ca-file",
                f"{e}_TRUSTED_CA_FILE",
                f"CA trusted for the certificates of {what} [default: the system roots]",
                f"--{service}.trusted-ca-file",
            ),
        ]
    )


def _fail(exc: TLSConfigError) -> click.ClickException:
    return click.ClickException(f"TLS: {exc}")


def server_tls_from_flags(flags: Mapping[str, Any]) -> tuple[ServerTLS | None, ClientTLS | None]:
    """The server TLS and peer TLS of `server_tls_flags` values."""
    from pygazette.auth.tls import TLSConfigError, peer_tls_from_files, server_tls_from_files

    try:
        server = server_tls_from_files(
            flags.get("server_cert_file"),
            flags.get("server_cert_key_file"),
            flags.get("server_ca_file"),
        )
        peer = peer_tls_from_files(
            server,
            flags.get("peer_cert_file"),
            flags.get("peer_cert_key_file"),
            flags.get("peer_ca_file"),
        )
    except TLSConfigError as exc:
        raise _fail(exc) from None
    _warn_if_not_valid_now(server.cert_file if server is not None else None, "server")
    if (
        peer is not None
        and peer.cert_file
        and (server is None or peer.cert_file != server.cert_file)
    ):
        _warn_if_not_valid_now(peer.cert_file, "peer")
    return server, peer


def _warn_if_not_valid_now(cert_file: Any, what: str) -> None:
    """Log a warning if the certificate is expired or not valid yet: it is read once, at
    start, and every client (or peer) would refuse it in the handshake, each with an error
    of its own, while this process says nothing."""
    if not cert_file:
        return
    import logging

    from pygazette.auth.tls import certificate_validity_problem

    problem = certificate_validity_problem(cert_file)
    if problem is not None:
        logging.getLogger(__name__).warning(
            f"the {what} certificate is not valid now: {problem}; TLS clients will refuse it"
        )


def client_tls_from_flags(flags: Mapping[str, Any], service: str) -> ClientTLS | None:
    """The client TLS of `client_tls_flags(service, …)` values (None if none given)."""
    ca_file = flags.get(f"{service}_trusted_ca_file")
    cert_file = flags.get(f"{service}_cert_file")
    key_file = flags.get(f"{service}_cert_key_file")
    if not (ca_file or cert_file or key_file):
        return None  # Without importing TLS support.
    from pygazette.auth.tls import TLSConfigError, client_tls_from_files

    try:
        return client_tls_from_files(ca_file, cert_file, key_file)
    except TLSConfigError as exc:
        raise _fail(exc) from None
