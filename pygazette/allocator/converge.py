"""One convergence step: keyspace operations that move current assignments toward desired.

Per item (Gazette's rules): add desired assignments members have room for; remove undesired
ones, but only while the item keeps at least its replication in *consistent* assignments
(replicas that have synchronised); if the item has no primary, promote the best replica
(consistent first, then one that has advertised any route at all, then the least loaded);
with nothing added or removed, compact slots (move one assignment to a lower free slot).
Every operation is guarded by the mod revisions it was decided on, and assignments are put
under their member's lease. Dead assignments (of deleted items) are removed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pygazette.allocator.solver import DesiredAssignment
from pygazette.allocator.state import AllocatorState, Assignment, Item
from pygazette.keyspace.keyspace import MAX_TXN_OPS, Compare, Delete, Keyspace, KeyValue, Put
from pygazette.keyspace.layout import AssignmentKey

log = logging.getLogger(__name__)


class TxnFailed(Exception):
    """A convergence transaction's guards did not hold (the keyspace moved on)."""


def unchanged(kv: KeyValue) -> Compare:
    return Compare(kv.key, kv.mod_revision)


@dataclass(slots=True)
class BatchedTxn:
    """Groups operations into few transactions; each group lands whole in one of them.

    Every transaction also carries `fixed` compares (the leader's own member key, so a
    deposed leader's writes fail).
    """

    ks: Keyspace
    fixed: list[Compare]
    revision: int = 0
    _compares: list[Compare] = field(default_factory=list)
    _ops: list[Put | Delete] = field(default_factory=list)

    async def add(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> None:
        if not ops:
            return
        if len(self._compares) + len(compares) + len(self.fixed) > MAX_TXN_OPS or (
            len(self._ops) + len(ops) > MAX_TXN_OPS
        ):
            await self.flush()
        self._compares.extend(compares)
        self._ops.extend(ops)

    async def flush(self) -> None:
        if not self._ops:
            return
        result = await self.ks.txn(self.fixed + self._compares, self._ops)
        self._compares, self._ops = [], []
        if not result.succeeded:
            raise TxnFailed("convergence transaction checks did not hold")
        self.revision = result.revision


@dataclass(slots=True)
class ItemChanges:
    add: list[AssignmentKey]
    remove: list[Assignment]
    keep: list[Assignment]  # Reordered so keep[0] is the primary to be.


@dataclass(slots=True)
class ConvergeStats:
    """What one convergence step queued, and which items it found settled."""

    adds: int = 0
    removes: int = 0
    packs: int = 0  # Assignments moved to another slot (promotions and compactions).
    settled: set[str] = field(default_factory=set)  # Nothing to do (until they change).


def plan_item(
    state: AllocatorState,
    item: Item,
    current: list[Assignment],
    desired: Sequence[DesiredAssignment],
    room: int = MAX_TXN_OPS,
) -> ItemChanges:
    """Changes of one item's assignments, within replication and member limits, and at
    most `room` additions and removals: an item's operations go in one transaction, and
    etcd takes at most --max-txn-ops compares and operations in one. Additions come first
    (a new item's primary first); the rest wait for later rounds."""
    want = {(d.zone, d.suffix) for d in desired}
    have = {a.member for a in current}
    next_slot = max((a.slot + 1 for a in current), default=0)
    new = [d for d in desired if (d.zone, d.suffix) not in have]
    if not current:
        # A new item: its primary (slot 0) goes to the member with the fewest primaries.
        def primary_load(d: DesiredAssignment) -> tuple[float, str, str]:
            m = state.member_index.get((d.zone, d.suffix))
            if m is None or state.effective_limit(m) <= 0:
                return (float("inf"), d.zone, d.suffix)
            return (state.member_primary[m] / state.effective_limit(m), d.zone, d.suffix)

        new.sort(key=primary_load)
    add: list[AssignmentKey] = []
    for d in new:
        add.append(AssignmentKey(item.id, d.zone, d.suffix, next_slot))
        next_slot += 1
    # Additions: only to members with room.
    fitting = []
    for a in add:
        m = state.member_index.get((a.zone, a.suffix))
        if m is not None and state.member_total[m] < state.effective_limit(m):
            fitting.append(a)
    del fitting[room:]
    remove = [a for a in current if a.member not in want]
    keep = [a for a in current if a.member in want]

    # Removals: most loaded members first; stop where the item would fall below its
    # replication in consistent assignments.
    remove.sort(key=lambda a: state.load_ratio(a, state.member_total), reverse=True)
    consistent = sum(1 for a in current if state.decoder.is_consistent(item, a, current))
    limit = 0
    while consistent >= item.replication and limit < min(len(remove), room - len(fitting)):
        c = state.decoder.is_consistent(item, remove[limit], current)
        if c and consistent == item.replication:
            break
        if c:
            consistent -= 1
        limit += 1
    keep.extend(remove[limit:])
    remove = remove[:limit]

    # Primary: keep the current one, else promote the best candidate.
    keep.sort(key=lambda a: a.slot)
    if keep and keep[0].slot != 0:

        def rank(a: Assignment) -> tuple[int, int, float]:
            return (
                0 if state.decoder.is_consistent(item, a, current) else 1,
                0 if a.kv.value else 1,  # Synchronised at least once since assigned.
                state.load_ratio(a, state.member_primary),
            )

        best = min(range(len(keep)), key=lambda i: rank(keep[i]))
        keep.insert(0, keep.pop(best))

    return ItemChanges(fitting, remove, keep)


async def converge(
    state: AllocatorState,
    desired: Sequence[DesiredAssignment] | Mapping[str, Sequence[DesiredAssignment]],
    txn: BatchedTxn,
    items: Iterable[str] | None = None,
) -> ConvergeStats:
    """Queue operations that bring `state` one step toward `desired` into `txn`: of the
    given `items` (IDs of items or of dead assignments' items; None: all of them)."""
    layout = state.layout
    by_item: Mapping[str, Sequence[DesiredAssignment]]
    if isinstance(desired, Mapping):
        by_item = desired
    else:
        grouped: dict[str, list[DesiredAssignment]] = {}
        for d in desired:
            grouped.setdefault(d.item, []).append(d)
        by_item = grouped
    stats = ConvergeStats()
    ids = sorted(set(state.item_map) | set(state.by_item)) if items is None else sorted(items)
    for item_id in ids:
        item = state.item_map.get(item_id)
        if item is None:
            group = state.by_item.get(item_id)
            if not group:
                stats.settled.add(item_id)
                continue
            if txn.ks.get(layout.item_key(item_id)) is not None:
                # The item's key exists but doesn't decode (or was re-created since this
                # state): its assignments aren't dead, and the guard below would fail, and
                # with it every round's transaction. Leave them until the key changes.
                stats.settled.add(item_id)
                continue
            # Dead assignments: the item is gone. Guard against its re-creation (each part
            # of a group wider than a transaction guards itself).
            width = max(1, MAX_TXN_OPS - len(txn.fixed) - 1)
            for start in range(0, len(group), width):
                part = group[start : start + width]
                guards = [Compare(layout.item_key(item_id), 0)] + [unchanged(g.kv) for g in part]
                await txn.add(guards, [Delete(g.kv.key) for g in part])
            stats.removes += len(group)
            continue
        current = state.assignments_of(item.id)
        # 2: the compares of the item's key and of a move.
        room = max(1, MAX_TXN_OPS - len(txn.fixed) - 2)
        plan = plan_item(state, item, current, by_item.get(item.id, ()), room)
        compares: list[Compare] = []
        ops: list[Put | Delete] = []
        for a in plan.add:
            m = state.member_index[(a.zone, a.suffix)]
            member = state.members[m]
            compares.append(unchanged(member.kv))  # Its limit may have shrunk.
            ops.append(Put(layout.assignment_key(a), b"", lease=member.kv.lease))
            state.member_total[m] += 1
            if a.slot == 0:
                state.member_primary[m] += 1
        if plan.remove:
            compares.append(unchanged(item.kv))  # Its replication may have grown.
        for r in plan.remove:
            compares.append(unchanged(r.kv))
            ops.append(Delete(r.kv.key))
            m_opt = state.member_index.get(r.member)
            if m_opt is not None:
                state.member_total[m_opt] -= 1
                if r.slot == 0:
                    state.member_primary[m_opt] -= 1
        stats.adds += len(plan.add)
        stats.removes += len(plan.remove)
        if plan.keep and plan.keep[0].slot != 0:
            _move(state, plan.keep[0], 0, compares, ops)
            stats.packs += 1
            m_opt = state.member_index.get(plan.keep[0].member)
            if m_opt is not None:
                state.member_primary[m_opt] += 1
        elif not plan.add and not plan.remove:
            # Pack: move one assignment down to its index, keeping slots contiguous.
            for i, kept in enumerate(plan.keep):
                if i and kept.slot != i:
                    _move(state, kept, i, compares, ops)
                    stats.packs += 1
                    break
        if ops:
            await txn.add(compares, ops)
        elif _settled(plan, by_item.get(item.id, ())):
            stats.settled.add(item_id)
    return stats


def _settled(plan: ItemChanges, desired: Sequence[DesiredAssignment]) -> bool:
    """Whether the item's assignments are exactly its desired ones, so no change of other
    items or member tallies can give it anything to do."""
    return len(plan.keep) == len(desired) and {a.member for a in plan.keep} == {
        (d.zone, d.suffix) for d in desired
    }


def _move(
    state: AllocatorState,
    a: Assignment,
    slot: int,
    compares: list[Compare],
    ops: list[Put | Delete],
) -> None:
    """Atomically move an assignment (its value and lease) to another slot."""
    key = state.layout.assignment_key(AssignmentKey(a.item, a.zone, a.suffix, slot))
    compares.append(unchanged(a.kv))
    ops.append(Delete(a.kv.key))
    ops.append(Put(key, a.kv.value, lease=a.kv.lease))
