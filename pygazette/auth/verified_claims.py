"""The claims a server verified for the RPC being handled, and what they let it reach.

The server interceptor (`server_interceptor`) sets them for the handler's task; handlers and
the resolvers they call ask `current_claims()`, or `journal_permitted` / `shard_permitted`.
Outside an authorizing server (no `--auth-keys`, or the server's own background work) there
are no claims and everything is permitted.
"""

from __future__ import annotations

from contextvars import ContextVar

from pygazette.auth.claims import Claims
from pygazette.protocol.labels import journal_label_set_ext
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import rewrite_prefix_meta_label, selector_matches

__all__ = [
    "current_claims",
    "journal_name_permitted",
    "journal_permitted",
    "labels_permitted",
    "set_current_claims",
]

_CLAIMS: ContextVar[Claims | None] = ContextVar("pygazette_verified_claims", default=None)


def current_claims() -> Claims | None:
    return _CLAIMS.get()


def set_current_claims(claims: Claims | None) -> None:
    _CLAIMS.set(claims)


def labels_permitted(labels: pb.LabelSet, *, rewrite_prefix: bool = False) -> bool:
    """Whether the current claims' selector matches `labels` (a resource's labels with its
    meta-labels). With `rewrite_prefix`, a `prefix` selector label is taken as
    `name:prefix`, as Gazette's List does."""
    claims = _CLAIMS.get()
    if claims is None:
        return True
    sel = claims.selector
    if not sel.include.labels and not sel.exclude.labels:
        return True
    if rewrite_prefix:
        sel = rewrite_prefix_meta_label(sel)
    return selector_matches(sel, labels)


def journal_permitted(spec: pb.JournalSpec, *, rewrite_prefix: bool = False) -> bool:
    """Whether the current claims reach the journal of `spec` (its labels and name)."""
    if _CLAIMS.get() is None:
        return True
    return labels_permitted(
        journal_label_set_ext(spec.name, spec.labels), rewrite_prefix=rewrite_prefix
    )


def journal_name_permitted(name: str) -> bool:
    """Whether the current claims reach a journal by its name alone (Apply's deletes)."""
    if _CLAIMS.get() is None:
        return True
    return labels_permitted(pb.LabelSet(labels=[pb.Label(name="name", value=name)]))
