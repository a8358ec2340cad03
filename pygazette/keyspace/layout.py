"""Gazette's key layout under a keyspace root, and the decoding of its values.

    <root>/items/<journal>                          JournalSpec (protobuf)
    <root>/members/<zone>#<suffix>                  BrokerSpec (protobuf), under the broker's lease
    <root>/assign/<journal>#<zone>#<suffix>#<slot>  Route (protobuf; empty until advertised),
                                                    under the assigned broker's lease

These are exactly the keys and encodings Gazette's brokers use, so a Gazette broker and a
pygazette broker can share one etcd. '#' sorts below every character allowed in names, so
the natural order of members and assignments is the lexicographic order of their keys.
Slot 0 of an item's assignments is its primary.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from pygazette.keyspace.keyspace import DEFAULT_ROOT, KeyValue
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import (
    validate_broker_spec,
    validate_journal_spec,
    validate_route,
)

SEP = "#"


class KeyDecodeError(ValueError):
    """A key or value under the root that doesn't decode (foreign or corrupt)."""


_M = TypeVar("_M", bound=Message)


def decode_value(kv: KeyValue, into: _M, validate: Callable[[_M], None]) -> _M:
    """`into`, parsed from the key's value and checked by `validate`; KeyDecodeError naming
    the key if the value doesn't parse or isn't valid."""
    try:
        into.ParseFromString(kv.value)
        validate(into)
    except (ValidationError, DecodeError, ValueError) as exc:
        raise KeyDecodeError(f"{kv.key}: {exc}") from exc
    return into


@dataclass(frozen=True, slots=True)
class AssignmentKey:
    item: str
    zone: str
    suffix: str
    slot: int


def _check_above_sep(text: str, what: str) -> None:
    if any(ch <= SEP for ch in text):
        raise ValueError(f"{what} {text!r} has a character <= {SEP!r}")


# A character no name in a key may hold: one below SEP (nor SEP itself, which splits them),
# or a lone surrogate, which stands for a byte of a key that isn't UTF-8 (`keyspace.etcd`):
# such a name is no journal's, shard's or process's, nor can it go in a Route.
_NOT_IN_NAMES = re.compile("[\\x00-\\x22\\ud800-\\udfff]")


class KeyLayout:
    """Keys of items, members and assignments under one root."""

    def __init__(self, root: str = DEFAULT_ROOT) -> None:
        self.root = root
        self.items_prefix = root + "/items/"
        self.members_prefix = root + "/members/"
        self.assign_prefix = root + "/assign/"

    # Encoding.
    def item_key(self, item: str) -> str:
        _check_above_sep(item, "item ID")
        return self.items_prefix + item

    def member_key(self, zone: str, suffix: str) -> str:
        _check_above_sep(zone, "zone")
        _check_above_sep(suffix, "member suffix")
        return self.members_prefix + zone + SEP + suffix

    def item_assignments_prefix(self, item: str) -> str:
        _check_above_sep(item, "item ID")
        return self.assign_prefix + item + SEP

    def assignment_key(self, a: AssignmentKey) -> str:
        _check_above_sep(a.zone, "zone")
        _check_above_sep(a.suffix, "member suffix")
        return self.item_assignments_prefix(a.item) + a.zone + SEP + a.suffix + SEP + str(a.slot)

    # Decoding.
    def parse_item_key(self, key: str) -> str:
        if not key.startswith(self.items_prefix):
            raise KeyDecodeError(f"not an item key: {key!r}")
        item = key[len(self.items_prefix) :]
        if not item or SEP in item or _NOT_IN_NAMES.search(item):
            raise KeyDecodeError(f"expected (id) in item key {key!r}")
        return item

    def parse_member_key(self, key: str) -> tuple[str, str]:
        if not key.startswith(self.members_prefix):
            raise KeyDecodeError(f"not a member key: {key!r}")
        rest = key[len(self.members_prefix) :]
        parts = rest.split(SEP)
        if len(parts) != 2 or not all(parts) or _NOT_IN_NAMES.search(rest):
            raise KeyDecodeError(f"expected (zone, suffix) in member key {key!r}")
        return parts[0], parts[1]

    def parse_assignment_key(self, key: str) -> AssignmentKey:
        if not key.startswith(self.assign_prefix):
            raise KeyDecodeError(f"not an assignment key: {key!r}")
        rest = key[len(self.assign_prefix) :]
        parts = rest.split(SEP)
        if len(parts) != 4 or not all(parts) or _NOT_IN_NAMES.search(rest):
            raise KeyDecodeError(
                f"expected (item-id, member-zone, member-suffix, slot) in assignment key {key!r}"
            )
        try:
            slot = int(parts[3])
        except ValueError:
            raise KeyDecodeError(f"bad slot in assignment key {key!r}") from None
        if slot < 0 or str(slot) != parts[3]:
            raise KeyDecodeError(f"bad slot in assignment key {key!r}")
        return AssignmentKey(parts[0], parts[1], parts[2], slot)


def decode_journal_spec(layout: KeyLayout, kv: KeyValue) -> pb.JournalSpec:
    """The JournalSpec of an item key, which must be valid and named like its key."""
    name = layout.parse_item_key(kv.key)
    spec = decode_value(kv, pb.JournalSpec(), validate_journal_spec)
    if spec.name != name:
        raise KeyDecodeError(f"JournalSpec name doesn't match item ID ({spec.name} vs {name})")
    return spec


def decode_broker_spec(layout: KeyLayout, kv: KeyValue) -> pb.BrokerSpec:
    """The BrokerSpec of a member key, which must be valid and identified like its key."""
    zone, suffix = layout.parse_member_key(kv.key)
    spec = decode_value(kv, pb.BrokerSpec(), validate_broker_spec)
    pid = spec.process_spec.id
    if (pid.zone, pid.suffix) != (zone, suffix):
        raise KeyDecodeError(
            f"BrokerSpec ID doesn't match member key ({pid.zone}#{pid.suffix} vs {zone}#{suffix})"
        )
    return spec


def decode_route(kv: KeyValue) -> pb.Route:
    """An assignment's advertised Route; an empty value is the empty route (primary -1)."""
    route = pb.Route(primary=-1)
    if not kv.value:
        return route
    return decode_value(kv, route, validate_route)


def routes_equivalent(a: pb.Route, b: pb.Route) -> bool:
    """Same members in the same order and the same primary (endpoints aside), as Gazette's."""
    if a.primary != b.primary or len(a.members) != len(b.members):
        return False
    return all(
        x.zone == y.zone and x.suffix == y.suffix for x, y in zip(a.members, b.members, strict=True)
    )


def desired_replication(spec: pb.JournalSpec) -> int:
    """Replicas a journal wants: its replication, less when suspended (as Gazette's)."""
    level = spec.suspend.level if spec.HasField("suspend") else pb.JournalSpec.Suspend.NONE
    if level == pb.JournalSpec.Suspend.PARTIAL:
        return 1
    if level == pb.JournalSpec.Suspend.FULL:
        return 0
    return spec.replication
