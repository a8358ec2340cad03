"""A server's `--http-port`: the HTTP side of `pygazette serve` and `pygazette consumer serve`.

The broker and consumer layers must not depend on the gateway, so the CLI composes them: a
broker's HTTP port serves `/metrics` (prometheus-client's registry, the broker's state and
Gazette's RPC counters), `/debug/live`, `/debug/ready` (the broker's `ready_reason`), Gazette's
JSON API for journals (`POST /v1/journals/list`, `/v1/journals/read`) and the journal gateway:
gRPC clients of the broker's own endpoint carrying only what an HTTP client sends (its
`Authorization` header). A consumer's serves metrics, health and the JSON API for shards
(`POST /v1/shards/list`, `/v1/shards/stat`), a gRPC client of its own endpoint. With the
server's TLS material the port serves HTTPS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from pygazette.auth.tls import ClientTLS, ServerTLS, server_ssl_context
from pygazette.client.channel import Connection
from pygazette.client.journal_client import JournalClient
from pygazette.gateway.exposition import MetricsExposition
from pygazette.gateway.health import Readiness
from pygazette.gateway.http_server import HttpServer
from pygazette.gateway.json_api import JOURNAL_METHODS, SHARD_METHODS, JsonApi

F = TypeVar("F", bound=Callable[..., Any])


def http_options(what: str = "") -> Callable[[F], F]:
    """A decorator adding the `--http-port` and `--http-address` options."""
    options = [
        click.option(
            "--http-port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            help=f"Port for HTTP: /metrics, /debug/ready, /debug/live{what} (0: off).",
        ),
        click.option(
            "--http-address",
            default="",
            metavar="ADDRESS",
            help="Interface address of the HTTP port [default: the gRPC address].",
        ),
        allow_origin_option("BROKER_ALLOW_ORIGIN"),
    ]

    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def allow_origin_option(envvar: str) -> Callable[[F], F]:
    """`--allow-origin` (repeatable): Gazette's `--broker.allow-origin` /
    `--consumer.allow-origin`, CORS headers on the JSON API for requests from these origins."""
    return click.option(
        "--allow-origin",
        "allow_origins",
        multiple=True,
        envvar=envvar,
        metavar="ORIGIN",
        help="Origin to allow in CORS contexts of the JSON API under /v1/ (repeatable).",
    )


class _SideHttp:
    """An HttpServer started and stopped with its process (a broker's `SideServer`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        readiness: Readiness,
        collectors: Iterable[Any],
        texts: Iterable[Callable[[], str]] = (),
        tls: ServerTLS | None = None,
        gateway: Callable[[], JournalClient] | None = None,
        shard_api: Callable[[], Connection] | None = None,
        allow_origins: Iterable[str] = (),
    ) -> None:
        self.host, self.port = host, port
        self.readiness = readiness
        self.metrics = MetricsExposition(collectors, texts)
        self.tls = tls
        self.gateway = gateway
        self.shard_api = shard_api
        self.allow_origins = tuple(allow_origins)
        self.client: JournalClient | None = None
        self.connection: Connection | None = None  # The shard API's, to the consumer.
        self.server: HttpServer | None = None

    async def start(self) -> None:
        json_api = None
        # In the running loop: gRPC binds channels to it.
        if self.gateway is not None:
            self.client = self.gateway()
            json_api = JsonApi(
                self.client.channel, JOURNAL_METHODS, allow_origins=self.allow_origins
            )
        if self.shard_api is not None:
            self.connection = self.shard_api()
            json_api = JsonApi(
                self.connection.channel, SHARD_METHODS, allow_origins=self.allow_origins
            )
        self.server = HttpServer.for_server(
            readiness=self.readiness,
            metrics=self.metrics,
            journal_client=self.client,
            ssl_context=server_ssl_context(self.tls) if self.tls is not None else None,
            json_api=json_api,
        )
        try:
            self.port = await self.server.start(self.host, self.port)
        except OSError as exc:
            await self._close_clients()
            raise click.ClickException(
                f"cannot serve HTTP on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None
        await self._close_clients()

    async def _close_clients(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.connection is not None:
            await self.connection.close()
            self.connection = None


def broker_http(
    port: int,
    address: str,
    tls: ServerTLS | None,
    peer_tls: ClientTLS | None,
    allow_origins: Iterable[str] = (),
) -> Callable[[Any], _SideHttp] | None:
    """The broker's HTTP side (None when `port` is 0): a `Broker` → `SideServer` factory."""
    if not port:
        return None

    def build(broker: Any) -> _SideHttp:
        def gateway_client() -> JournalClient:
            if tls is None:
                return JournalClient(broker.endpoint)
            return JournalClient(broker.endpoint, tls=peer_tls or ClientTLS())

        return _SideHttp(
            address or broker.config.host,
            port,
            readiness=lambda: broker.ready_reason,
            collectors=[broker],
            texts=[broker.rpc_counters.exposition],
            tls=tls,
            gateway=gateway_client,
            allow_origins=allow_origins,
        )

    return build


def consumer_http(
    port: int,
    address: str,
    host: str,
    readiness: Readiness,
    collectors: Iterable[Any],
    *,
    tls: ServerTLS | None = None,
    endpoint: Callable[[], str] | None = None,
    peer_tls: ClientTLS | None = None,
    allow_origins: Iterable[str] = (),
) -> _SideHttp:
    """A consumer process's HTTP side: metrics and health (HTTPS with the process's TLS) and,
    given the process's gRPC `endpoint`, the JSON API for shards."""
    shard_api = None
    if endpoint is not None:

        def shard_api() -> Connection:
            if tls is None:
                return Connection(endpoint())
            return Connection(endpoint(), tls=peer_tls or ClientTLS())

    return _SideHttp(
        address or host,
        port,
        readiness=readiness,
        collectors=collectors,
        tls=tls,
        shard_api=shard_api,
        allow_origins=allow_origins,
    )
