"""`pygazette serve`: run a broker, single-node on an embedded keyspace or in a cluster on etcd.

pygazette serve --port P --data-dir D
pygazette serve --etcd URL --zone Z --id SUFFIX --port P --data-dir D
                [--advertise URL] [--lease-ttl 20s] [--journal-limit N]
Either with --http-port H: metrics, health and the journal gateway over HTTP (`cli.http_port`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import re
import signal
from pathlib import Path
from typing import Any

import click

from pygazette.auth.configured import AUTH_KEYS_ENV
from pygazette.auth.keyed_auth import parse_auth_keys
from pygazette.auth.tls import TLSConfigError
from pygazette.broker.cluster_member import MemberFailed
from pygazette.broker.fd_limit import raise_open_file_limit
from pygazette.broker.fragment.persister import DEFAULT_BACKLOG_LIMIT
from pygazette.broker.fragment.retention import DEFAULT_ENFORCE_INTERVAL_SECONDS
from pygazette.broker.heap_tuning import tune_gc, tune_heap_for_large_messages
from pygazette.broker.server import (
    DEFAULT_MIN_APPEND_RATE,
    BrokerAlreadyRunning,
    BrokerConfig,
    default_broker_id,
    run_broker,
)
from pygazette.cli.http_port import broker_http, http_options
from pygazette.cli.listen import check_listen_address
from pygazette.cli.log_format import announce, configure_from_options, log_options
from pygazette.cli.tls_flags import (
    client_tls_flags,
    client_tls_from_flags,
    server_tls_flags,
    server_tls_from_flags,
)
from pygazette.keyspace.embedded import KeyspaceFileError
from pygazette.keyspace.etcd import etcd_url_is_tls, parse_etcd_url
from pygazette.keyspace.keyspace import DEFAULT_ROOT, KeyspaceUnavailable
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.go_duration import parse_duration, parse_seconds
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import (
    MAX_BROKER_JOURNAL_LIMIT,
    MAX_BROKER_SUFFIX_LEN,
    MAX_ZONE_LEN,
    MIN_BROKER_SUFFIX_LEN,
    MIN_ZONE_LEN,
    TOKEN_SYMBOLS,
    validate_process_id,
    validate_token,
)


def _process_token(field: str, min_len: int, max_len: int) -> object:
    """A click callback checking a zone or ID the way Gazette checks a ProcessSpec.ID."""

    def check(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
        if value:
            try:
                validate_token(value, field, TOKEN_SYMBOLS, min_len, max_len)
            except ValidationError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    return check


def _broker_tls_config(flags: dict[str, str], etcd_url: str) -> dict[str, Any]:
    """BrokerConfig's TLS fields from the TLS flags (one-line errors for bad files)."""
    server, peer = server_tls_from_flags(flags)
    etcd = client_tls_from_flags(flags, "etcd")
    if etcd is not None and not etcd_url_is_tls(etcd_url):
        raise click.UsageError("--etcd-* TLS files need an https:// --etcd URL")
    return {"tls": server, "peer_tls": peer, "etcd_tls": etcd}


def _duration_option(ctx: click.Context, param: click.Parameter, value: object) -> float:
    """Seconds of a Go-style duration ("20s", "1m30s", "500ms"); a bare number is seconds."""
    try:
        return parse_seconds(str(value))
    except ValidationError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@click.command("serve")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port to serve the Journal service on.",
)
@click.option(
    "--address",
    "host",
    default="127.0.0.1",
    show_default=True,
    help="Interface address to listen on.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("data"),
    show_default=True,
    help="Keyspace, spools and (by default) fragments live here.",
)
@click.option(
    "--file-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Root directory of file:/// fragment stores [default: DATA_DIR/fragments].",
)
@click.option(
    "--sync/--no-sync",
    default=False,
    show_default=True,
    help="fdatasync spools before acknowledging appends (power-loss safety).",
)
@click.option(
    "--min-append-rate",
    type=click.IntRange(min=0),
    default=DEFAULT_MIN_APPEND_RATE,
    show_default=True,
    help="Bytes/s an append client must sustain (0: unpoliced).",
)
@click.option(
    "--max-append-rate",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help=(
        "Upper bound of any journal's max_append_rate, bytes/s (0: none), as Gazette's "
        "--broker.max-append-rate; journals without one stay unlimited."
    ),
)
@click.option(
    "--spool-backlog-limit",
    type=click.IntRange(min=0),
    default=DEFAULT_BACKLOG_LIMIT,
    show_default=True,
    help="Bytes of closed spools waiting for one fragment store before appends to its "
    "journals are refused (FRAGMENT_STORE_UNHEALTHY).",
)
@click.option(
    "--retention-interval",
    default=f"{int(DEFAULT_ENFORCE_INTERVAL_SECONDS)}s",
    show_default=True,
    metavar="DURATION",
    help="How often to remove fragments older than their journal's retention (0s: only on "
    "demand, with `journals prune`).",
)
@click.option(
    "--zone",
    default="local",
    show_default=True,
    callback=_process_token("Zone", MIN_ZONE_LEN, MAX_ZONE_LEN),
    help="Zone of this broker.",
)
@click.option(
    "--id",
    "broker_id",
    default="",
    callback=_process_token("Suffix", MIN_BROKER_SUFFIX_LEN, MAX_BROKER_SUFFIX_LEN),
    help="Broker ID suffix, 4-128 characters [default: host name].",
)
@click.option(
    "--etcd",
    "etcd_url",
    default="",
    metavar="URL",
    help="Join the cluster on this etcd (e.g. http://127.0.0.1:2379) instead of running "
    "single-node.",
)
@click.option(
    "--etcd-prefix",
    default=DEFAULT_ROOT,
    show_default=True,
    help="Key prefix of the cluster's state in etcd.",
)
@click.option(
    "--advertise",
    "advertise_url",
    default="",
    metavar="URL",
    help="URL peers and clients reach this broker at [default: http://ADDRESS:PORT].",
)
@click.option(
    "--lease-ttl",
    default="20s",
    callback=_duration_option,
    show_default=True,
    help="TTL of this broker's etcd lease: a failed broker's journals move after this long.",
)
@click.option(
    "--journal-limit",
    type=click.IntRange(0, MAX_BROKER_JOURNAL_LIMIT),
    default=1024,
    show_default=True,
    help="Most journal replicas this broker takes.",
)
@click.option(
    "--drain-timeout",
    default="60s",
    callback=_duration_option,
    show_default=True,
    help="On SIGTERM, how long to wait for journals to move to other brokers, and then for "
    "their spools to persist.",
)
@click.option(
    "--auto-suspend",
    is_flag=True,
    help="Suspend journals left idle (content persisted, nothing appended for their flush "
    "interval or a day), as 'journals suspend' does; an append resumes them. With --etcd.",
)
@log_options
@http_options(
    ", Gazette's JSON API (POST /v1/journals/list, /v1/journals/read), and the journal "
    "gateway: GET/HEAD/PUT /<journal>"
)
@server_tls_flags("BROKER")
@client_tls_flags("etcd", "ETCD", "etcd")
@click.option(
    "--auth-keys",
    envvar=[AUTH_KEYS_ENV, "BROKER_AUTH_KEYS"],
    default="",
    metavar="KEYS",
    help="Authorize every RPC (Gazette's --broker.auth-keys): base64 keys, whitespace or "
    "comma separated; the first signs this broker's RPCs to peers, any verifies; `AA==` "
    "lets requests without a token through (also $AUTH_KEYS).",
)
def serve(
    port: int,
    host: str,
    data_dir: Path,
    file_root: Path | None,
    sync: bool,
    min_append_rate: int,
    max_append_rate: int,
    spool_backlog_limit: int,
    retention_interval: str,
    zone: str,
    broker_id: str,
    etcd_url: str,
    etcd_prefix: str,
    advertise_url: str,
    lease_ttl: float,
    journal_limit: int,
    drain_timeout: float,
    auto_suspend: bool,
    auth_keys: str,
    http_port: int,
    http_address: str,
    allow_origins: tuple[str, ...],
    log_level: str | None,
    log_format: str,
    **tls_flags: str,
) -> None:
    """Serve journals: single-node (embedded keyspace), or as a cluster member with --etcd."""
    configure_from_options(log_level, log_format)
    if auth_keys:
        try:
            parse_auth_keys(auth_keys)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--auth-keys") from None
    interval_ns = parse_duration(retention_interval)
    if interval_ns < 0:
        raise click.BadParameter("must not be negative", param_hint="--retention-interval")
    broker_id = broker_id or default_broker_id()
    if etcd_url:
        try:
            parse_etcd_url(etcd_url)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--etcd") from None
        try:
            validate_process_id(pb.ProcessSpec.ID(zone=zone, suffix=broker_id))
        except ValidationError as exc:
            raise click.UsageError(f"invalid --zone/--id: {exc}") from None
        if lease_ttl < 1:
            raise click.BadParameter("must be at least 1s", param_hint="--lease-ttl")
        if not etcd_prefix.startswith("/") or etcd_prefix.endswith("/"):
            raise click.BadParameter(
                "must start with '/' and not end with one", param_hint="--etcd-prefix"
            )
    elif auto_suspend:
        # A lone broker's journals have no replicas to give up.
        raise click.UsageError("--auto-suspend needs --etcd (a cluster)")
    if advertise_url and not re.match(r"^https?://[^/]+", advertise_url):
        raise click.BadParameter("expected http://host:port", param_hint="--advertise")
    config = BrokerConfig(
        data_dir=data_dir,
        port=port,
        host=host,
        file_root=file_root,
        sync=sync,
        min_append_rate=min_append_rate,
        max_append_rate=max_append_rate,
        spool_backlog_limit=spool_backlog_limit,
        retention_interval=interval_ns / 1e9,
        zone=zone,
        broker_id=broker_id,
        advertise_url=advertise_url,
        etcd_url=etcd_url,
        etcd_prefix=etcd_prefix,
        lease_ttl=lease_ttl,
        journal_limit=journal_limit,
        auto_suspend=auto_suspend,
        drain_timeout=drain_timeout,
        **_broker_tls_config(tls_flags, etcd_url),
        auth_keys=auth_keys,
    )
    check_listen_address(host, port)
    where = f" (cluster on {etcd_url} as {zone}#{broker_id})" if etcd_url else ""
    announce(f"pygazette broker listening on {host}:{port} (data: {data_dir}){where}")
    if http_port:
        scheme = "https" if config.tls is not None else "http"
        announce(
            f"HTTP on {scheme}://{http_address or host}:{http_port}: /metrics, /debug/ready, "
            "/debug/live, the JSON API at /v1/journals/, and journals at /<journal name>"
        )
    # `kill -USR1 <pid>` dumps every thread's stack to stderr (diagnosing a stuck broker).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    tune_heap_for_large_messages()
    tune_gc()
    raise_open_file_limit()
    try:
        side = broker_http(http_port, http_address, config.tls, config.peer_tls, allow_origins)
        asyncio.run(run_broker(config, side))
    except MemberFailed as exc:
        raise click.ClickException(f"left the cluster: {exc}") from None
    except KeyspaceUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    except TLSConfigError as exc:
        raise click.ClickException(f"TLS: {exc}") from None
    except (BrokerAlreadyRunning, KeyspaceFileError) as exc:
        # Another broker (perhaps the one this restarts, still exiting) holds the data
        # directory; or its single-node keyspace file is damaged.
        raise click.ClickException(str(exc)) from None
