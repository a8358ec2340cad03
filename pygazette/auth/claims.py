"""Claims: the scope of an authorization, and their JSON form inside a Gazette JWT.

A token grants `capability` against the resources its `selector` matches (an empty selector
matches everything). The JSON is Gazette's (`protocol.Claims`): `cap` (the bit mask), `sel`
(a LabelSelector as Go encodes it: `{"include": {"labels": [{"name", "value", "prefix"}]},
"exclude": {...}}`), plus the registered claims `exp` and `iat` (Unix seconds).
"""

from __future__ import annotations

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
    return doc


def claims_from_json(doc: Mapping[str, Any]) -> Claims:
    cap = doc.get("cap", 0)
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= int(Capability.ALL):
        raise ValueError("claims `cap` is not a 32-bit unsigned integer")
    return Claims(
        capability=cap,
        selector=selector_from_json(doc.get("sel")),
        expires_at=_numeric_date(doc, "exp"),
        issued_at=_numeric_date(doc, "iat"),
    )


def _numeric_date(doc: Mapping[str, Any], name: str) -> float | None:
    """A registered time claim: absent (None), or a JSON number, as Go's jwt.NumericDate
    takes it. Anything else (PyJWT takes an `exp` of "<digits>") is an error, never a claim
    without that time."""
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"claims `{name}` is not a number")
    return float(value)
