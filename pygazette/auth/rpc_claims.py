"""Which capability each RPC requires (server side), and the claims a client signs for it
by default (client side), as Gazette's `AuthJournalClient`/`AuthShardClient` and
`VerifiedJournalServer`/`VerifiedShardServer` have them.

Our own `pygazette.Retention/Prune` removes fragments, so it is an APPLY (signed with the
journal's name selector); `pygazette.PeerJournal/AppendWhole` is an Append in one message, so
an APPEND (signed with its journal's name selector), and `pygazette.PeerJournal/ReplicateWhole`
a Replicate stream in one message, so a REPLICATE (signed with its journal's name selector).
Methods not listed here require every capability (ALL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pygazette.auth.capability import Capability
from pygazette.auth.claims import Claims, label_selector
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = ["REQUIRED_CAPABILITY", "TOKEN_TTL", "default_claims", "journal_name_selector"]

J = "/protocol.Journal/"
S = "/consumer.Shard/"
PRUNE = "/pygazette.Retention/Prune"
APPEND_WHOLE = "/pygazette.PeerJournal/AppendWhole"
REPLICATE_WHOLE = "/pygazette.PeerJournal/ReplicateWhole"

REQUIRED_CAPABILITY: dict[str, Capability] = {
    J + "List": Capability.LIST,
    J + "Apply": Capability.APPLY,
    J + "Read": Capability.READ,
    J + "Append": Capability.APPEND,
    J + "Replicate": Capability.REPLICATE,
    J + "ListFragments": Capability.READ,
    J + "FragmentStoreHealth": Capability.READ,
    PRUNE: Capability.APPLY,
    APPEND_WHOLE: Capability.APPEND,
    REPLICATE_WHOLE: Capability.REPLICATE,
    S + "Stat": Capability.READ,
    S + "List": Capability.LIST,
    S + "Apply": Capability.APPLY,
    S + "GetHints": Capability.READ,
    S + "Unassign": Capability.APPLY,
}

# Lifetime of the tokens clients sign per method (seconds), as Gazette's clients sign them:
# an hour (List, Read, Append and Replicate may stream for long), but a journal Apply and every
# (unary) Shard RPC a minute.
TOKEN_TTL: dict[str, float] = {
    J + "Apply": 60.0,
    S + "Stat": 60.0,
    S + "List": 60.0,
    S + "Apply": 60.0,
    S + "GetHints": 60.0,
    S + "Unassign": 60.0,
}


def journal_name_selector(journal: str) -> pb.LabelSelector:
    """A selector of the one journal `journal` (its `;metadata` suffix dropped)."""
    return label_selector(include={"name": journal.split(";", 1)[0]})


def _name(cap: Capability) -> Callable[[Any], Claims]:
    return lambda req: Claims(cap, journal_name_selector(req.journal))


def _whole_append(req: Any) -> Claims:
    first = req.requests[0] if req.requests else pb.AppendRequest()
    return Claims(Capability.APPEND, journal_name_selector(first.journal))


def _whole_replicate(req: Any) -> Claims:
    first = req.requests[0] if req.requests else pb.ReplicateRequest()
    return Claims(Capability.REPLICATE, journal_name_selector(first.proposal.journal))


def _shard(cap: Capability) -> Callable[[Any], Claims]:
    return lambda req: Claims(cap, label_selector(include={"id": req.shard}))


def _selector(cap: Capability) -> Callable[[Any], Claims]:
    def claims(req: Any) -> Claims:
        sel = pb.LabelSelector()
        sel.CopyFrom(req.selector)
        return Claims(cap, sel)

    return claims


def _unassign(req: Any) -> Claims:
    return Claims(Capability.APPLY, label_selector(include={"id": list(req.shards)}))


_DEFAULTS: dict[str, Callable[[Any], Claims]] = {
    J + "List": _selector(Capability.LIST),
    J + "Read": _name(Capability.READ),
    J + "ListFragments": _name(Capability.READ),
    PRUNE: _name(Capability.APPLY),
    APPEND_WHOLE: _whole_append,
    REPLICATE_WHOLE: _whole_replicate,
    S + "Stat": _shard(Capability.READ),
    S + "List": _selector(Capability.LIST),
    S + "GetHints": _shard(Capability.READ),
    S + "Unassign": _unassign,
}


def default_claims(method: str, request: Any | None) -> Claims:
    """The claims a client signs for `method` carrying `request` (None for a streamed
    request: Append and Replicate, which then get their capability on every journal)."""
    make = _DEFAULTS.get(method)
    if make is not None and request is not None:
        try:
            return make(request)
        except AttributeError:  # Not the request type we expect: sign the capability only.
            pass
    return Claims(REQUIRED_CAPABILITY.get(method, Capability.ALL))
