"""Desired assignments: a min-cost maximum flow from items, through zones, to members.

    source --R--> item --1 (free), R-1 (costly)--> item-in-zone --1--> member --limit--> sink

The maximum flow gives every item as many replicas as capacity allows (its replication at
most, never two on one member). Among maximum flows, costs pick the best:

- a replica beyond the first in a zone costs ZONE_COST, so replicas spread across zones
  whenever they can (and share a zone only when that is the only way to replicate fully);
- an assignment a member doesn't already hold costs MOVE_COST, so current assignments stay;
- a member's assignments beyond its fair share (its part of all slots, in proportion to
  its limit) cost OVERLOAD_COST each, so load balances: moving an assignment off an
  overloaded member pays for itself, moving one off a member at its share does not.

OVERLOAD_COST < ZONE_COST: a member takes more than its share before an item gives up zone
spreading. The flow is solved with successive shortest paths (Dijkstra on reduced costs),
augmenting a blocking flow over all cheapest paths per round; costs are small integers, so
there are few rounds.

The leader keeps its desired assignments in a `DesiredPlan` and re-solves only the items a
change affects, each in a sparse network (its current members and a few more per zone).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from pygazette.allocator.state import AllocatorState, Item

MOVE_COST = 1
OVERLOAD_COST = 4
ZONE_COST = 16

# Items per flow network: bigger networks cost superlinearly more to solve, and a very
# large problem gains little from being solved globally (Gazette splits it the same way).
ITEMS_PER_NETWORK = 2000

_INF = 1 << 62  # Farther than any path (costs are small integers).


@dataclass(frozen=True, slots=True, order=True)
class DesiredAssignment:
    item: str
    zone: str
    suffix: str


class _Network:
    def __init__(self) -> None:
        self.to: list[int] = []
        self.cap: list[int] = []
        self.cost: list[int] = []
        self.adj: list[list[int]] = []

    def node(self) -> int:
        self.adj.append([])
        return len(self.adj) - 1

    def arc(self, u: int, v: int, cap: int, cost: int) -> int:
        e = len(self.to)
        self.to += [v, u]
        self.cap += [cap, 0]
        self.cost += [cost, -cost]
        self.adj[u].append(e)
        self.adj[v].append(e + 1)
        return e

    def min_cost_max_flow(self, s: int, t: int) -> None:
        n = len(self.adj)
        pot = [0] * n  # All initial costs are >= 0.
        to, cap, cost, adj = self.to, self.cap, self.cost, self.adj
        while True:
            dist: list[int] = [_INF] * n
            dist[s] = 0
            heap = [(0, s)]
            while heap:
                d, u = heapq.heappop(heap)
                if d > dist[u]:
                    continue
                pu = pot[u]
                for e in adj[u]:
                    if cap[e] > 0:
                        v = to[e]
                        nd = d + cost[e] + pu - pot[v]
                        if nd < dist[v]:
                            dist[v] = nd
                            heapq.heappush(heap, (nd, v))
            dt = dist[t]
            if dt == _INF:
                return
            for v in range(n):
                dv = dist[v]
                pot[v] += dv if dv < dt else dt
            # Blocking flows over admissible arcs (zero reduced cost), level by level.
            while True:
                level = [-1] * n
                level[s] = 0
                queue = deque([s])
                while queue:
                    u = queue.popleft()
                    for e in adj[u]:
                        v = to[e]
                        if cap[e] > 0 and level[v] < 0 and cost[e] + pot[u] - pot[v] == 0:
                            level[v] = level[u] + 1
                            queue.append(v)
                if level[t] < 0:
                    break
                it = [0] * n
                while self._augment(s, t, level, it, pot):
                    pass

    def _augment(self, s: int, t: int, level: list[int], it: list[int], pot: list[int]) -> bool:
        """Push one unit along an admissible level path from s to t (iterative DFS)."""
        to, cap, cost, adj = self.to, self.cap, self.cost, self.adj
        path: list[int] = []
        u = s
        while u != t:
            arcs = adj[u]
            advanced = False
            while it[u] < len(arcs):
                e = arcs[it[u]]
                v = to[e]
                if cap[e] > 0 and level[v] == level[u] + 1 and cost[e] + pot[u] - pot[v] == 0:
                    path.append(e)
                    u = v
                    advanced = True
                    break
                it[u] += 1
            if not advanced:
                if not path:
                    return False
                level[u] = -1  # Dead end: never come back.
                e = path.pop()
                u = to[e ^ 1]
                it[u] += 1
        for e in path:
            cap[e] -= 1
            cap[e ^ 1] += 1
        return True


MemberKey = tuple[str, str]

# Besides its current members, an item's network reaches this many more members of each
# zone (those with the most room left), not all of them: a sparse network, as Gazette's.
SPARSE_EXTRA = 3


def solve_desired_assignments(state: AllocatorState) -> list[DesiredAssignment]:
    """Assignments that best meet every item's replication, in (item, zone, suffix) order."""
    plan = DesiredPlan()
    plan.update(state, None)
    return plan.assignments()


class DesiredPlan:
    """The leader's desired assignments, kept across rounds and re-solved where they must
    change: items that are new, gone or changed replication; items desired on a member that
    left, lost capacity or went beyond its fair share when members changed; and items short
    of replicas when capacity may have grown. Other items keep their desired assignments
    and are not in any flow network. Each re-solve is a min-cost flow over sparse networks
    of at most ITEMS_PER_NETWORK items, where the capacity of members is what the kept
    items leave them."""

    def __init__(self) -> None:
        self.by_item: dict[str, tuple[DesiredAssignment, ...]] = {}
        self.holders: dict[MemberKey, set[str]] = {}  # Member → items desired there.
        self.replication: dict[str, int] = {}  # Item → replication it was solved for.
        self.short: set[str] = set()  # Items with fewer desired than their replication.
        # Items with two desired or more, all in one zone (where zones have room elsewhere
        # when the plan changes, they're re-solved to spread).
        self.lone: set[str] = set()
        self.capacity: dict[MemberKey, int] | None = None  # Effective limits at last solve.
        self.zones: list[str] = []
        self.solved_items = 0  # Items put in networks (all updates).

    def assignments(self) -> list[DesiredAssignment]:
        return sorted(d for group in self.by_item.values() for d in group)

    def desired_of(self, item_id: str) -> tuple[DesiredAssignment, ...]:
        return self.by_item.get(item_id, ())

    def update(self, state: AllocatorState, touched: set[str] | None) -> set[str]:
        """Re-solve what `state` changed (`touched`: items whose key or assignments changed
        since the last update; None: anything may have). Returns items whose desired
        assignments changed."""
        capacity = {
            (m.zone, m.suffix): state.effective_limit(i)
            for i, m in enumerate(state.members)
            if state.effective_limit(i) > 0
        }
        zones = sorted({z for z, _ in capacity})
        changed: set[str] = set()
        # Items to re-solve → members their replicas must be re-placed from (None: all).
        release: dict[str, set[MemberKey] | None] = {}
        full = touched is None or self.capacity is None or zones != self.zones
        if full or touched is None:
            # Every item solved before (short ones may hold no desired assignment).
            for item_id in list(self.replication):
                if item_id not in state.item_map:
                    self._drop(item_id, changed)
            release = dict.fromkeys(state.item_map)
        else:
            freed = False  # Room an item left (deleted, or its replication lowered).
            for item_id in touched:
                item = state.item_map.get(item_id)
                if item is None:
                    if item_id in self.replication:
                        freed = freed or bool(self.by_item.get(item_id))
                        self._drop(item_id, changed)
                elif (was := self.replication.get(item_id)) != item.replication:
                    release[item_id] = None
                    freed = freed or (was is not None and item.replication < was)
            if freed:
                # Items short of replicas may take that room, as a full solve gives it.
                for item_id in self.short:
                    release.setdefault(item_id, set())
            if capacity != self.capacity:
                for item_id, off in self._affected_by_members(state, capacity).items():
                    if item_id not in release:
                        release[item_id] = off
                    elif (prior := release[item_id]) is not None:
                        release[item_id] = None if off is None else prior | off
        self.capacity, self.zones = capacity, zones
        if release:
            changed |= self._resolve(state, release, capacity)
        if not full and self.lone and (spread := self._spreadable(capacity)):
            # Items all in one zone may spread to room another zone has now (members came
            # or grew, or items left it), as a full solve spreads them: any of their
            # replicas may move.
            changed |= self._resolve(state, dict.fromkeys(spread), capacity)
            # Spreading moves replicas between members: the room one left may take a
            # replica of an item short of them (placed before that room was there).
            if fill := self._short_with_room(capacity):
                changed |= self._resolve(state, {item_id: set() for item_id in fill}, capacity)
                for item_id in fill:
                    release.setdefault(item_id, set())
        if release and not full and self._could_place_more(release, capacity):
            # Replicas kept where they were block a short item that a full solve places
            # (a member with room holds it already; a full one it could use holds an
            # item that could move to that room): re-solve everything, as Gazette does.
            changed |= self._resolve(state, dict.fromkeys(state.item_map), capacity)
        return changed

    def _short_with_room(self, capacity: dict[MemberKey, int]) -> list[str]:
        """Items short of replicas that a member with room, not holding them yet, could
        take a replica of."""
        room = {m for m, c in capacity.items() if c > len(self.holders.get(m, ()))}
        if not room:
            return []
        return sorted(
            item_id
            for item_id in self.short
            if room - {(d.zone, d.suffix) for d in self.by_item.get(item_id, ())}
        )

    def _could_place_more(
        self, released: dict[str, set[MemberKey] | None], capacity: dict[MemberKey, int]
    ) -> bool:
        """Whether a released item is left short while members have room, and a member
        without room that doesn't hold it might make room by moving an item away."""
        short = [i for i in released if i in self.short]
        if not short:
            return False
        room = {m: c - len(self.holders.get(m, ())) for m, c in capacity.items()}
        if not any(r > 0 for r in room.values()):
            return False
        for item_id in short:
            held = {(d.zone, d.suffix) for d in self.by_item.get(item_id, ())}
            if any(r <= 0 and m not in held for m, r in room.items()):
                return True
        return False

    def _resolve(
        self,
        state: AllocatorState,
        release: dict[str, set[MemberKey] | None],
        capacity: dict[MemberKey, int],
    ) -> set[str]:
        """Re-solve the released items (each moving off the members given, or any: None);
        returns those whose desired assignments changed."""
        self.solved_items += len(release)
        old = {item_id: self.by_item.get(item_id, ()) for item_id in release}
        # Replicas not released stay where they are: only the others are solved for.
        fixed: dict[str, list[MemberKey]] = {}
        for item_id, off in release.items():
            self._forget(item_id)
            if off is None:
                continue
            keep = [
                (d.zone, d.suffix)
                for d in old[item_id]
                if (d.zone, d.suffix) not in off and capacity.get((d.zone, d.suffix), 0) > 0
            ]
            if keep:
                fixed[item_id] = keep
                for m in keep:
                    self.holders.setdefault(m, set()).add(item_id)
        self._solve(state, sorted(release), capacity, fixed)
        return {i for i in release if self.by_item.get(i, ()) != old[i]}

    def _spreadable(self, capacity: dict[MemberKey, int]) -> list[str]:
        """Lone items (all desired in one zone) that another zone has room for."""
        room: dict[str, int] = {}
        for m, c in capacity.items():
            room[m[0]] = room.get(m[0], 0) + max(0, c - len(self.holders.get(m, ())))
        with_room = {z for z, r in room.items() if r > 0}
        out = []
        for item_id in self.lone:
            desired = self.by_item.get(item_id, ())
            if desired and with_room - {desired[0].zone}:
                out.append(item_id)
        return out

    def _drop(self, item_id: str, changed: set[str]) -> None:
        if self.by_item.get(item_id):
            changed.add(item_id)
        self._forget(item_id)
        self.replication.pop(item_id, None)

    def _forget(self, item_id: str) -> None:
        for d in self.by_item.pop(item_id, ()):
            held = self.holders.get((d.zone, d.suffix))
            if held is not None:
                held.discard(item_id)
        self.short.discard(item_id)
        self.lone.discard(item_id)

    def _affected_by_members(
        self, state: AllocatorState, capacity: dict[MemberKey, int]
    ) -> dict[str, set[MemberKey] | None]:
        """Items to re-solve after members came, went or changed limits, with the members
        each must move off (None: any replica may move): those on members now without
        room for them, some of those on members beyond their new fair share (so new room
        is used: any of their replicas may move, keeping zones spread), and those short of
        replicas (moving off none)."""
        out: dict[str, set[MemberKey] | None] = {item_id: set() for item_id in self.short}
        total = sum(capacity.values())
        for member, held in self.holders.items():
            room = capacity.get(member, 0)
            if room <= 0:
                moving = list(held)
            elif len(held) > room:
                moving = sorted(held)[: len(held) - room]
            else:
                continue
            for item_id in moving:
                off = out.setdefault(item_id, set())
                if off is not None:
                    off.add(member)
        for member, held in self.holders.items():
            room = capacity.get(member, 0)
            fair = math.ceil(state.item_slots * room / max(1, total))
            excess = len(held) - fair
            if room > 0 and excess > 0:
                # Distinct items per member: each moves (at most) one replica off it.
                for item_id in sorted(i for i in held if i not in out)[:excess]:
                    out[item_id] = None
        return out

    def _solve(
        self,
        state: AllocatorState,
        items: list[str],
        capacity: dict[MemberKey, int],
        fixed: dict[str, list[MemberKey]],
    ) -> None:
        total = sum(capacity.values())
        members = sorted(capacity)
        # Room left by the replicas kept as they were; fair share of all slots.
        remaining = {m: capacity[m] - len(self.holders.get(m, ())) for m in members}
        fair = {m: math.ceil(state.item_slots * capacity[m] / max(1, total)) for m in members}
        load = {m: len(self.holders.get(m, ())) for m in members}
        by_zone: dict[str, list[MemberKey]] = {}
        for m in members:
            by_zone.setdefault(m[0], []).append(m)
        for start in range(0, len(items), ITEMS_PER_NETWORK):
            chunk = []
            for item_id in items[start : start + ITEMS_PER_NETWORK]:
                item = state.item_map[item_id]
                self.replication[item_id] = item.replication
                if item.replication > len(fixed.get(item_id, ())):
                    chunk.append(item)
            result = _solve_network(
                state, chunk, fixed, by_zone, remaining, fair, load, sparse=True
            )
            retry = _sparse_misses(chunk, result, fixed, by_zone, remaining)
            if retry:
                # The sparse network couldn't place them all, or spread them across zones
                # (the members of a zone its items could reach were full while others had
                # room): retry those, and those that could give way, with every member.
                for it in retry:
                    for m in result.pop(it.id, ()):
                        remaining[m] += 1
                        load[m] -= 1
                result.update(_solve_network(state, retry, fixed, by_zone, remaining, fair, load))
            for item_id in items[start : start + ITEMS_PER_NETWORK]:
                item = state.item_map[item_id]
                kept = fixed.get(item_id, [])[: item.replication]
                placed = sorted(kept + result.get(item_id, []))
                if placed:
                    self.by_item[item_id] = tuple(
                        DesiredAssignment(item_id, z, s) for z, s in placed
                    )
                for m in placed:
                    self.holders.setdefault(m, set()).add(item_id)
                for m in fixed.get(item_id, [])[item.replication :]:
                    self.holders[m].discard(item_id)
                if len(placed) < item.replication:
                    self.short.add(item_id)
                if len(placed) > 1 and len({z for z, _ in placed}) == 1 and len(by_zone) > 1:
                    self.lone.add(item_id)


def _sparse_misses(
    chunk: list[Item],
    result: dict[str, list[MemberKey]],
    fixed: dict[str, list[MemberKey]],
    by_zone: dict[str, list[MemberKey]],
    remaining: dict[MemberKey, int],
) -> list[Item]:
    """Items of a sparse network's `result` that a network of every member may place
    better: those short of replicas while a member has room; and those with replicas in at
    most one zone that want more (short, or two replicas or more in it) while another zone
    has room, or has items of this network placing two replicas or more in it (which may
    give way), together with those items."""
    zone_room = {z: sum(max(0, remaining[m]) for m in ms) for z, ms in by_zone.items()}
    room = any(zone_room.values())
    short: list[Item] = []
    lone: list[tuple[Item, set[str]]] = []
    doubled: dict[str, list[Item]] = {}  # Zone → items placing 2+ replicas in it.
    for it in chunk:
        placed = result.get(it.id, ())
        held = [*fixed.get(it.id, ()), *placed]
        if len(held) < it.replication and room:
            short.append(it)
        zones = {m[0] for m in held}
        if len(zones) <= 1 and (len(held) > 1 or len(held) < it.replication):
            lone.append((it, zones))
        seen: set[str] = set()
        for z, _ in placed:
            if z in seen:
                doubled.setdefault(z, []).append(it)
                break
            seen.add(z)
    retry = {it.id: it for it in short}
    for it, zones in lone:
        others = [z for z in zone_room if z not in zones and (zone_room[z] or z in doubled)]
        if others:
            retry[it.id] = it
            for z in others:
                retry.update((d.id, d) for d in doubled.get(z, ()))
    return [it for it in chunk if it.id in retry]


def _solve_network(
    state: AllocatorState,
    chunk: list[Item],
    fixed: dict[str, list[MemberKey]],
    by_zone: dict[str, list[MemberKey]],
    remaining: dict[MemberKey, int],
    fair: dict[MemberKey, int],
    load: dict[MemberKey, int],
    *,
    sparse: bool = False,
) -> dict[str, list[MemberKey]]:
    """Place the replicas `chunk`'s items need beyond their `fixed` ones on members' room
    (updating `remaining` and `load`)."""
    if not chunk:
        return {}
    net = _Network()
    src, sink = net.node(), net.node()
    member_node: dict[MemberKey, int] = {}
    # Each network fills members toward their share of what is placed once it is solved
    # (their fair share of all slots after the last), so every network balances by itself.
    placed = sum(load.values()) + sum(it.replication - len(fixed.get(it.id, ())) for it in chunk)
    fair_slots = sum(fair.values())
    for zone_members in by_zone.values():
        for m in zone_members:
            cap = remaining[m]
            if cap <= 0:
                continue
            node = member_node[m] = net.node()
            target = min(fair[m], math.ceil(placed * fair[m] / max(1, fair_slots)))
            at_fair = max(0, min(cap, target - load[m]))
            if at_fair:
                net.arc(node, sink, at_fair, 0)
            if cap - at_fair > 0:
                net.arc(node, sink, cap - at_fair, OVERLOAD_COST)
    # Sparse candidates: per zone, members by most room below their fair share, each item
    # taking a different window of them so that a chunk spreads over the zone.
    ranked = {
        z: sorted(
            (m for m in ms if m in member_node),
            key=lambda m: (-(fair[m] - load[m]), -remaining[m], m),
        )
        for z, ms in by_zone.items()
    }
    placement_arcs: list[tuple[int, str, MemberKey]] = []
    for n, item in enumerate(chunk):
        kept = fixed.get(item.id, ())
        need = item.replication - len(kept)
        item_node = net.node()
        net.arc(src, item_node, need, 0)
        current = {a.member for a in state.assignments_of(item.id)}
        for z, zone_members in ranked.items():
            if not zone_members:
                continue
            k = SPARSE_EXTRA + item.replication
            if sparse and len(zone_members) > k:
                offset = (n * k) % len(zone_members)
                window = (zone_members + zone_members)[offset : offset + k]
                candidates = [
                    m for m in current if m[0] == z and m in member_node and m not in window
                ]
                candidates += window
            else:
                candidates = zone_members
            candidates = [m for m in candidates if m not in kept]
            if not candidates:
                continue
            zone_node = net.node()
            free = 0 if any(m[0] == z for m in kept) else 1
            if free:
                net.arc(item_node, zone_node, 1, 0)
            if need - free > 0:
                net.arc(item_node, zone_node, need - free, ZONE_COST)
            for m in candidates:
                cost = 0 if m in current else MOVE_COST
                e = net.arc(zone_node, member_node[m], 1, cost)
                placement_arcs.append((e, item.id, m))
    net.min_cost_max_flow(src, sink)
    out: dict[str, list[MemberKey]] = {}
    for e, item_id, m in placement_arcs:
        if net.cap[e] == 0:  # The unit arc carries flow.
            out.setdefault(item_id, []).append(m)
            remaining[m] -= 1
            load[m] += 1
    return out
