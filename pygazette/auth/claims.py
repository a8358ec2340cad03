"""Claims: the scope of an authorization, and their JSON form inside a Gazette JWT.

A token grants `capability` against the resources its `selector` matches (an empty selector
matches everything). The JSON is Gazette's (`protocol.Claims`): `cap` (the bit mask), `sel`
(a LabelSelector as Go encodes it: `{"include": {"labels": [{"name", "value", "prefix"}]},
"exclude": {...}}`), plus the registered claims `exp` and `iat` (Unix seconds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pygazette.auth.capability import Capability
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = [
    "Claims",
    "claims_from_json",
    "claims_to_json",
    "label_selector",
    "selector_from_json",
    "selector_to_json",
]


@dataclass(frozen=True, slots=True)
class Claims:
    capability: int
    selector: pb.LabelSelector = field(default_factory=pb.LabelSelector)
    expires_at: float | None = None  # `exp`, Unix seconds.
    issued_at: float | None = None  # `iat`, Unix seconds.
    not_before: float | None = None  # `nbf`, Unix seconds.

    def cache_key(self) -> tuple[int, bytes]:
        """What identifies these claims apart from their times."""
        return int(self.capability), self.selector.SerializeToString(deterministic=True)


def label_selector(
    include: Mapping[str, str | list[str]] | None = None,
    exclude: Mapping[str, str | list[str]] | None = None,
) -> pb.LabelSelector:
    """A LabelSelector of name → value(s) pairs, its labels sorted as Gazette keeps them."""
    sel = pb.LabelSelector()
    for target, pairs in ((sel.include, include), (sel.exclude, exclude)):
        labels: list[tuple[str, str]] = []
        for name, values in (pairs or {}).items():
            for value in [values] if isinstance(values, str) else values:
                labels.append((name, value))
        for name, value in sorted(set(labels)):
            target.labels.add(name=name, value=value)
    return sel


def _labels_to_json(ls: pb.LabelSet) -> dict[str, Any]:
    labels: list[dict[str, Any]] | None = None
    if ls.labels:
        labels = []
        for label in ls.labels:
            item: dict[str, Any] = {}
            if label.name:
                item["name"] = label.name
            if label.value:
                item["value"] = label.value
            if label.prefix:
                item["prefix"] = True
            labels.append(item)
    return {"labels": labels}


def _labels_from_json(doc: Any, where: str) -> pb.LabelSet:
    ls = pb.LabelSet()
    if doc is None:
        return ls
    if not isinstance(doc, Mapping):
        raise ValueError(f"claims {where} is not an object")
    for item in doc.get("labels") or []:
        if not isinstance(item, Mapping):
            raise ValueError(f"claims {where} label is not an object")
        name, value, prefix = item.get("name", ""), item.get("value", ""), item.get("prefix", False)
        if not isinstance(name, str) or not isinstance(value, str) or not isinstance(prefix, bool):
            raise ValueError(f"claims {where} label has a field of the wrong type")
        ls.labels.add(name=name, value=value, prefix=prefix)
    return ls


def selector_to_json(sel: pb.LabelSelector) -> dict[str, Any]:
    return {"include": _labels_to_json(sel.include), "exclude": _labels_to_json(sel.exclude)}


def selector_from_json(doc: Any) -> pb.LabelSelector:
    sel = pb.LabelSelector()
    if doc is None:
        return sel
    if not isinstance(doc, Mapping):
        raise ValueError("claims `sel` is not an object")
    include = _labels_from_json(doc.get("include"), "sel.include")
    exclude = _labels_from_json(doc.get("exclude"), "sel.exclude")
    if include.labels:
        sel.include.CopyFrom(include)
    if exclude.labels:
        sel.exclude.CopyFrom(exclude)
    return sel


def claims_to_json(claims: Claims) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cap": int(claims.capability) & int(Capability.ALL),
        "sel": selector_to_json(claims.selector),
    }
    if claims.expires_at is not None:
        doc["exp"] = int(claims.expires_at)
    if claims.issued_at is not None:
        doc["iat"] = int(claims.issued_at)
    if claims.not_before is not None:
        doc["nbf"] = int(claims.not_before)
    return doc


def claims_from_json(doc: Mapping[str, Any]) -> Claims:
    """The claims of a token's JSON, decoded as Go decodes Gazette's `protocol.Claims` (with
    jwt.RegisteredClaims): ValueError for a claim Go cannot decode. `aud`, `iss`, `sub` and
    `jti` are decoded (a string, or for `aud` a list of them) but not checked against
    anything, as Gazette checks none of them."""
    cap = doc.get("cap")
    if cap is None:  # Absent or null: Go leaves the field zero.
        cap = 0
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= int(Capability.ALL):
        raise ValueError("claims `cap` is not a 32-bit unsigned integer")
    for name in ("iss", "sub", "jti"):
        if doc.get(name) is not None and not isinstance(doc[name], str):
            raise ValueError(f"claims `{name}` is not a string")
    aud = doc.get("aud")
    if not (
        aud is None
        or isinstance(aud, str)
        or (isinstance(aud, list) and all(isinstance(a, str) for a in aud))
    ):
        raise ValueError("claims `aud` is not a string or a list of strings")
    return Claims(
        capability=cap,
        selector=selector_from_json(doc.get("sel")),
        expires_at=_numeric_date(doc, "exp"),
        issued_at=_numeric_date(doc, "iat"),
        not_before=_numeric_date(doc, "nbf"),
    )


# A JSON number, which Go's json.Number also takes from a JSON string.
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# Seconds Go's time.Unix holds without overflow (its internal seconds count from year 1).
_GO_MAX_UNIX = (1 << 63) - 1 - 62135596800


def _numeric_date(doc: Mapping[str, Any], name: str) -> float | None:
    """A registered time claim as Go's jwt.NumericDate decodes it: absent or null (None); a
    JSON number, or a JSON string holding one; truncated to the second. Anything else is an
    error, never a claim without that time. Seconds past what a Go time holds (an `exp` of
    1e30, meant as "never") wrap into the distant past there, and so do here."""
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, str) and _JSON_NUMBER.fullmatch(value):
        value = float(value)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"claims `{name}` is not a number")
    if not math.isfinite(value):
        raise ValueError(f"claims `{name}` is out of range")
    seconds = math.floor(value)
    if not -(1 << 63) <= seconds <= _GO_MAX_UNIX:
        return -math.inf
    return float(seconds)
