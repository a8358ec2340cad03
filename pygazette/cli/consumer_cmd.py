"""`pygazette consumer …`: run consumer processes (`consumer serve --app module:factory`)."""

from __future__ import annotations

import click

from pygazette.cli.run_consumer import serve


@click.group("consumer")
def consumer() -> None:
    """Consumer processes: stateful, exactly-once stream processors in shards."""


consumer.add_command(serve)
