"""Journals and brokers as the allocator's items and members, and journal routes.

A journal (item) wants `replication` brokers (less when suspended); a broker (member) takes
up to its `journal_limit`; an assignment's value is the route its broker last advertised
for the journal. A journal is *consistent* when every assignment advertises the route the
assignments currently make: all its replicas have synchronised on that route, so the
allocator may drop one of them (Gazette's JournalIsConsistent).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from pygazette.allocator.state import Assignment, Item
from pygazette.keyspace.keyspace import KeyValue
from pygazette.keyspace.layout import (
    KeyLayout,
    decode_broker_spec,
    decode_journal_spec,
    decode_route,
    desired_replication,
    routes_equivalent,
)
from pygazette.protocol.pb import protocol_pb2 as pb


def route_of(assignments: Sequence[Assignment]) -> pb.Route:
    """The route assignments make: members in key order, primary at slot 0 (no endpoints)."""
    route = pb.Route(primary=-1)
    for a in assignments:
        if a.slot == 0:
            route.primary = len(route.members)
        route.members.add(zone=a.zone, suffix=a.suffix)
    return route


def route_value(route: pb.Route) -> bytes:
    """An assignment's value advertising `route` (members and primary, as Gazette marshals)."""
    bare = pb.Route(primary=route.primary)
    bare.members.extend(route.members)
    return bare.SerializeToString(deterministic=True)


def assignments_advertise(route: pb.Route, assignments: Sequence[Assignment]) -> bool:
    """Every assignment advertises `route` (and there is one per member)."""
    if len(route.members) != len(assignments):
        return False
    for a in assignments:
        try:
            advertised = decode_route(a.kv)
        except ValueError:
            return False
        if not routes_equivalent(route, advertised):
            return False
    return True


class JournalDecoder:
    """The allocator's decoder for a broker keyspace."""

    def __init__(self, layout: KeyLayout) -> None:
        self.layout = layout
        # Decoded once per key-value, and kept as long as it is: a journal's spec goes with
        # its key-value when the journal is deleted or its spec changes.
        self._specs: weakref.WeakKeyDictionary[KeyValue, pb.JournalSpec] = (
            weakref.WeakKeyDictionary()
        )

    def journal_spec(self, kv: KeyValue) -> pb.JournalSpec:
        """Decoded spec of an item key-value (shared: don't change it)."""
        spec = self._specs.get(kv)
        if spec is None:
            spec = self._specs[kv] = decode_journal_spec(self.layout, kv)
        return spec

    @property
    def cached_specs(self) -> int:
        """Decoded specs held (of key-values still held elsewhere)."""
        return len(self._specs)

    def item_replication(self, item_id: str, kv: KeyValue) -> int:
        return desired_replication(self.journal_spec(kv))

    def member_limit(self, zone: str, suffix: str, kv: KeyValue) -> tuple[int, bool]:
        spec = decode_broker_spec(self.layout, kv)
        return spec.journal_limit, spec.exiting

    def is_consistent(self, item: Item, assignment: Assignment, all_: Sequence[Assignment]) -> bool:
        return assignments_advertise(route_of(all_), all_)
