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
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from pygazette.allocator.state import AllocatorState

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


def solve_desired_assignments(state: AllocatorState) -> list[DesiredAssignment]:
    """Assignments that best meet every item's replication, in (item, zone, suffix) order."""
    members = [(i, m) for i, m in enumerate(state.members) if state.effective_limit(i) > 0]
    if not members or not state.items:
        return []
    # Fair share: each member's part of all slots, in proportion to its limit.
    fair = {
        i: math.ceil(state.item_slots * state.effective_limit(i) / max(1, state.member_slots))
        for i, _ in members
    }
    remaining = {i: state.effective_limit(i) for i, _ in members}
    load = {i: 0 for i, _ in members}
    zones = sorted({m.zone for _, m in members})
    by_zone = {z: [(i, m) for i, m in members if m.zone == z] for z in zones}

    out: list[DesiredAssignment] = []
    for start in range(0, len(state.items), ITEMS_PER_NETWORK):
        chunk = [it for it in state.items[start : start + ITEMS_PER_NETWORK] if it.replication > 0]
        net = _Network()
        src, sink = net.node(), net.node()
        member_node = {}
        for i, _m in members:
            node = member_node[i] = net.node()
            cap = remaining[i]
            at_fair = max(0, min(cap, fair[i] - load[i]))
            if at_fair:
                net.arc(node, sink, at_fair, 0)
            if cap - at_fair > 0:
                net.arc(node, sink, cap - at_fair, OVERLOAD_COST)
        placement_arcs: list[tuple[int, str, int]] = []  # (arc, item, member index)
        for item in chunk:
            r = item.replication
            item_node = net.node()
            net.arc(src, item_node, r, 0)
            current = {a.member for a in state.assignments_of(item.id)}
            for z in zones:
                zone_node = net.node()
                net.arc(item_node, zone_node, 1, 0)
                if r > 1:
                    net.arc(item_node, zone_node, r - 1, ZONE_COST)
                for i, m in by_zone[z]:
                    cost = 0 if (m.zone, m.suffix) in current else MOVE_COST
                    e = net.arc(zone_node, member_node[i], 1, cost)
                    placement_arcs.append((e, item.id, i))
        net.min_cost_max_flow(src, sink)
        for e, item_id, i in placement_arcs:
            if net.cap[e] == 0:  # The unit arc carries flow.
                m = state.members[i]
                out.append(DesiredAssignment(item_id, m.zone, m.suffix))
                remaining[i] -= 1
                load[i] += 1
    out.sort()
    return out
