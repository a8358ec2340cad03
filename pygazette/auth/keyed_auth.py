"""Authorization with pre-shared HMAC keys, as Gazette's `--auth-keys` (`auth.KeyedAuth`).

Keys are base64, separated by whitespace and/or commas. The first key signs (HS256); any key
verifies (HS256 or HS384). The special key `AA==` (one zero byte) lets requests without an
authorization header through, with exactly the capability they need, for rolling
authorization out across a running cluster.

Verification follows Gazette: a token must carry `exp`; `iat` and `nbf`, if present, must
not lie in the future; 5 seconds of clock skew are allowed either way. The claims are decoded
and judged as Gazette's Go verifier does (`claims.claims_from_json`), not by PyJWT's rules.
Refusals are worded as golang-jwt words them (a token cut short, a signing method other than
HS256/HS384, a signature no key made, its times), except where a token's JSON doesn't decode.

Signed tokens are cached per (capability, selector) until half their lifetime has passed, so
a hot path doesn't sign per call.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
import warnings
from dataclasses import dataclass

import jwt

from pygazette.auth.authorizer import DEFAULT_TOKEN_TTL, bearer_metadata
from pygazette.auth.capability import Capability, missing_capability_message
from pygazette.auth.claims import Claims, claims_from_json, claims_to_json, label_selector

__all__ = [
    "ALLOW_MISSING_KEY",
    "AuthRefused",
    "KeyedAuth",
    "parse_auth_keys",
]

ALLOW_MISSING_KEY = "AA=="
LEEWAY_SECONDS = 5.0
SIGNING_ALGORITHM = "HS256"
VERIFY_ALGORITHMS = ["HS256", "HS384"]
MAX_CACHED_TOKENS = 4096
# A token of at most this lifetime (a Shard RPC's or a journal Apply's minute) is reused for
# at most REUSE_SHORT_SECONDS: a call gets (nearly) all of its lifetime, as Gazette's clients
# sign one per call. A Stat waiting for a shard to read through runs until it expires.
SHORT_TOKEN_TTL = 60.0
REUSE_SHORT_SECONDS = 1.0

# PyJWT checks the signature and algorithm only; the claims are checked as Go checks them.
_SIGNATURE_ONLY: jwt.types.Options = {
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "require": [],
}

ERR_MISSING = "missing or empty Authorization token"
ERR_NOT_BEARER = "invalid or unsupported Authorization header (expected 'Bearer')"

# Gazette accepts keys of any length; PyJWT warns about short HMAC keys on every call.
warnings.filterwarnings("ignore", category=jwt.warnings.InsecureKeyLengthWarning)

# Claims that match nothing: what a failed verification leaves behind, just in case.
NEVER_MATCH = label_selector(include={"this-label-will": "never-match"})


class AuthRefused(Exception):
    """A request's authorization was refused. `unauthenticated` tells a token that is
    missing or invalid (gRPC UNAUTHENTICATED) from one lacking a capability
    (PERMISSION_DENIED)."""

    def __init__(self, message: str, *, unauthenticated: bool) -> None:
        super().__init__(message)
        self.unauthenticated = unauthenticated


def parse_auth_keys(text: str) -> tuple[list[bytes], bool]:
    """The keys of an `--auth-keys` value, and whether `AA==` (allow missing) is among them.

    ValueError if a key is not base64 or no key (other than `AA==`) is given."""
    keys: list[bytes] = []
    allow_missing = False
    for i, key in enumerate(re.split(r"[\s,]+", text.strip()) if text.strip() else []):
        if key == ALLOW_MISSING_KEY:
            allow_missing = True
            continue
        try:
            keys.append(base64.b64decode(key, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"auth key at index {i} is not valid base64: {exc}") from None
    if not keys:
        raise ValueError("at least one auth key must be provided (base64, comma separated)")
    return keys, allow_missing


@dataclass(slots=True)
class _Cached:
    metadata: tuple[tuple[str, str], ...]
    refresh_at: float


class KeyedAuth:
    """Signs (client side) and verifies (server side) tokens with pre-shared keys."""

    def __init__(self, base64_keys: str) -> None:
        self.keys, self.allow_missing = parse_auth_keys(base64_keys)
        # Seconds past its expiry a token is still accepted (and an RPC it started may run).
        self.leeway = LEEWAY_SECONDS
        self._cache: dict[tuple[int, bytes, float], _Cached] = {}
        self._lock = threading.Lock()
        # Tokens verified before (a client reuses its token for many RPCs): their claims.
        self._verified: dict[str, Claims] = {}

    def __repr__(self) -> str:
        return f"KeyedAuth(<{len(self.keys)} keys>, allow_missing={self.allow_missing})"

    # Signing.
    def sign(self, claims: Claims, ttl: float = DEFAULT_TOKEN_TTL) -> str:
        """A token for `claims`, issued now and expiring in `ttl` seconds."""
        now = time.time()
        doc = claims_to_json(
            Claims(claims.capability, claims.selector, expires_at=now + ttl, issued_at=now)
        )
        return jwt.encode(doc, self.keys[0], algorithm=SIGNING_ALGORITHM)

    def metadata(
        self, claims: Claims, ttl: float = DEFAULT_TOKEN_TTL
    ) -> tuple[tuple[str, str], ...]:
        """The authorization metadata for `claims`: a cached token while it has at least half
        its lifetime left (a short-lived one: all but REUSE_SHORT_SECONDS of it), else a
        freshly signed one."""
        cap, sel = claims.cache_key()
        key = (cap, sel, ttl)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now < cached.refresh_at:
            return cached.metadata
        md = bearer_metadata(self.sign(claims, ttl))
        with self._lock:
            if len(self._cache) >= MAX_CACHED_TOKENS:
                self._cache.clear()
            reuse = ttl / 2 if ttl > SHORT_TOKEN_TTL else min(ttl / 2, REUSE_SHORT_SECONDS)
            self._cache[key] = _Cached(md, now + reuse)
        return md

    # Verifying.
    def verify(self, authorization: str | None, require: int) -> Claims:
        """The verified claims of an `authorization` header value, which must grant
        `require`; AuthRefused if they can't be had."""
        if authorization is None:  # No authorization metadata (an empty one is a bad one).
            if self.allow_missing:
                # No token, no expiry: nothing ends the RPC early.
                return Claims(Capability(require) if require else 0)
            raise AuthRefused(ERR_MISSING, unauthenticated=True)
        if not authorization.startswith("Bearer "):
            raise AuthRefused(ERR_NOT_BEARER, unauthenticated=True)
        token = authorization[len("Bearer ") :]
        claims = self._verified.get(token)
        if claims is None or not time.time() < (claims.expires_at or 0) + self.leeway:
            doc = self._decode(token)
            try:
                claims = claims_from_json(doc)
            except ValueError as exc:
                raise AuthRefused(f"verifying Authorization: {exc}", unauthenticated=True) from None
            if (problem := self._time_problem(claims)) is not None:
                raise AuthRefused(
                    f"verifying Authorization: token has invalid claims: {problem}",
                    unauthenticated=True,
                )
            with self._lock:
                if len(self._verified) >= MAX_CACHED_TOKENS:
                    self._verified.clear()
                self._verified[token] = claims
        if (message := missing_capability_message(claims.capability, require)) is not None:
            raise AuthRefused(message, unauthenticated=False)
        return claims

    def _time_problem(self, claims: Claims) -> str | None:
        """Why the times of `claims` make them invalid now (None: they don't), as Gazette's
        verifier (jwt/v5 with WithExpirationRequired, WithIssuedAt and its leeway) judges."""
        now, leeway = time.time(), self.leeway
        if claims.expires_at is None:
            return "token is missing required claim: exp claim is required"
        if not now < claims.expires_at + leeway:
            return "token is expired"
        if claims.not_before is not None and now < claims.not_before - leeway:
            return "token is not valid yet"
        if claims.issued_at is not None and now < claims.issued_at - leeway:
            return "token used before issued"
        return None

    def _decode(self, token: str) -> dict[str, object]:
        """The verified payload of `token`: its signature and algorithm checked. Its claims
        are Go's to decode and judge (`claims_from_json`, `_time_problem`): PyJWT's own
        checks refuse tokens Gazette takes (any `aud`, a `sub` of null) and take ones it
        refuses."""
        refusal = _unverifiable(token)
        if refusal is not None:
            raise AuthRefused(f"verifying Authorization: {refusal}", unauthenticated=True)
        last: Exception | None = None
        for key in self.keys:
            try:
                doc: dict[str, object] = jwt.decode(
                    token, key, algorithms=VERIFY_ALGORITHMS, options=_SIGNATURE_ONLY
                )
                return doc
            except jwt.InvalidSignatureError as exc:
                last = exc  # Another key may have signed it.
            except jwt.PyJWTError as exc:
                last = exc
                break
        if isinstance(last, jwt.InvalidSignatureError):
            message = "token signature is invalid: signature is invalid"  # No key signed it.
        else:
            message = str(last)
        raise AuthRefused(f"verifying Authorization: {message}", unauthenticated=True)


# The signing methods golang-jwt knows (others are "unavailable").
_GO_METHODS = frozenset(
    "HS256 HS384 HS512 RS256 RS384 RS512 PS256 PS384 PS512 ES256 ES384 ES512 EdDSA none".split()
)


def _unverifiable(token: str) -> str | None:
    """Why golang-jwt's parser refuses `token` before checking its signature, in its words,
    for the refusals an operator meets (a token cut short, a method other than HS256 and
    HS384); None: PyJWT is left to judge it."""
    parts = token.split(".")
    if len(parts) != 3:
        return "token is malformed: token contains an invalid number of segments"
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (ValueError, binascii.Error):
        return None  # PyJWT's message.
    if not isinstance(header, dict):
        return None
    alg = header.get("alg")
    if not isinstance(alg, str):
        return "token is unverifiable: signing method (alg) is unspecified"
    if alg not in _GO_METHODS:
        return "token is unverifiable: signing method (alg) is unavailable"
    if alg not in VERIFY_ALGORITHMS:
        return f"token signature is invalid: signing method {alg} is invalid"
    return None
