"""Journals and brokers as the allocator's items and members, and journal routes.

A journal (item) wants `replication` brokers (less when suspended); a broker (member) takes
up to its `journal_limit`; an assignment's value is the route its broker last advertised
for the journal. A journal is *consistent* when every assignment advertises the route the
assignments currently make: all its replicas have synchronised on that route, so the
allocator may drop one of them (Gazette's JournalIsConsistent).
"""

from __future__ import annotations

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
        self._specs: dict[tuple[str, int], pb.JournalSpec] = {}

    def journal_spec(self, kv: KeyValue) -> pb.JournalSpec:
        """Decoded spec of an item key (cached per key and mod revision)."""
        cache_key = (kv.key, kv.mod_revision)
        spec = self._specs.get(cache_key)
        if spec is None:
            spec = decode_journal_spec(self.layout, kv)
            if len(self._specs) > 100_000:
                self._specs.clear()
            self._specs[cache_key] = spec
        return spec

    def item_replication(self, item_id: str, kv: KeyValue) -> int:
        return desired_replication(self.journal_spec(kv))

    def member_limit(self, zone: str, suffix: str, kv: KeyValue) -> tuple[int, bool]:
        spec = decode_broker_spec(self.layout, kv)
        return spec.journal_limit, spec.exiting

    def is_consistent(self, item: Item, assignment: Assignment, all_: Sequence[Assignment]) -> bool:
        return assignments_advertise(route_of(all_), all_)
