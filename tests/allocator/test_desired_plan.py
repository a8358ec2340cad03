"""The leader's DesiredPlan re-solves only what a change affects, and moves little."""

from __future__ import annotations

from collections import Counter

import pytest

from pygazette.allocator import solver
from pygazette.allocator.solver import DesiredPlan, solve_desired_assignments
from pygazette.allocator.state import AllocatorState
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, Put
from tests.allocator.test_allocation import LAYOUT, TextDecoder

LOCAL = LAYOUT.member_key("a", "m0")


async def _cluster(members: dict[str, int], items: int, r: int = 3) -> EmbeddedKeyspace:
    ks = EmbeddedKeyspace(None)
    for name, limit in members.items():
        zone, suffix = name.split("/")
        await ks.txn([], [Put(LAYOUT.member_key(zone, suffix), str(limit).encode())])
    ops = [Put(LAYOUT.item_key(f"item-{i:04d}"), str(r).encode()) for i in range(items)]
    for start in range(0, len(ops), 100):
        await ks.txn([], ops[start : start + 100])
    return ks


def _state(ks: EmbeddedKeyspace) -> AllocatorState:
    return AllocatorState.extract(ks, LAYOUT, TextDecoder(), LOCAL)


async def _assign(ks: EmbeddedKeyspace, plan: DesiredPlan) -> None:
    """Make current assignments equal the plan's (as converged rounds would)."""
    ops: list[Put | Delete] = [Delete(kv.key) for kv in ks.range(LAYOUT.assign_prefix)]
    slots: Counter[str] = Counter()
    for d in plan.assignments():
        key = LAYOUT.assign_prefix + f"{d.item}#{d.zone}#{d.suffix}#{slots[d.item]}"
        slots[d.item] += 1
        ops.append(Put(key, b""))
    for start in range(0, len(ops), 100):
        await ks.txn([], ops[start : start + 100])


def _placements(plan: DesiredPlan) -> set[tuple[str, str, str]]:
    return {(d.item, d.zone, d.suffix) for d in plan.assignments()}


MEMBERS = {f"{'ab'[i % 2]}/m{i}": 100 for i in range(10)}


async def test_full_plan_equals_the_one_shot_solve() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    assert plan.assignments() == solve_desired_assignments(_state(ks))
    load = Counter(f"{d.zone}/{d.suffix}" for d in plan.assignments())
    assert len(plan.assignments()) == 600 and not plan.short
    assert max(load.values()) - min(load.values()) <= 1
    assert all({d.zone for d in plan.by_item[i]} == {"a", "b"} for i in plan.by_item)


async def test_a_new_item_is_all_that_is_solved() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    await _assign(ks, plan)
    before = _placements(plan)
    assert plan.update(_state(ks), set()) == set()  # Nothing changed: nothing solved.
    solved = plan.solved_items
    await ks.txn([], [Put(LAYOUT.item_key("new"), b"2")])
    assert plan.update(_state(ks), {"new"}) == {"new"}
    assert plan.solved_items - solved == 1
    assert _placements(plan) - before == {(d.item, d.zone, d.suffix) for d in plan.by_item["new"]}
    assert len(plan.by_item["new"]) == 2
    # Its replication changes: it alone is re-solved.
    await ks.txn([], [Put(LAYOUT.item_key("new"), b"3")])
    assert plan.update(_state(ks), {"new"}) == {"new"} and len(plan.by_item["new"]) == 3
    # It goes away: its desired assignments go, nothing else is solved.
    solved = plan.solved_items
    await ks.txn([], [Delete(LAYOUT.item_key("new"))])
    assert plan.update(_state(ks), {"new"}) == {"new"}
    assert plan.solved_items == solved and _placements(plan) == before


async def test_a_member_joining_moves_only_its_fair_share() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    await _assign(ks, plan)
    before = _placements(plan)
    await ks.txn([], [Put(LAYOUT.member_key("b", "new"), b"100")])
    changed = plan.update(_state(ks), set())
    after = _placements(plan)
    moved_in = after - before
    # 600 slots over 11 members: the new one takes about its fair share (55), and little
    # else moves (a solver may trade an equal-cost move for balance).
    to_new = {x for x in moved_in if x[1:] == ("b", "new")}
    assert 50 <= len(to_new) <= 55
    assert len(moved_in) <= len(to_new) + 5
    assert len(before - after) == len(moved_in)
    assert changed == {i for i, _, _ in moved_in}
    assert plan.solved_items < 200 + 100  # Not everything again.
    load = Counter(f"{z}/{s}" for _, z, s in after)
    assert max(load.values()) <= 55  # None beyond its fair share.


async def test_a_member_leaving_moves_only_its_items() -> None:
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    await _assign(ks, plan)
    before = _placements(plan)
    gone = {(i, z, s) for i, z, s in before if (z, s) == ("a", "m4")}
    await ks.txn([], [Delete(LAYOUT.member_key("a", "m4"))])
    solved = plan.solved_items
    changed = plan.update(_state(ks), set())
    after = _placements(plan)
    assert before - after == gone
    assert len(after - before) == len(gone)  # Each lost replica placed once elsewhere.
    assert changed == {i for i, _, _ in gone}
    assert plan.solved_items - solved == len(gone)
    assert not plan.short
    assert all({d.zone for d in plan.by_item[i]} == {"a", "b"} for i in plan.by_item)


async def test_many_networks_balance_like_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solver, "ITEMS_PER_NETWORK", 30)  # 200 items: 7 networks.
    ks = await _cluster(MEMBERS, 200)
    plan = DesiredPlan()
    plan.update(_state(ks), None)
    load = Counter(f"{d.zone}/{d.suffix}" for d in plan.assignments())
    assert len(plan.assignments()) == 600
    assert max(load.values()) - min(load.values()) <= 1  # 60 each.
