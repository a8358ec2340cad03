"""The allocator's view of the keyspace: members, items, assignments and their tallies.

`AllocatorState.extract` decodes a keyspace snapshot (Gazette's layout: see
`keyspace.layout`) around one local member: who the members are and how many items each may
hold, what the items want, the current assignments with per-member counts, which items
are assigned here, whether this member leads, and how much capacity exiting members shed.
What an item or member value means is left to an `AllocatorDecoder` (journals and brokers,
or shards and consumers), so the allocator itself stays generic.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pygazette.keyspace.keyspace import Keyspace, KeyValue
from pygazette.keyspace.layout import KeyDecodeError, KeyLayout

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Member:
    zone: str
    suffix: str
    kv: KeyValue
    item_limit: int
    exiting: bool


@dataclass(slots=True)
class Item:
    id: str
    kv: KeyValue
    replication: int


@dataclass(slots=True)
class Assignment:
    item: str
    zone: str
    suffix: str
    slot: int
    kv: KeyValue

    @property
    def member(self) -> tuple[str, str]:
        return (self.zone, self.suffix)


@dataclass(slots=True)
class LocalItem:
    """An item assigned to the local member: its key/value, all its assignments, and ours."""

    item: Item
    assignments: list[Assignment]
    index: int  # Of the local assignment within `assignments`.

    @property
    def assignment(self) -> Assignment:
        return self.assignments[self.index]


class AllocatorDecoder(Protocol):
    """What items and members mean to a particular use of the allocator."""

    def item_replication(self, item_id: str, kv: KeyValue) -> int:
        """Desired replication of the item (raises KeyDecodeError if undecodable)."""
        ...

    def member_limit(self, zone: str, suffix: str, kv: KeyValue) -> tuple[int, bool]:
        """(item limit, exiting) of the member (raises KeyDecodeError if undecodable)."""
        ...

    def is_consistent(self, item: Item, assignment: Assignment, all_: Sequence[Assignment]) -> bool:
        """Whether `assignment` has synchronised with the item's other assignments."""
        ...


@dataclass(slots=True)
class AllocatorState:
    layout: KeyLayout
    decoder: AllocatorDecoder
    local_key: str
    revision: int = 0
    members: list[Member] = field(default_factory=list)  # Key order.
    items: list[Item] = field(default_factory=list)  # Key (ID) order.
    assignments: list[Assignment] = field(default_factory=list)  # Key order.
    member_index: dict[tuple[str, str], int] = field(default_factory=dict)
    item_index: dict[str, int] = field(default_factory=dict)
    by_item: dict[str, list[Assignment]] = field(default_factory=dict)
    local_member: int = -1
    local_items: list[LocalItem] = field(default_factory=list)
    zones: list[str] = field(default_factory=list)  # Zones of members with slots.
    item_slots: int = 0
    member_slots: int = 0
    network_hash: str = ""
    member_total: list[int] = field(default_factory=list)
    member_primary: list[int] = field(default_factory=list)
    shed_capacity: list[int] = field(default_factory=list)

    @classmethod
    def extract(
        cls, ks: Keyspace, layout: KeyLayout, decoder: AllocatorDecoder, local_key: str
    ) -> AllocatorState:
        s = cls(layout, decoder, local_key, revision=ks.revision)
        digest = hashlib.sha1()
        exiting: list[int] = []
        for kv in ks.range(layout.members_prefix):
            try:
                zone, suffix = layout.parse_member_key(kv.key)
                limit, is_exiting = decoder.member_limit(zone, suffix, kv)
            except KeyDecodeError as exc:
                log.error("undecodable member", extra={"key": kv.key, "error": str(exc)})
                continue
            s.member_index[(zone, suffix)] = len(s.members)
            s.members.append(Member(zone, suffix, kv, limit, is_exiting))
            if limit > 0 and (not s.zones or s.zones[-1] != zone):
                s.zones.append(zone)
            s.member_slots += limit
            digest.update(f"m{kv.key}\0{limit}\0".encode())
            if kv.key == local_key:
                s.local_member = len(s.members) - 1
            if is_exiting:
                exiting.append(len(s.members) - 1)
        s.zones = sorted(set(s.zones))

        for kv in ks.range(layout.items_prefix):
            try:
                item_id = layout.parse_item_key(kv.key)
                replication = decoder.item_replication(item_id, kv)
            except KeyDecodeError as exc:
                log.error("undecodable item", extra={"key": kv.key, "error": str(exc)})
                continue
            s.item_index[item_id] = len(s.items)
            s.items.append(Item(item_id, kv, replication))
            s.item_slots += replication
            digest.update(f"i{kv.key}\0{replication}\0".encode())

        for kv in ks.range(layout.assign_prefix):
            try:
                key = layout.parse_assignment_key(kv.key)
            except KeyDecodeError as exc:
                log.error("undecodable assignment", extra={"key": kv.key, "error": str(exc)})
                continue
            a = Assignment(key.item, key.zone, key.suffix, key.slot, kv)
            s.assignments.append(a)
            s.by_item.setdefault(a.item, []).append(a)

        s.member_total = [0] * len(s.members)
        s.member_primary = [0] * len(s.members)
        s.shed_capacity = [0] * len(s.members)
        max_replication = max((it.replication for it in s.items), default=0)
        for item in s.items:
            group = s.by_item.get(item.id, [])
            for i, a in enumerate(group):
                if layout.member_key(a.zone, a.suffix) == local_key:
                    s.local_items.append(LocalItem(item, group, i))
                m = s.member_index.get(a.member)
                if m is not None:
                    s.member_total[m] += 1
                    if a.slot == 0:
                        s.member_primary[m] += 1

        # Exiting members shed capacity, oldest first, out of the cluster's excess slots,
        # keeping at least `max_replication` members at full capacity (Gazette's rule).
        excess = max(0, s.member_slots - s.item_slots)
        exiting.sort(key=lambda i: s.members[i].kv.create_revision)
        for n, i in enumerate(exiting):
            if n >= max(0, len(s.members) - max_replication) or excess == 0:
                break
            shed = min(s.members[i].item_limit, excess)
            s.shed_capacity[i] = shed
            s.member_slots -= shed
            excess -= shed
            digest.update(f"s{s.members[i].kv.key}\0{shed}\0".encode())
        s.network_hash = digest.hexdigest()
        return s

    # Queries.
    def is_leader(self) -> bool:
        """The local member is first on (create revision, key) among all members."""
        if not self.members or self.local_member < 0:
            return False
        leader = min(self.members, key=lambda m: (m.kv.create_revision, m.kv.key))
        return leader.kv.key == self.local_key

    def should_exit(self) -> bool:
        """The local member is exiting and holds no assignments any more."""
        if self.local_member < 0:
            return True
        return self.members[self.local_member].exiting and not self.local_items

    def effective_limit(self, member: int) -> int:
        return self.members[member].item_limit - self.shed_capacity[member]

    def load_ratio(self, a: Assignment, counts: list[int]) -> float:
        m = self.member_index.get(a.member)
        if m is None:
            return float("inf")
        limit = self.effective_limit(m)
        return counts[m] / limit if limit > 0 else float("inf")

    def assignments_of(self, item_id: str) -> list[Assignment]:
        return self.by_item.get(item_id, [])

    def find_member(self, zone: str, suffix: str) -> Member | None:
        m = self.member_index.get((zone, suffix))
        return self.members[m] if m is not None else None
