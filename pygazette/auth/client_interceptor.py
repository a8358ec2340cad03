"""The client side of authorization: `grpc.aio` client interceptors that add the
`authorization` metadata to every RPC on a channel, from an `Authorizer`.

Each RPC is signed with Gazette's default claims for its method and request
(`rpc_claims.default_claims`). Streamed requests (Append, Replicate) can't be looked into
before the call starts: code that opens one names the journal with `claims_scope(...)`,
else the token grants the capability on every journal. Metadata the caller passes with an
`authorization` key of its own is left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import grpc.aio

from pygazette.auth.authorizer import AUTHORIZATION, DEFAULT_TOKEN_TTL, Authorizer
from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims
from pygazette.auth.rpc_claims import TOKEN_TTL, default_claims, journal_name_selector

__all__ = ["auth_interceptors", "claims_scope", "journal_claims_scope"]

_OVERRIDE: ContextVar[Claims | None] = ContextVar("pygazette_rpc_claims", default=None)


@contextlib.contextmanager
def claims_scope(claims: Claims) -> Iterator[None]:
    """RPCs started inside the block are signed for `claims` (Gazette's `WithClaims`)."""
    token = _OVERRIDE.set(claims)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def journal_claims_scope(
    capability: Capability, journal: str
) -> contextlib.AbstractContextManager[None]:
    """`claims_scope` of `capability` on the one journal `journal`."""
    return claims_scope(Claims(capability, journal_name_selector(journal)))


def _method(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


class _Signer:
    def __init__(self, auth: Authorizer) -> None:
        self.auth = auth

    def _details(
        self, details: grpc.aio.ClientCallDetails, request: Any | None
    ) -> grpc.aio.ClientCallDetails:
        existing = list(details.metadata or ())
        if any(key == AUTHORIZATION for key, _ in existing):
            return details
        method = _method(details)
        claims = _OVERRIDE.get() or default_claims(method, request)
        md = self.auth.metadata(claims, TOKEN_TTL.get(method, DEFAULT_TOKEN_TTL))
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=grpc.aio.Metadata(*existing, *md),
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


# gRPC files an interceptor under the first of the four kinds it is, so one class per kind.
class _UnaryUnary(_Signer, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc, type-arg]
    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details, request), request)


class _UnaryStream(_Signer, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc, type-arg]
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details, request), request)


class _StreamUnary(_Signer, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc, type-arg]
    async def intercept_stream_unary(
        self,
        continuation: Any,
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return await continuation(self._details(client_call_details, None), request_iterator)


class _StreamStream(_Signer, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc, type-arg]
    async def intercept_stream_stream(
        self,
        continuation: Any,
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return await continuation(self._details(client_call_details, None), request_iterator)


def auth_interceptors(auth: Authorizer | None) -> list[Any] | None:
    """The `interceptors=` of a channel whose RPCs `auth` signs (None: no authorization):
    one interceptor of each of gRPC's four kinds."""
    if auth is None:
        return None
    return [_UnaryUnary(auth), _UnaryStream(auth), _StreamUnary(auth), _StreamStream(auth)]
