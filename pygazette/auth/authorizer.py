"""The client side of authorization: what turns the claims an RPC needs into its
`authorization: Bearer <token>` metadata.

`KeyedAuth` signs tokens itself from pre-shared keys; `BearerAuth` sends one given token.
"""

from __future__ import annotations

from typing import Protocol

from pygazette.auth.claims import Claims

__all__ = ["AUTHORIZATION", "Authorizer", "BearerAuth", "bearer_metadata"]

AUTHORIZATION = "authorization"
# How long a token signed for an RPC lasts, as Gazette's clients sign them (Apply: a minute).
DEFAULT_TOKEN_TTL = 3600.0


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
