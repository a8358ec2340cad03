"""The allocator's view of the keyspace: members, items, assignments and their tallies.

`AllocatorState.extract` decodes a keyspace snapshot (Gazette's layout: see
`keyspace.layout`) around one local member: who the members are and how many items each may
hold, what the items want, the current assignments with per-member counts, which items
are assigned here, whether this member leads, and how much capacity exiting members shed.
What an item or member value means is left to an `AllocatorDecoder` (journals and brokers,
or shards and consumers), so the allocator itself stays generic.

States are immutable, and each keyspace change builds the next from the last (`apply`). Maps
as big as the keyspace (items, assignments by item, local items) are persistent hash tries
(`immutables.Map`): a change copies the few nodes on its keys' paths and shares the rest,
where copying a dict cost O(items) per change — at 20,000 journals, every broker copied two
20,000-entry dicts for each journal's route write after an apply, and each state some task
still held kept its own copies (6 brokers peaked at 7.7 GB).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import immutables

from pygazette.keyspace.keyspace import KeyChanges, Keyspace, KeyValue
from pygazette.keyspace.layout import AssignmentKey, KeyDecodeError, KeyLayout

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


def _mix(*parts: object) -> int:
    """One key's part of the network hash (summed over keys, so order doesn't matter)."""
    return hash(parts) & _MASK


_MASK = (1 << 64) - 1
_Tally = tuple[int, int]  # (assignments, primaries) of a member, over live items.


@dataclass(slots=True)
class AllocatorState:
    """One consistent view; never changed once published (`ObservedState` builds the next
    view from it, sharing what didn't change)."""

    layout: KeyLayout
    decoder: AllocatorDecoder
    local_key: str
    revision: int = 0
    members: list[Member] = field(default_factory=list)  # Key order.
    member_index: dict[tuple[str, str], int] = field(default_factory=dict)
    item_map: immutables.Map[str, Item] = field(default_factory=immutables.Map)
    # Assignments of each item (in key order), including those of items that are gone.
    by_item: immutables.Map[str, list[Assignment]] = field(default_factory=immutables.Map)
    local_member: int = -1
    local: immutables.Map[str, tuple[LocalItem, ...]] = field(default_factory=immutables.Map)
    zones: list[str] = field(default_factory=list)  # Zones of members with slots.
    item_slots: int = 0
    member_slots: int = 0
    network_hash: int = 0
    member_total: list[int] = field(default_factory=list)
    member_primary: list[int] = field(default_factory=list)
    shed_capacity: list[int] = field(default_factory=list)
    # Incremental bookkeeping.
    tally: dict[tuple[str, str], _Tally] = field(default_factory=dict)  # By member.
    replication_counts: dict[int, int] = field(default_factory=dict)  # Items per R.
    member_slots_raw: int = 0
    base_hash: int = 0  # Of members and items; shed capacity is added on top.
    # What changed from the state this one was built from (None: anything may have).
    touched_items: frozenset[str] | None = None
    members_changed: bool = True
    # Assignment keys parsed by `apply`, shared by the states built one from another (a
    # key parses the same every time: a put of a key that exists skips parsing it).
    parsed: dict[str, AssignmentKey] = field(default_factory=dict)
    _items: list[Item] | None = None
    _item_index: dict[str, int] | None = None
    _local_items: list[LocalItem] | None = None
    _assignments: list[Assignment] | None = None

    @classmethod
    def extract(
        cls, ks: Keyspace, layout: KeyLayout, decoder: AllocatorDecoder, local_key: str
    ) -> AllocatorState:
        """Decode the whole keyspace (on load, and as the oracle of incremental updates)."""
        s = cls(layout, decoder, local_key, revision=ks.revision)
        item_map: dict[str, Item] = {}
        by_item: dict[str, list[Assignment]] = {}
        local: dict[str, tuple[LocalItem, ...]] = {}
        for kv in ks.range(layout.members_prefix):
            m = _decode_member(layout, decoder, kv)
            if m is not None:
                s.members.append(m)
                s.base_hash += _member_hash(m)
        for kv in ks.range(layout.items_prefix):
            item = _decode_item(layout, decoder, kv)
            if item is not None:
                item_map[item.id] = item
                s.base_hash += _item_hash(item)
                s.item_slots += item.replication
                s.replication_counts[item.replication] = (
                    s.replication_counts.get(item.replication, 0) + 1
                )
        for kv in ks.range(layout.assign_prefix):
            a = _decode_assignment(layout, kv)
            if a is not None:
                by_item.setdefault(a.item, []).append(a)
        tally: dict[tuple[str, str], list[int]] = {}
        for item_id, group in by_item.items():
            group.sort(key=_by_key)
            item = item_map.get(item_id)
            if item is None:
                continue
            if found := _local_of(layout, local_key, item, group):
                local[item_id] = found
            for a in group:
                t = tally.setdefault(a.member, [0, 0])
                t[0] += 1
                t[1] += a.slot == 0
        s.tally = {m: (t[0], t[1]) for m, t in tally.items()}
        s.item_map = immutables.Map(item_map)
        s.by_item = immutables.Map(by_item)
        s.local = immutables.Map(local)
        s.base_hash &= _MASK
        s._index_members()
        s._derive()
        return s

    def _index_members(self) -> None:
        """Member list derivatives (members change seldom: O(members))."""
        self.member_index = {(m.zone, m.suffix): i for i, m in enumerate(self.members)}
        self.local_member = -1
        zones = set()
        self.member_slots_raw = 0
        for i, m in enumerate(self.members):
            if m.kv.key == self.local_key:
                self.local_member = i
            if m.item_limit > 0:
                zones.add(m.zone)
            self.member_slots_raw += m.item_limit
        self.zones = sorted(zones)

    def _derive(self) -> None:
        """Per-member tallies and shed capacity (O(members))."""
        tally = self.tally
        self.member_total = [tally.get((m.zone, m.suffix), (0, 0))[0] for m in self.members]
        self.member_primary = [tally.get((m.zone, m.suffix), (0, 0))[1] for m in self.members]
        self.shed_capacity = [0] * len(self.members)
        self.member_slots = self.member_slots_raw
        # Exiting members shed capacity, oldest first, out of the cluster's excess slots,
        # keeping at least `max_replication` members at full capacity (Gazette's rule).
        max_replication = max(self.replication_counts, default=0)
        excess = max(0, self.member_slots - self.item_slots)
        exiting = [i for i, m in enumerate(self.members) if m.exiting]
        exiting.sort(key=lambda i: self.members[i].kv.create_revision)
        shed_hash = 0
        for n, i in enumerate(exiting):
            if n >= max(0, len(self.members) - max_replication) or excess == 0:
                break
            shed = min(self.members[i].item_limit, excess)
            self.shed_capacity[i] = shed
            self.member_slots -= shed
            excess -= shed
            shed_hash += _mix("s", self.members[i].kv.key, shed)
        self.network_hash = (self.base_hash + shed_hash) & _MASK

    def apply(self, changes: KeyChanges) -> AllocatorState:
        """The state after `changes` (which must follow this state's revision), decoding only
        what changed and sharing the rest with this state, which stays as it was."""
        layout = self.layout
        n = AllocatorState(self.layout, self.decoder, self.local_key, revision=changes.revision)
        n.members = self.members
        n.member_index = self.member_index
        n.item_map = self.item_map
        n.by_item = self.by_item
        n.local_member = self.local_member
        n.local = self.local
        n.zones = self.zones
        n.item_slots = self.item_slots
        n.member_slots_raw = self.member_slots_raw
        n.tally = self.tally
        n.replication_counts = self.replication_counts
        n.base_hash = self.base_hash
        members_changed = False
        copied: set[str] = set()
        touched: set[str] = set()
        member_updates: dict[str, Member | None] = {}

        def own(name: str) -> None:
            if name not in copied:
                copied.add(name)
                setattr(n, name, dict(getattr(n, name)))

        def tally_add(item_id: str, group: list[Assignment], sign: int) -> None:
            own("tally")
            tally = n.tally
            for a in group:
                m = (a.zone, a.suffix)
                t = tally.get(m, (0, 0))
                tally[m] = (t[0] + sign, t[1] + sign * (a.slot == 0))

        ms, ips, aps = layout.members_prefix, layout.items_prefix, layout.assign_prefix
        parsed = n.parsed = self.parsed
        # Edited in place, then frozen into the new state's maps (sharing the rest).
        item_map = self.item_map.mutate()
        by_item = self.by_item.mutate()
        changed: list[tuple[str, KeyValue | None]] = [(kv.key, kv) for kv in changes.puts]
        changed += [(key, None) for key in changes.deletes]
        for key, kv in changed:
            if key.startswith(aps):
                ak = parsed.get(key)
                if ak is None:
                    try:
                        ak = layout.parse_assignment_key(key)
                    except KeyDecodeError as exc:
                        if kv is not None:
                            log.error(
                                "undecodable assignment", extra={"key": key, "error": str(exc)}
                            )
                        continue
                    if kv is not None:
                        parsed[key] = ak
                elif kv is None:
                    del parsed[key]
                old_group = by_item.get(ak.item, [])
                group = [a for a in old_group if a.kv.key != key]
                if kv is not None:
                    group.append(Assignment(ak.item, ak.zone, ak.suffix, ak.slot, kv))
                    group.sort(key=_by_key)
                if ak.item in item_map:
                    tally_add(ak.item, old_group, -1)
                    tally_add(ak.item, group, 1)
                if group:
                    by_item[ak.item] = group
                elif ak.item in by_item:
                    del by_item[ak.item]
                touched.add(ak.item)
            elif key.startswith(ips):
                try:
                    item_id = layout.parse_item_key(key)
                except KeyDecodeError as exc:
                    if kv is not None:
                        log.error("undecodable item", extra={"key": key, "error": str(exc)})
                    continue
                old = item_map.get(item_id)
                new = _decode_item(layout, self.decoder, kv) if kv is not None else None
                own("replication_counts")
                if old is not None:
                    del item_map[item_id]
                    n.base_hash -= _item_hash(old)
                    n.item_slots -= old.replication
                    left = n.replication_counts[old.replication] - 1
                    if left:
                        n.replication_counts[old.replication] = left
                    else:
                        del n.replication_counts[old.replication]
                if new is not None:
                    item_map[item_id] = new
                    n.base_hash += _item_hash(new)
                    n.item_slots += new.replication
                    n.replication_counts[new.replication] = (
                        n.replication_counts.get(new.replication, 0) + 1
                    )
                if (old is None) != (new is None):
                    group = by_item.get(item_id, [])
                    tally_add(item_id, group, 1 if new is not None else -1)
                touched.add(item_id)
            elif key.startswith(ms):
                member_updates[key] = (
                    _decode_member(layout, self.decoder, kv) if kv is not None else None
                )
        if member_updates:
            members_changed = True
            by_key = {m.kv.key: m for m in n.members}
            for key, maybe in member_updates.items():
                old_m = by_key.pop(key, None)
                if old_m is not None:
                    n.base_hash -= _member_hash(old_m)
                if maybe is not None:
                    by_key[key] = maybe
                    n.base_hash += _member_hash(maybe)
            n.members = [by_key[k] for k in sorted(by_key)]
            n._index_members()
        n.base_hash &= _MASK
        n.item_map = item_map.finish()
        n.by_item = by_item.finish()
        if touched:
            local = self.local.mutate()
            local_key = self.local_key
            for item_id in touched:
                item = n.item_map.get(item_id)
                found = (
                    _local_of(layout, local_key, item, n.by_item.get(item_id, []))
                    if item is not None
                    else ()
                )
                if found:
                    local[item_id] = found
                elif item_id in local:
                    del local[item_id]
            n.local = local.finish()
        n._derive()
        n.touched_items = frozenset(touched)
        n.members_changed = members_changed
        return n

    # Views.
    @property
    def items(self) -> list[Item]:
        """Items in ID order."""
        if self._items is None:
            self._items = sorted(self.item_map.values(), key=lambda it: it.id)
        return self._items

    @property
    def item_index(self) -> dict[str, int]:
        """Item ID → its place in `items`."""
        if self._item_index is None:
            self._item_index = {it.id: i for i, it in enumerate(self.items)}
        return self._item_index

    @property
    def local_items(self) -> list[LocalItem]:
        """Assignments of the local member, in item order."""
        if self._local_items is None:
            self._local_items = [li for k in sorted(self.local) for li in self.local[k]]
        return self._local_items

    @property
    def assignments(self) -> list[Assignment]:
        """All assignments, in key order."""
        if self._assignments is None:
            out = [a for group in self.by_item.values() for a in group]
            out.sort(key=_by_key)
            self._assignments = out
        return self._assignments

    def item(self, item_id: str) -> Item | None:
        return self.item_map.get(item_id)

    def for_convergence(self) -> AllocatorState:
        """A copy whose per-member tallies convergence may update as it plans."""
        work = copy.copy(self)
        work.member_total = list(self.member_total)
        work.member_primary = list(self.member_primary)
        return work

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


def _by_key(a: Assignment) -> str:
    return a.kv.key


def _member_hash(m: Member) -> int:
    return _mix("m", m.kv.key, m.item_limit)


def _item_hash(item: Item) -> int:
    return _mix("i", item.kv.key, item.replication)


def _decode_member(layout: KeyLayout, decoder: AllocatorDecoder, kv: KeyValue) -> Member | None:
    try:
        zone, suffix = layout.parse_member_key(kv.key)
        limit, is_exiting = decoder.member_limit(zone, suffix, kv)
    except KeyDecodeError as exc:
        log.error("undecodable member", extra={"key": kv.key, "error": str(exc)})
        return None
    return Member(zone, suffix, kv, limit, is_exiting)


def _decode_item(layout: KeyLayout, decoder: AllocatorDecoder, kv: KeyValue) -> Item | None:
    try:
        item_id = layout.parse_item_key(kv.key)
        replication = decoder.item_replication(item_id, kv)
    except KeyDecodeError as exc:
        log.error("undecodable item", extra={"key": kv.key, "error": str(exc)})
        return None
    return Item(item_id, kv, replication)


def _decode_assignment(layout: KeyLayout, kv: KeyValue) -> Assignment | None:
    try:
        key = layout.parse_assignment_key(kv.key)
    except KeyDecodeError as exc:
        log.error("undecodable assignment", extra={"key": kv.key, "error": str(exc)})
        return None
    return Assignment(key.item, key.zone, key.suffix, key.slot, kv)


def _local_of(
    layout: KeyLayout, local_key: str, item: Item, group: list[Assignment]
) -> tuple[LocalItem, ...]:
    """The local member's assignments of `item` (among all of its, `group`)."""
    zone, suffix = _local_member(layout, local_key)
    return tuple(
        LocalItem(item, group, i)
        for i, a in enumerate(group)
        if a.suffix == suffix and a.zone == zone
    )


@functools.cache
def _local_member(layout: KeyLayout, local_key: str) -> tuple[str, str]:
    """(zone, suffix) of the local member key (("", "") if it isn't one)."""
    try:
        return layout.parse_member_key(local_key)
    except KeyDecodeError:
        return ("", "")
