"""`pygazette serve`: run a single-node broker on an embedded keyspace."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from pygazette.broker.persister import DEFAULT_BACKLOG_LIMIT
from pygazette.broker.retention import DEFAULT_ENFORCE_INTERVAL_SECONDS
from pygazette.broker.server import DEFAULT_MIN_APPEND_RATE, BrokerConfig, run_broker
from pygazette.cli.journalspace import parse_duration
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.validation import (
    MAX_BROKER_SUFFIX_LEN,
    MAX_ZONE_LEN,
    MIN_BROKER_SUFFIX_LEN,
    MIN_ZONE_LEN,
    TOKEN_SYMBOLS,
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
    help="Broker-wide maximum append bytes/s (0: unlimited).",
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
) -> None:
    """Serve journals from this machine (single node, embedded keyspace)."""
    interval_ns = parse_duration(retention_interval)
    if interval_ns < 0:
        raise click.BadParameter("must not be negative", param_hint="--retention-interval")
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
    )
    click.echo(f"pygazette broker listening on {host}:{port} (data: {data_dir})", err=True)
    asyncio.run(run_broker(config))
