"""The client side of authorization: what turns the claims an RPC needs into its
`authorization: Bearer <token>` metadata.

`KeyedAuth` signs tokens itself from pre-shared keys; `BearerAuth` sends one given token.
"""

from __future__ import annotations

import math
import os
from typing import Protocol

from pygazette.auth.claims import Claims

__all__ = ["AUTHORIZATION", "Authorizer", "BearerAuth", "bearer_metadata"]

AUTHORIZATION = "authorization"
TOKEN_TTL_ENV = "PYGAZETTE_TOKEN_TTL_SECONDS"


def _token_ttl() -> float:
    text = os.environ.get(TOKEN_TTL_ENV, "")
    if not text:
        return 3600.0
    try:
        ttl = float(text)
    except ValueError:
        ttl = math.nan
    if not math.isfinite(ttl) or ttl < 1:
        raise ValueError(f"{TOKEN_TTL_ENV}={text!r}: expected a number of seconds >= 1")
    return ttl


# How long a token signed for an RPC lasts, as Gazette's clients sign them (Apply: a minute);
# the environment's PYGAZETTE_TOKEN_TTL_SECONDS sets it for a process.
DEFAULT_TOKEN_TTL = _token_ttl()


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((AUTHORIZATION, f"Bearer {token}"),)


class Authorizer(Protocol):
    """Produces the metadata that authorizes an RPC needing `claims`."""

    def metadata(
        self, claims: Claims, ttl: float = DEFAULT_TOKEN_TTL
    ) -> tuple[tuple[str, str], ...]: ...


class BearerAuth:
    """An Authorizer that sends one pre-shared token with every RPC, whatever it needs."""

    def __init__(self, token: str) -> None:
        token = token.strip()
        if token.lower().startswith("bearer "):
            token = token[len("bearer ") :].strip()
        if not token:
            raise ValueError("an empty authorization token")
        self._metadata = bearer_metadata(token)

    def metadata(
        self, claims: Claims, ttl: float = DEFAULT_TOKEN_TTL
    ) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def __repr__(self) -> str:
        return "BearerAuth(<token>)"
