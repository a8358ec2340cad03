"""How the CLI's commands connect to brokers and consumers: the root command's TLS and
authorization options, turned into `JournalClient`s and `ShardClient`s.

Every command opens its clients through `client_settings()`, so a connection option given once
to `pygazette` applies to every RPC the command makes.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from pygazette.client.journal_client import JournalClient
from pygazette.consumer.shard_client import ShardClient


@dataclass
class ClientSettings:
    """Connection options shared by every client the CLI opens."""

    def journal_client(self, address: str) -> JournalClient:
        """A client of the broker at `address`."""
        return JournalClient(address)

    def shard_client(self, address: str) -> ShardClient:
        """A client of the consumer process at `address`."""
        return ShardClient(address)


def client_settings() -> ClientSettings:
    """The settings of the running command (the root command's), or the defaults."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().obj if ctx is not None else None
    settings = getattr(root, "client_settings", None)
    return settings if isinstance(settings, ClientSettings) else ClientSettings()
