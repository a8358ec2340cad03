"""KeyedAuth and BearerAuth: Gazette's key format, signing, verification and token caching."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time

import jwt
import pytest

from pygazette.auth.authorizer import BearerAuth
from pygazette.auth.capability import Capability, missing_capability_message
from pygazette.auth.claims import Claims, claims_from_json, claims_to_json, label_selector
from pygazette.auth.configured import authorizer_from
from pygazette.auth.keyed_auth import AuthRefused, KeyedAuth, parse_auth_keys

S1 = b"first-secret-".ljust(64, b"1")
S2 = b"second-secret-".ljust(64, b"2")
K1 = base64.b64encode(S1).decode()
K2 = base64.b64encode(S2).decode()


def bearer(auth: KeyedAuth, claims: Claims, ttl: float = 60.0) -> str:
    return f"Bearer {auth.sign(claims, ttl)}"


def test_parse_keys_whitespace_and_commas() -> None:
    keys, allow = parse_auth_keys(f" {K1},{K2}\n AA== ")
    assert keys == [S1, S2]
    assert allow


@pytest.mark.parametrize("text", ["", "   ", "AA==", "AA==, AA=="])
def test_no_key_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="at least one auth key"):
        KeyedAuth(text)


def test_bad_base64_names_the_key() -> None:
    with pytest.raises(ValueError, match="index 1 is not valid base64"):
        KeyedAuth(f"{K1} not*base64")


def test_first_key_signs_any_key_verifies() -> None:
    signer = KeyedAuth(f"{K2} {K1}")
    verifier = KeyedAuth(f"{K1},{K2}")
    claims = verifier.verify(bearer(signer, Claims(Capability.READ)), Capability.READ)
    assert claims.capability == Capability.READ
    header = jwt.get_unverified_header(signer.sign(Claims(Capability.READ)))
    assert header["alg"] == "HS256"
    # Signed with the first key only.
    jwt.decode(signer.sign(Claims(1)), S2, algorithms=["HS256"])


def test_hs384_verifies_other_algorithms_do_not() -> None:
    auth = KeyedAuth(K1)
    now = int(time.time())
    doc = {"cap": 8, "sel": {}, "exp": now + 60, "iat": now}
    token = jwt.encode(doc, S1, algorithm="HS384")
    assert auth.verify(f"Bearer {token}", Capability.READ).capability == 8
    token = jwt.encode(doc, S1, algorithm="HS512")
    with pytest.raises(AuthRefused) as info:
        auth.verify(f"Bearer {token}", Capability.READ)
    assert info.value.unauthenticated


def test_refusals() -> None:
    auth = KeyedAuth(K1)
    other = KeyedAuth(K2)
    now = int(time.time())
    cases = {
        None: "missing or empty Authorization token",
        "": "expected 'Bearer'",  # Present, and empty: as Gazette, not a missing one.
        "Basic abc": "expected 'Bearer'",
        "Bearer not-a-jwt": "verifying Authorization",
        bearer(other, Claims(Capability.ALL)): (
            "verifying Authorization: token signature is invalid: signature is invalid"
        ),
        # Expired (beyond the 5 s leeway), no exp, iat in the future.
        "Bearer " + jwt.encode({"cap": 8, "exp": now - 10}, S1): "expired",
        "Bearer " + jwt.encode({"cap": 8}, S1): "exp",
        "Bearer " + jwt.encode({"cap": 8, "exp": now + 60, "iat": now + 60}, S1): (
            "token has invalid claims: token used before issued"
        ),
    }
    for header, message in cases.items():
        with pytest.raises(AuthRefused, match=message) as info:
            auth.verify(header, Capability.READ)
        assert info.value.unauthenticated, header


def _signed(payload: str, key: bytes = S1) -> str:
    """A token of `payload`, exactly as written (PyJWT's encoder refuses some claims Go
    decodes, and rewrites others)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signed = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(payload.encode())
    mac = hmac.new(key, signed.encode(), hashlib.sha256).digest()
    return f"Bearer {signed}.{b64(mac)}"


# (registered claims beside "cap":8, Gazette's verdict). The verdicts are Gazette's
# auth.KeyedAuth.Verify of v0.103.0 (golang-jwt v5.3.0), run on each payload. {E}: an expiry
# a minute away, {N}: now.
GAZETTE_VERDICTS = [
    ('"exp":{E}', True),
    # Audience, issuer, subject and id are decoded but checked against nothing.
    ('"exp":{E},"aud":"gazette"', True),
    ('"exp":{E},"aud":["a","b"]', True),
    ('"exp":{E},"aud":null', True),
    ('"exp":{E},"aud":5', False),
    ('"exp":{E},"aud":[1]', False),
    ('"exp":{E},"iss":"issuer"', True),
    ('"exp":{E},"iss":5', False),
    ('"exp":{E},"sub":null', True),
    ('"exp":{E},"jti":5', False),
    # NumericDates: a JSON number, or a JSON string holding one; null is absent.
    ('"exp":"{E}"', True),
    ('"exp":"{E}.5"', True),
    ('"exp":" {E}"', False),
    ('"exp":"0{E}"', False),
    ('"exp":null', False),
    ('"exp":{E},"iat":null', True),
    ('"exp":{E},"nbf":"12"', True),
    ('"exp":{E},"nbf":true', False),
    # Not before and issued at, within the 5 s leeway or not.
    ('"exp":{E},"nbf":{N}+3', True),
    ('"exp":{E},"nbf":{N}+60', False),
    ('"exp":{E},"iat":{N}+60', False),
    # Seconds past what a Go time holds wrap into the distant past: a "never expiring" token
    # has expired, and a "never valid" one is valid.
    ('"exp":1e30', False),
    ('"exp":9223372036854775807', False),
    ('"exp":{E},"nbf":1e30', True),
    ('"exp":1e400', False),
]


@pytest.mark.parametrize(("claims", "accepted"), GAZETTE_VERDICTS)
def test_registered_claims_are_judged_as_gazette_judges_them(claims: str, accepted: bool) -> None:
    """Tokens Gazette's verifier accepts are accepted, and those it refuses refused
    (UNAUTHENTICATED). PyJWT judged them by its own rules: it refused any token with an
    audience (common in tokens minted by an identity provider) and a null subject, and
    accepted an `iss` that is not a string, a `nbf` of true and an `exp` of 1e30 (a token
    that never expires, where Gazette's has expired)."""
    auth = KeyedAuth(K1)
    now = int(time.time())

    def at(match: re.Match[str]) -> str:
        return str(now + int(match.group(1) or 0))

    payload = "{" + '"cap":8,' + claims.replace("{E}", "{N}+60") + "}"
    payload = re.sub(r"\{N\}(?:\+(\d+))?", at, payload)
    if accepted:
        assert auth.verify(_signed(payload), Capability.READ).capability == 8
    else:
        with pytest.raises(AuthRefused) as info:
            auth.verify(_signed(payload), Capability.READ)
        assert info.value.unauthenticated


def test_times_are_truncated_to_the_second() -> None:
    """As Go's NumericDate keeps them: the expiry an RPC is bound to is the whole second."""
    auth = KeyedAuth(K1)
    now = int(time.time())
    token = jwt.encode({"cap": 8, "exp": now + 60.5, "iat": now}, S1)
    assert auth.verify(f"Bearer {token}", Capability.READ).expires_at == now + 60
    token = _signed(f'{{"cap":8,"exp":"{now + 60}"}}')
    assert auth.verify(token, Capability.READ).expires_at == now + 60


def test_leeway_of_five_seconds() -> None:
    auth = KeyedAuth(K1)
    now = int(time.time())
    token = jwt.encode({"cap": 8, "exp": now - 2, "iat": now + 2}, S1)
    assert auth.verify(f"Bearer {token}", Capability.READ).capability == 8


def test_missing_capability_is_permission_denied_with_gazettes_message() -> None:
    auth = KeyedAuth(K1)
    with pytest.raises(AuthRefused, match="missing required APPEND capability") as info:
        auth.verify(bearer(auth, Claims(Capability.READ | Capability.LIST)), Capability.APPEND)
    assert not info.value.unauthenticated
    assert missing_capability_message(0, 1 << 20) == (
        "authorization is missing required capability (have 0, but require 100000000000000000000)"
    )
    assert missing_capability_message(Capability.ALL, Capability.REPLICATE) is None


def test_allow_missing_during_rollout() -> None:
    auth = KeyedAuth(f"{K1} AA==")
    claims = auth.verify(None, Capability.APPEND)
    assert claims.capability == Capability.APPEND
    assert not claims.selector.include.labels
    # A token that is present is still verified; so is an empty one (Gazette lets through
    # only a request with no authorization metadata at all).
    with pytest.raises(AuthRefused):
        auth.verify("Bearer junk", Capability.APPEND)
    with pytest.raises(AuthRefused, match="expected 'Bearer'") as info:
        auth.verify("", Capability.APPEND)
    assert info.value.unauthenticated


def test_claims_json_is_gazettes() -> None:
    sel = label_selector(include={"name": "a/b"}, exclude={"env": ["dev", "test"]})
    doc = claims_to_json(Claims(Capability.READ, sel, expires_at=20.5, issued_at=10))
    assert doc == {
        "cap": 8,
        "sel": {
            "include": {"labels": [{"name": "name", "value": "a/b"}]},
            "exclude": {
                "labels": [{"name": "env", "value": "dev"}, {"name": "env", "value": "test"}]
            },
        },
        "exp": 20,
        "iat": 10,
    }
    assert claims_from_json(doc).selector == sel
    # As Go encodes an empty selector; and a prefix label.
    empty = claims_from_json({"cap": 2, "sel": {"include": {"labels": None}, "exclude": {}}})
    assert empty.selector == label_selector()
    pref = claims_from_json(
        {
            "cap": 2,
            "sel": {"include": {"labels": [{"name": "name", "value": "a/", "prefix": True}]}},
        }
    )
    assert pref.selector.include.labels[0].prefix
    with pytest.raises(ValueError):
        claims_from_json({"cap": -1})


def test_signed_tokens_are_cached_per_claims() -> None:
    auth = KeyedAuth(K1)
    a = Claims(Capability.APPEND, label_selector(include={"name": "a"}))
    b = Claims(Capability.APPEND, label_selector(include={"name": "b"}))
    first = auth.metadata(a)
    assert auth.metadata(Claims(Capability.APPEND, label_selector(include={"name": "a"}))) is first
    assert auth.metadata(b) != first
    # A token past half its lifetime is signed anew.
    short = auth.metadata(a, ttl=0.001)
    time.sleep(0.01)
    assert auth.metadata(a, ttl=0.001) is not short


def test_bearer_auth_and_configuration() -> None:
    md = BearerAuth("abc").metadata(Claims(Capability.READ))
    assert md == (("authorization", "Bearer abc"),)
    assert BearerAuth("Bearer abc").metadata(Claims(0)) == md
    with pytest.raises(ValueError):
        BearerAuth(" ")
    assert isinstance(authorizer_from(K1, "tok"), KeyedAuth)
    assert isinstance(authorizer_from("", "tok"), BearerAuth)
    assert authorizer_from("", "") is None
