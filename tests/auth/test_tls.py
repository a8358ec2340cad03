"""TLS material: loading and checking files, credentials, SSL contexts, the TLS flags, and how
connection failures are explained."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
import pytest

from pygazette.auth.tls import (
    ClientTLS,
    ServerTLS,
    TLSConfigError,
    channel_credentials,
    client_ssl_context,
    client_tls_from_files,
    explain_connect_failure,
    load_key_pair,
    peer_tls_from_files,
    server_credentials,
    server_ssl_context,
    server_tls_from_files,
)
from pygazette.client.channel import open_channel
from tests.support.tls_material import TLSMaterial, generate_tls_material


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    return generate_tls_material(tmp_path_factory.mktemp("tls"))


def test_good_material_builds_credentials_and_contexts(material: TLSMaterial) -> None:
    server = ServerTLS(material.server_cert, material.server_key, material.ca)
    assert server.mutual
    assert isinstance(server_credentials(server), grpc.ServerCredentials)
    assert isinstance(
        server_credentials(ServerTLS(material.server_cert, material.server_key)),
        grpc.ServerCredentials,
    )
    client = ClientTLS(material.ca, material.client_cert, material.client_key)
    assert isinstance(channel_credentials(client), grpc.ChannelCredentials)
    assert isinstance(channel_credentials(None), grpc.ChannelCredentials)
    assert isinstance(channel_credentials(ClientTLS(material.ca)), grpc.ChannelCredentials)

    sctx = server_ssl_context(server)
    assert sctx.verify_mode == ssl.CERT_REQUIRED
    assert (
        server_ssl_context(ServerTLS(material.server_cert, material.server_key)).verify_mode
        == ssl.CERT_NONE
    )
    cctx = client_ssl_context(client)
    assert cctx.verify_mode == ssl.CERT_REQUIRED and cctx.check_hostname


def test_missing_file_is_named(material: TLSMaterial, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(TLSConfigError, match=r"cannot read certificate file .*nope\.pem"):
        server_credentials(ServerTLS(missing, material.server_key))
    with pytest.raises(TLSConfigError, match=r"cannot read private key file .*nope\.pem"):
        load_key_pair(material.server_cert, missing)
    with pytest.raises(TLSConfigError, match=r"cannot read CA file .*nope\.pem"):
        channel_credentials(ClientTLS(ca_file=missing))
    with pytest.raises(TLSConfigError, match=r"cannot read CA file .*nope\.pem"):
        server_credentials(ServerTLS(material.server_cert, material.server_key, missing))


def test_unreadable_file_is_named(material: TLSMaterial, tmp_path: Path) -> None:
    directory = tmp_path / "a-directory.pem"
    directory.mkdir()
    with pytest.raises(TLSConfigError, match=r"cannot read CA file .*a-directory\.pem"):
        client_ssl_context(ClientTLS(ca_file=directory))


def test_non_pem_files_are_named(material: TLSMaterial, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("this is not PEM\n")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    with pytest.raises(TLSConfigError, match=r"certificate file .*junk\.pem.* no PEM certificate"):
        load_key_pair(junk, material.server_key)
    with pytest.raises(TLSConfigError, match=r"private key file .*junk\.pem.* no usable PEM"):
        load_key_pair(material.server_cert, junk)
    with pytest.raises(TLSConfigError, match=r"CA file .*junk\.pem.* no PEM certificate"):
        channel_credentials(ClientTLS(ca_file=junk))
    with pytest.raises(TLSConfigError, match=r"empty\.pem.* is empty"):
        channel_credentials(ClientTLS(ca_file=empty))
    # A key where the CA should be: not a certificate.
    with pytest.raises(TLSConfigError, match=r"CA file .*server-key\.pem"):
        server_credentials(
            ServerTLS(material.server_cert, material.server_key, material.server_key)
        )


def test_key_must_match_certificate(material: TLSMaterial) -> None:
    with pytest.raises(TLSConfigError, match=r"client-key\.pem.* does not match .*server\.pem"):
        server_credentials(ServerTLS(material.server_cert, material.client_key))
    with pytest.raises(TLSConfigError, match=r"does not match"):
        channel_credentials(ClientTLS(material.ca, material.client_cert, material.server_key))


def test_client_certificate_and_key_go_together(material: TLSMaterial) -> None:
    with pytest.raises(TLSConfigError, match="the key file is missing"):
        channel_credentials(ClientTLS(material.ca, cert_file=material.client_cert))
    with pytest.raises(TLSConfigError, match="the certificate file is missing"):
        channel_credentials(ClientTLS(material.ca, key_file=material.client_key))


def test_flags_to_settings(material: TLSMaterial) -> None:
    assert server_tls_from_files("", "", "") is None
    with pytest.raises(TLSConfigError, match="without its key"):
        server_tls_from_files(material.server_cert, "", "")
    with pytest.raises(TLSConfigError, match="without a server certificate"):
        server_tls_from_files("", "", material.ca)
    server = server_tls_from_files(material.server_cert, material.server_key, material.ca)
    assert server == ServerTLS(material.server_cert, material.server_key, material.ca)

    # Peer material defaults to the server's own; peer flags override it.
    assert peer_tls_from_files(server, "", "", "") == ClientTLS(
        material.ca, material.server_cert, material.server_key
    )
    assert peer_tls_from_files(
        server, material.client_cert, material.client_key, material.other_ca
    ) == ClientTLS(material.other_ca, material.client_cert, material.client_key)
    assert peer_tls_from_files(None, "", "", "") is None

    assert client_tls_from_files("", "", "") is None
    assert client_tls_from_files(material.ca, "", "") == ClientTLS(material.ca)
    with pytest.raises(TLSConfigError):
        client_tls_from_files(material.ca, material.client_cert, material.server_key)


async def test_client_tls_needs_an_https_address(material: TLSMaterial) -> None:
    with pytest.raises(ValueError, match="not an https:// address"):
        open_channel("http://127.0.0.1:1", tls=ClientTLS(material.ca))
    with pytest.raises(ValueError, match="not an https:// address"):
        open_channel("127.0.0.1:1", tls=ClientTLS(material.ca))
    # Bad files fail when the channel is opened, not at its first RPC.
    with pytest.raises(TLSConfigError):
        open_channel("https://127.0.0.1:1", tls=ClientTLS(material.client_key))
    _, channel = open_channel("https://127.0.0.1:1", tls=ClientTLS(material.ca))
    await channel.close()


async def test_ssl_contexts_handshake(material: TLSMaterial) -> None:
    """The SSLContexts (for HTTP endpoints) do what the gRPC credentials do: mTLS with a CA."""
    server_ctx = server_ssl_context(
        ServerTLS(material.server_cert, material.server_key, material.ca)
    )

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await reader.readline())
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        good = client_ssl_context(ClientTLS(material.ca, material.client_cert, material.client_key))
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=good)
        writer.write(b"hello\n")
        assert await reader.readline() == b"hello\n"
        writer.close()

        # A certificate from another CA is refused (by the server, after the handshake).
        stranger = client_ssl_context(
            ClientTLS(material.ca, material.other_client_cert, material.other_client_key)
        )
        with pytest.raises((ssl.SSLError, ConnectionError)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=stranger)
            writer.write(b"hello\n")
            if not await reader.readline():
                raise ConnectionError("closed")
        # The server's certificate does not chain to the other CA.
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ssl_context(ClientTLS(material.other_ca))
            )
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("details", "secure", "client_cert", "expected"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls "
            "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
            "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer "
            "certificate: OK",
            True,
            False,
            "TLS handshake failed (certificate verify failed: unable to get local issuer "
            "certificate)",
        ),
        (
            "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: "
            "Socket closed",
            False,
            False,
            "it may require TLS",
        ),
        (
            "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: "
            "Socket closed",
            True,
            False,
            "requires a client certificate (mTLS), and none was given",
        ),
        (
            "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: "
            "Socket closed",
            True,
            True,
            "does not accept the client certificate",
        ),
    ],
)
def test_explain_connect_failure(
    details: str, secure: bool, client_cert: bool, expected: str
) -> None:
    explained = explain_connect_failure(details, secure=secure, client_cert=client_cert)
    assert explained is not None and expected in explained


def test_unrelated_failures_are_not_explained() -> None:
    refused = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
        "Failed to connect to remote host: Connection refused"
    )
    assert explain_connect_failure(refused, secure=False, client_cert=False) is None
    assert explain_connect_failure(refused, secure=True, client_cert=True) is None
