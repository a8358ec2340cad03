"""The allocation loop: every member runs it; only the leader changes assignments.

Each member keeps an `AllocatorState` that follows the keyspace change by change
(`ObservedState`, a keyspace listener that must run before any listener reading it). The
leader — the member whose key has the lowest create revision — keeps desired assignments
(`DesiredPlan`), re-solving the items that items, members or their limits changed, and
after every keyspace change converges a step toward them the items whose assignments may
still have to change (not all items), in transactions guarded by its own member key (so a
deposed leader's writes fail). `run` returns once the local member is
exiting and holds no assignments, and raises if the local member key disappears (its lease
expired).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pygazette.allocator.converge import BatchedTxn, TxnFailed, converge, unchanged
from pygazette.allocator.metrics import MAX_FLOW_RUNTIME
from pygazette.allocator.solver import DesiredPlan
from pygazette.allocator.state import AllocatorDecoder, AllocatorState
from pygazette.keyspace.keyspace import KeyChanges, Keyspace, KeyspaceUnavailable
from pygazette.keyspace.layout import KeyLayout

log = logging.getLogger(__name__)

# After a failed round (etcd unreachable, a lost race), retry this soon even without a change.
RETRY_SECONDS = 0.5


class MemberKeyMissing(Exception):
    """The local member's key is gone from the keyspace (its lease expired)."""


class TouchedItems:
    """Items whose key or assignments changed since its owner last took them."""

    def __init__(self) -> None:
        self._items: set[str] = set()
        self._all = True  # Everything, at first and after a reload.

    def add(self, state: AllocatorState) -> None:
        if state.touched_items is None:
            self._all = True
            self._items.clear()
        elif not self._all:
            self._items |= state.touched_items

    def take(self) -> set[str] | None:
        """The items touched since the last take (None: any item may have been)."""
        if self._all:
            self._all = False
            return None
        out, self._items = self._items, set()
        return out


class ObservedState:
    """The latest AllocatorState, kept up to date by applying each keyspace change to it.

    Each change publishes a new state object (`current`) that shares what didn't change
    with the one before, which stays as it was for whoever still holds it. A change that
    doesn't follow the state's revision (a missed notification, a reload) re-extracts the
    state from scratch.
    """

    def __init__(
        self, ks: Keyspace, layout: KeyLayout, decoder: AllocatorDecoder, local_key: str
    ) -> None:
        self.ks = ks
        self.layout = layout
        self.decoder = decoder
        self.local_key = local_key
        self._feeds: list[TouchedItems] = []
        self.current = AllocatorState.extract(ks, layout, decoder, local_key)
        ks.add_change_listener(self._observe)

    def touched_items(self) -> TouchedItems:
        """A feed of the items that change from now on (everything, at first)."""
        feed = TouchedItems()
        self._feeds.append(feed)
        return feed

    def _observe(self, changes: KeyChanges) -> None:
        if not changes.reset and changes.revision <= self.current.revision:
            return  # Already reflected (a refresh caught up before this notification).
        if changes.reset or changes.prior != self.current.revision:
            self.refresh()
        else:
            self._publish(self.current.apply(changes))

    def refresh(self) -> None:
        """Re-extract the state from the keyspace as it is now."""
        self._publish(AllocatorState.extract(self.ks, self.layout, self.decoder, self.local_key))

    def _publish(self, state: AllocatorState) -> None:
        self.current = state
        for feed in self._feeds:
            feed.add(state)


class Allocator:
    def __init__(
        self,
        ks: Keyspace,
        observed: ObservedState,
        *,
        on_round: Callable[[AllocatorState, bool], None] | None = None,
    ) -> None:
        self.ks = ks
        self.observed = observed
        self.on_round = on_round  # (state, idle): after each leader round (tests).
        self.rounds = 0
        # Totals over the leader's rounds (Gazette's assignment added/removed/packed counters).
        self.adds = 0
        self.removes = 0
        self.packs = 0
        self.solve_seconds: list[float] = []  # Of each re-solve that changed the plan.
        self.solve_cpu_seconds: list[float] = []  # The same re-solves' CPU (this thread).
        self.items_solved = 0  # Items put in flow networks.

    def _observed_reaches(self, revision: int, floor: int) -> Callable[[], bool]:
        """Whether the observed state reached `revision`, or must be caught up, or went back
        below `floor` (the revision the round saw: a reload from a store behind the mirror,
        which would reach `revision` only after as many changes again)."""

        def reached() -> bool:
            current = self.observed.current.revision
            return current >= revision or current < self.ks.revision or current < floor

        return reached

    async def run(self) -> None:
        plan: DesiredPlan | None = None
        touched_feed = self.observed.touched_items()
        pending: set[str] = set()  # Items whose assignments may still have to change.
        while True:
            if self.observed.current.revision < self.ks.revision:
                # A change applied before its listeners ran (or one they missed): catch up
                # rather than act on (and wait from) a stale state.
                self.observed.refresh()
            state = self.observed.current
            if state.local_member < 0:
                raise MemberKeyMissing(f"member key {state.local_key} is not in the keyspace")
            if state.should_exit():
                return
            next_revision = state.revision + 1
            timeout: float | None = None
            touched = touched_feed.take()
            if not state.is_leader():
                plan = None  # A leader to be starts from scratch.
            else:
                if plan is None:
                    plan, touched = DesiredPlan(), None
                started, solved = time.perf_counter(), plan.solved_items
                cpu_started = time.thread_time()
                with MAX_FLOW_RUNTIME.time():
                    changed = plan.update(state, touched)
                elapsed = time.perf_counter() - started
                cpu = time.thread_time() - cpu_started
                self.items_solved += plan.solved_items - solved
                if changed or touched is None:
                    self.solve_seconds.append(elapsed)
                    self.solve_cpu_seconds.append(cpu)
                    if plan.short:
                        log.warning(
                            "cannot reach desired replication for all items",
                            extra={"items_short": len(plan.short)},
                        )
                if touched is None:
                    pending = set(state.item_map) | set(state.by_item)
                else:
                    pending |= touched
                pending |= changed
                # Work on a copy: convergence updates per-member tallies as it goes.
                work = state.for_convergence()
                local = work.members[work.local_member]
                txn = BatchedTxn(self.ks, [unchanged(local.kv)])
                try:
                    stats = await converge(work, plan.by_item, txn, pending)
                    await txn.flush()
                except (TxnFailed, KeyspaceUnavailable) as exc:
                    log.info("allocation round failed (will retry)", extra={"error": str(exc)})
                    timeout = RETRY_SECONDS
                else:
                    pending -= stats.settled
                    self.adds += stats.adds
                    self.removes += stats.removes
                    self.packs += stats.packs
                    self.rounds += 1
                    if self.on_round is not None:
                        self.on_round(work, txn.revision == 0)
                next_revision = max(next_revision, txn.revision)
            try:
                # Wait on the observed state, not the keyspace's revision: the next round
                # must see the change it waits for, or it would spin on a stale state.
                await self.ks.wait_until(
                    self._observed_reaches(next_revision, state.revision), timeout
                )
            except TimeoutError:
                pass
