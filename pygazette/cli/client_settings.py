"""How the CLI's commands connect to brokers and consumers: the root command's options
(`CliState`: the broker address, TLS and authorization), turned into `JournalClient`s and
`ShardClient`s.

Every command opens its clients through `client_settings()`, so a connection option given once
to `pygazette` applies to every RPC the command makes. The clients' modules are imported when a
client is opened: the root command builds these settings on every run, `--help` included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import click

from pygazette.client.defaults import DEFAULT_BROKER

if TYPE_CHECKING:
    from pygazette.auth.authorizer import Authorizer
    from pygazette.auth.tls import ClientTLS
    from pygazette.client.journal_client import JournalClient
    from pygazette.consumer.shard_client import ShardClient


@dataclass
class ClientSettings:
    """Connection options shared by every client the CLI opens."""

    # TLS towards https:// brokers and consumers (`--broker-cert-file`, `--consumer-…`).
    broker_tls: ClientTLS | None = None
    consumer_tls: ClientTLS | None = None
    # Signs (--auth-keys) or carries (--auth-token) the authorization of every RPC to brokers,
    # and to consumers unless `consumer_auth` (--consumer-auth-keys, gazctl's
    # --consumer.auth-keys) is given.
    auth: Authorizer | None = None
    consumer_auth: Authorizer | None = None

    def unavailable(self, address: str, details: str, *, consumer: bool = False) -> str:
        """`details` of an UNAVAILABLE RPC to `address`, explained if TLS is the cause."""
        from urllib.parse import urlsplit

        from pygazette.auth.tls import certificate_validity_problem, explain_connect_failure
        from pygazette.client.channel import channel_target

        tls = self.consumer_tls if consumer else self.broker_tls
        cert_file = tls.cert_file if tls is not None else None
        explained = explain_connect_failure(
            details,
            secure=channel_target(address)[1],
            client_cert=bool(cert_file),
            host=urlsplit(address).hostname,
            client_cert_problem=certificate_validity_problem(cert_file) if cert_file else None,
        )
        return explained or details

    @staticmethod
    def unimplemented(address: str, details: str, *, consumer: bool = False) -> str:
        """`details` of an UNIMPLEMENTED RPC to `address`, explained when the server lacks the
        whole service: a consumer given as the broker, or a broker as the consumer. Python's
        gRPC answers 'Method not found!' for any method it does not serve, Go's 'unknown
        service <name>' (a Gazette broker without pygazette's own services is not the case)."""
        service, role, flag = (
            ("consumer.Shard", "consumer", "--consumer URL or $CONSUMER_ADDRESS")
            if consumer
            else ("protocol.Journal", "broker", "--broker URL or $BROKER_ADDRESS")
        )
        if details != "Method not found!" and details != f"unknown service {service}":
            return details
        return f"{details} ({address} serves no {service}: not a {role}? {flag} names one)"

    def journal_client(self, address: str) -> JournalClient:
        """A client of the broker at `address`."""
        from pygazette.client.journal_client import JournalClient

        try:
            return JournalClient(address, tls=self.broker_tls, auth=self.auth)
        except ValueError as exc:  # TLS files for an http:// address, or bad TLS files.
            raise click.ClickException(f"broker {address}: {exc}") from None

    def shard_client(self, address: str) -> ShardClient:
        """A client of the consumer process at `address`."""
        from pygazette.consumer.shard_client import ShardClient

        try:
            auth = self.consumer_auth if self.consumer_auth is not None else self.auth
            return ShardClient(address, tls=self.consumer_tls, auth=auth)
        except ValueError as exc:  # TLS files for an http:// address, or bad TLS files.
            raise click.ClickException(f"consumer {address}: {exc}") from None


@dataclass
class CliState:
    """Options of the root command that subcommands use."""

    broker: str = DEFAULT_BROKER
    client_settings: ClientSettings = field(default_factory=ClientSettings)


def client_settings() -> ClientSettings:
    """The settings of the running command (the root command's), or the defaults."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().obj if ctx is not None else None
    settings = getattr(root, "client_settings", None)
    return settings if isinstance(settings, ClientSettings) else ClientSettings()
