"""Where a client finds a broker by default: `DEFAULT_BROKER` and `$BROKER_ADDRESS`.

Kept apart from `journal_client` (which imports grpc) so that the command line can show these
defaults in `--help` without importing grpc.
"""

from __future__ import annotations

import os

__all__ = ["BROKER_ADDRESS_ENV", "DEFAULT_BROKER", "broker_address_from_env"]

DEFAULT_BROKER = "http://localhost:8080"
BROKER_ADDRESS_ENV = "BROKER_ADDRESS"


def broker_address_from_env(default: str = DEFAULT_BROKER) -> str:
    """The broker address from $BROKER_ADDRESS, else `default`."""
    return os.environ.get(BROKER_ADDRESS_ENV) or default
