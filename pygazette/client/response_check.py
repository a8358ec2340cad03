"""Checking every response the client receives against Gazette's rules, as Gazette's client does.

Each response is checked, as it arrives, with the validator of its message
(`pygazette.protocol.validation`, Gazette's `Validate()` methods); a response that breaks a
rule, or the RPC's contract beyond one message (a Read answering an offset before the one
asked for, a listing's empty middle response), raises `InvalidResponse`, naming the RPC, what
it was about and the rule, and is counted in `pygazette_client_invalid_responses_total`{rpc}.
Nothing a broker sends wrong is silently accepted; what a caller does about it is its own
choice (a RetryReader retries after a backoff, as Gazette's does).

Cost: a Read's content chunk gets only the few cheap checks Gazette makes of one (status OK,
and no header, write head, fragment or fragment URL beside the content), inline, on the
content the caller already took from the message (~2 µs a chunk, where taking a 128 KiB
chunk's content out of its message costs ~13 µs); every other response is validated in full
(~13 µs for a Read's metadata).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from pygazette.client.errors import InvalidResponse
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_read_response

__all__ = ["INVALID_RESPONSES", "check_read_response", "check_response", "invalid_response"]

INVALID_RESPONSES = Counter(
    "pygazette_client_invalid_responses_total",
    "Responses received that break Gazette's protocol rules (raised as InvalidResponse), by RPC.",
    ["rpc"],
)


def invalid_response(rpc: str, subject: str, rule: str) -> InvalidResponse:
    """Count a response of `rpc` that broke `rule`, and return the error to raise."""
    INVALID_RESPONSES.labels(rpc).inc()
    return InvalidResponse(rpc, subject, rule)


def check_response(rpc: str, subject: str, validate: Callable[[Any], None], resp: Any) -> None:
    """Raise (and count) `InvalidResponse` unless `validate(resp)` passes."""
    try:
        validate(resp)
    except ValidationError as err:
        raise invalid_response(rpc, subject, str(err)) from None


_OK = pb.OK


def check_read_response(journal: str, resp: pb.ReadResponse, content: bytes | None = None) -> None:
    """A Read response: a content chunk's cheap checks, or the whole of a metadata response.

    `content`, when given, is `resp.content` as the caller already took it: each access of a
    bytes field copies it (upb), which would cost more than every check here together.
    """
    if content is None:
        content = resp.content
    # A content chunk passing what validate_read_response checks of one, without the calls.
    if (
        content
        and resp.status == _OK
        and not (resp.write_head or resp.fragment_url)
        and not resp.HasField("fragment")
        and not resp.HasField("header")
    ):
        return
    check_response("Read", journal, validate_read_response, resp)
