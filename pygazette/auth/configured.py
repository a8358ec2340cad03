"""The client Authorizer that configuration asks for: `--auth-keys` (sign tokens from
pre-shared keys) wins over `--auth-token` (send a given token); neither means none.
Also the environment variables Gazette's tools read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pygazette.auth.authorizer import Authorizer

__all__ = ["AUTH_KEYS_ENV", "AUTH_TOKEN_ENV", "authorizer_from", "authorizer_from_env"]

AUTH_KEYS_ENV = "AUTH_KEYS"
AUTH_TOKEN_ENV = "AUTH_TOKEN"


def authorizer_from(
    auth_keys: str | None = None, auth_token: str | None = None
) -> Authorizer | None:
    """KeyedAuth(auth_keys) if keys are given, else BearerAuth(auth_token) if a token is,
    else None. ValueError (a one-line message) for unusable keys."""
    # Imported when used: the command line reads these options on every run, and JWT
    # signing (PyJWT, cryptography) is costly to import.
    if auth_keys and auth_keys.strip():
        from pygazette.auth.keyed_auth import KeyedAuth

        return KeyedAuth(auth_keys)
    if auth_token and auth_token.strip():
        from pygazette.auth.authorizer import BearerAuth

        return BearerAuth(auth_token)
    return None


def authorizer_from_env(env: Mapping[str, str] | None = None) -> Authorizer | None:
    """`authorizer_from` of $AUTH_KEYS and $AUTH_TOKEN."""
    env = os.environ if env is None else env
    return authorizer_from(env.get(AUTH_KEYS_ENV), env.get(AUTH_TOKEN_ENV))
