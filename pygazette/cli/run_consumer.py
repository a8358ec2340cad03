"""The command line of a consumer process: `pygazette consumer serve --app module:factory …`,
or `run(app)` from an application's own `__main__` (as Gazette's `runconsumer`), taking the same
flags. Flags become a `ConsumerConfig` for `pygazette.consumer.runner.run_consumer`; the
process's HTTP port (metrics, health) is composed here, as the consumer layer must not depend
on the gateway.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from pygazette.allocator.metrics import LeaseCollector
from pygazette.allocator.session import MemberSession
from pygazette.auth.configured import AUTH_KEYS_ENV
from pygazette.auth.keyed_auth import parse_auth_keys
from pygazette.auth.tls import TLSConfigError
from pygazette.cli.http_port import allow_origin_option, consumer_http
from pygazette.cli.listen import check_listen_address
from pygazette.cli.log_format import configure_from_options, log_options
from pygazette.cli.tls_flags import (
    client_tls_flags,
    client_tls_from_flags,
    server_tls_flags,
    server_tls_from_flags,
)
from pygazette.consumer.application import Application
from pygazette.consumer.metrics import ShardCollector
from pygazette.consumer.runner import (
    DEFAULT_CONSUMER_PREFIX,
    ConsumerConfig,
    ConsumerFailed,
    ConsumerProcess,
    SideServer,
    default_member_id,
    run_consumer,
)
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import parse_seconds
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_process_id

__all__ = ["load_app", "run", "serve"]


def load_app(spec: str) -> Application:
    """An application from `package.module:factory` (a class or function called with no
    arguments, or an object used as is)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(f"expected package.module:factory, got {spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # Apps next to the working directory, as `python -m` finds them.
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name}: {exc}") from exc
    try:
        factory: Any = getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(f"{module_name} has no attribute {attr!r}") from None
    if isinstance(factory, type) or (callable(factory) and not hasattr(factory, "consume_message")):
        app = factory()  # A class, or a factory function.
    else:
        app = factory  # An application object.
    for method in ("new_store", "consume_message", "finalize_txn"):
        if not callable(getattr(app, method, None)):
            raise click.BadParameter(f"{spec}: the application has no {method}() method")
    return app  # type: ignore[no-any-return]


def _consumer_http(process: ConsumerProcess) -> SideServer | None:
    """The process's HTTP port (None without --http-port): metrics, health and the JSON API for
    shards (POST /v1/shards/list, /v1/shards/stat)."""
    cfg = process.config
    if not cfg.http_port:
        return None

    def member_session() -> MemberSession | None:
        session = getattr(process, "session", None)
        return session if isinstance(session, MemberSession) else None

    return consumer_http(
        cfg.http_port,
        cfg.http_address,
        cfg.host,
        process.ready_reason,
        [ShardCollector(process.local_replicas), LeaseCollector(member_session)],
        tls=cfg.tls,
        endpoint=lambda: process.endpoint,
        peer_tls=cfg.peer_tls,
        allow_origins=cfg.allow_origins,
    )


def _duration(ctx: click.Context, param: click.Parameter, value: object) -> float:
    """Seconds of a Go-style duration ("20s", "500ms", "1m30s"); a bare number is seconds."""
    try:
        return parse_seconds(str(value))
    except ValidationError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _options(with_app: bool) -> list[Any]:
    opts: list[Any] = []
    if with_app:
        opts.append(
            click.option(
                "--app",
                "app_spec",
                required=True,
                envvar="CONSUMER_APP",
                help="The application, as package.module:factory.",
            )
        )
    opts += [
        click.option(
            "--broker",
            default="http://localhost:8080",
            envvar="BROKER_ADDRESS",
            show_default=True,
            help="Broker to read and append journals through.",
        ),
        click.option(
            "--etcd",
            "etcd_url",
            default="",
            envvar="ETCD_ADDRESS",
            help="etcd URL; without it, an embedded keyspace under --data-dir (one process).",
        ),
        click.option(
            "--etcd-prefix",
            default="",
            envvar="CONSUMER_ETCD_PREFIX",
            help=f"Keyspace root of this consumer group [default: {DEFAULT_CONSUMER_PREFIX}/"
            "<app module>].",
        ),
        click.option("--host", default="127.0.0.1", show_default=True, help="Listen address."),
        click.option("--port", type=click.IntRange(0, 65535), default=8081, show_default=True),
        click.option("--advertise", default="", help="Endpoint peers reach this process at."),
        click.option("--zone", default="local", show_default=True, envvar="CONSUMER_ZONE"),
        click.option("--id", "member_id", default="", envvar="CONSUMER_ID", help="Member ID."),
        click.option(
            "--data-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("./consumer-data"),
            show_default=True,
        ),
        click.option("--shard-limit", type=click.IntRange(0), default=1024, show_default=True),
        click.option("--lease-ttl", default="20s", show_default=True, callback=_duration),
        click.option(
            "--hints-interval",
            default="5s",
            show_default=True,
            callback=_duration,
            help="How often a primary stores its recorded FSM hints.",
        ),
        click.option(
            "--http-port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            envvar="CONSUMER_HTTP_PORT",
            help="Port for HTTP: /metrics, /debug/ready, /debug/live and Gazette's JSON API "
            "(POST /v1/shards/list, /v1/shards/stat) (0: off).",
        ),
        click.option(
            "--http-address",
            default="",
            help="Interface address of the HTTP port [default: --host].",
        ),
        allow_origin_option("CONSUMER_ALLOW_ORIGIN"),
        log_options,
        server_tls_flags("CONSUMER"),
        client_tls_flags("broker", "BROKER", "brokers"),
        client_tls_flags("etcd", "ETCD", "etcd"),
        click.option(
            "--auth-keys",
            default="",
            envvar=[AUTH_KEYS_ENV, "CONSUMER_AUTH_KEYS"],
            metavar="KEYS",
            help="Base64 keys (whitespace or comma separated): verify Shard RPCs (any key) and "
            "sign this process's RPCs to brokers and peers (the first); `AA==` lets requests "
            "without a token through (also $AUTH_KEYS).",
        ),
    ]
    return opts


F = TypeVar("F", bound=Callable[..., Any])


def _with_options(with_app: bool) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        for opt in reversed(_options(with_app)):
            fn = opt(fn)
        return fn

    return decorate


def _serve(app: Application, app_name: str, **kw: Any) -> None:
    from pygazette.keyspace.keyspace import KeyspaceUnavailable

    configure_from_options(kw.get("log_level"), kw.get("log_format") or "text")
    # Gazette's rules for a member's ID (a suffix of 4 to 128 token characters, ...): a process
    # registered under an ID its peers cannot decode would be dropped from its own group.
    member_id = kw["member_id"] or default_member_id(kw["port"])
    try:
        validate_process_id(pb.ProcessSpec.ID(zone=kw["zone"], suffix=member_id))
    except ValidationError as exc:
        raise click.UsageError(f"invalid --zone/--id: {exc}") from None
    prefix = kw["etcd_prefix"] or f"{DEFAULT_CONSUMER_PREFIX}/{app_name}"
    config = ConsumerConfig(
        app=app,
        broker=kw["broker"],
        etcd_url=kw["etcd_url"],
        etcd_prefix=prefix.rstrip("/"),
        host=kw["host"],
        port=kw["port"],
        advertise=kw["advertise"],
        zone=kw["zone"],
        id=kw["member_id"],
        data_dir=kw["data_dir"],
        shard_limit=kw["shard_limit"],
        lease_ttl=kw["lease_ttl"],
        hints_interval=kw["hints_interval"],
        http_port=kw.get("http_port") or 0,
        http_address=kw.get("http_address") or "",
        allow_origins=tuple(kw.get("allow_origins") or ()),
        auth_keys=kw.get("auth_keys") or "",
    )
    check_listen_address(config.host, config.port)
    if config.auth_keys:
        try:
            parse_auth_keys(config.auth_keys)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--auth-keys") from None
    config.tls, config.peer_tls = server_tls_from_flags(kw)
    config.broker_tls = client_tls_from_flags(kw, "broker")
    config.etcd_tls = client_tls_from_flags(kw, "etcd")
    if config.broker_tls is not None and not config.broker.startswith("https://"):
        raise click.UsageError("--broker-* TLS files need an https:// --broker URL")
    if config.etcd_tls is not None and not config.etcd_url.startswith("https://"):
        raise click.UsageError("--etcd-* TLS files need an https:// --etcd URL")
    # Playing a recovery log holds a file open per live file of the store (as Gazette's
    # player does), and RocksDB keeps its tables open: raise the soft open-file limit to the
    # hard one, as Go's runtime does for Gazette's consumers.
    from pygazette.broker.fd_limit import raise_open_file_limit

    raise_open_file_limit()
    try:
        asyncio.run(run_consumer(config, _consumer_http))
    except (ConsumerFailed, KeyspaceUnavailable, OSError, TLSConfigError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command("serve")
@_with_options(with_app=True)
def serve(app_spec: str, **kw: Any) -> None:
    """Run a consumer process of an application (package.module:factory)."""
    app = load_app(app_spec)
    _serve(app, app_spec.partition(":")[0].replace(".", "-"), **kw)


def run(app: Application, argv: Sequence[str] | None = None, *, name: str = "") -> None:
    """Serve `app` from its own `__main__`, taking the same flags as `consumer serve`."""
    app_name = name or type(app).__module__.replace(".", "-").replace("_", "-")

    @click.command()
    @_with_options(with_app=False)
    def main(**kw: Any) -> None:
        _serve(app, app_name, **kw)

    main.main(args=list(argv) if argv is not None else None, prog_name=sys.argv[0])
