"""Allocator and membership metrics, read from the observed state when scraped.

Gazette's `gazette_allocator_members`, `…_items`, `…_desired_replication_slots`,
`…_converge_total`, `…_assignment_{added,packed,removed}_total` and
`…_max_flow_runtime_seconds`; and pygazette's own
`pygazette_allocator_leader`, `pygazette_allocator_local_assignments`{role} (the items this
process holds, as primary or standby/replica) and `pygazette_etcd_lease`{state} (1 for the
state the member's etcd lease is in: "granted" while its keep-alive is overdue, "alive",
"lost"), with `pygazette_etcd_lease_remaining_seconds`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from pygazette.allocator.allocator import Allocator, ObservedState
    from pygazette.allocator.session import MemberSession

MAX_FLOW_RUNTIME = Histogram(
    "gazette_allocator_max_flow_runtime_seconds",
    "Duration required to re-solve for maximum assignment.",
)

LEASE_STATES = ("granted", "alive", "lost")


class AllocatorCollector:
    """The allocator's view of its members and items, and this member's assignments."""

    def __init__(
        self,
        observed: ObservedState,
        allocator: Callable[[], Allocator | None] = lambda: None,
        *,
        primary_role: str = "primary",
        secondary_role: str = "replica",
    ) -> None:
        self.observed = observed
        self.allocator = allocator
        self.roles = (primary_role, secondary_role)

    def collect(self) -> Iterator[Metric]:
        state = self.observed.current
        yield GaugeMetricFamily(
            "gazette_allocator_members",
            "Number of members known to the allocator.",
            value=len(state.members),
        )
        yield GaugeMetricFamily(
            "gazette_allocator_items",
            "Number of items known to the allocator.",
            value=len(state.item_map),
        )
        yield GaugeMetricFamily(
            "gazette_allocator_desired_replication_slots",
            "Number of desired item replication slots summed across all items.",
            value=state.item_slots,
        )
        allocator = self.allocator()
        yield CounterMetricFamily(
            "gazette_allocator_converge",
            "Cumulative number of converge iterations.",
            value=allocator.rounds if allocator is not None else 0,
        )
        for name, what in (("added", "adds"), ("packed", "packs"), ("removed", "removes")):
            yield CounterMetricFamily(
                f"gazette_allocator_assignment_{name}",
                f"Cumulative number of item / member assignments {name} by the allocator.",
                value=getattr(allocator, what) if allocator is not None else 0,
            )
        yield GaugeMetricFamily(
            "pygazette_allocator_leader",
            "1 if this process leads allocation (solves and converges assignments).",
            value=1.0 if state.is_leader() else 0.0,
        )
        primary = sum(1 for item in state.local_items if item.assignment.slot == 0)
        local = GaugeMetricFamily(
            "pygazette_allocator_local_assignments",
            "Items assigned to this process, by its role.",
            labels=["role"],
        )
        local.add_metric([self.roles[0]], primary)
        local.add_metric([self.roles[1]], len(state.local_items) - primary)
        yield local


class LeaseCollector:
    """The state of a member's etcd lease (nothing before the session exists)."""

    def __init__(self, session: Callable[[], MemberSession | None]) -> None:
        self.session = session

    def collect(self) -> Iterator[Metric]:
        session = self.session()
        if session is None or not session.lease:
            return
        if session.lost.is_set():
            current = "lost"
        elif session.lease_alive():
            current = "alive"
        else:
            current = "granted"
        states = GaugeMetricFamily(
            "pygazette_etcd_lease",
            "1 for the state this member's etcd lease is in (granted: keep-alive overdue).",
            labels=["state"],
        )
        for name in LEASE_STATES:
            states.add_metric([name], 1.0 if name == current else 0.0)
        yield states
        yield GaugeMetricFamily(
            "pygazette_etcd_lease_remaining_seconds",
            "Seconds until the etcd lease would expire without another keep-alive.",
            value=max(0.0, session.lease_deadline - time.monotonic()),
        )
        yield CounterMetricFamily(
            "pygazette_etcd_lease_keepalives",
            "Keep-alives of this member's etcd lease that etcd acknowledged (they run on a "
            "thread of their own, so a busy event loop doesn't delay them).",
            value=session.keep_alives,
        )
        yield GaugeMetricFamily(
            "pygazette_etcd_lease_keepalive_max_seconds",
            "The longest a keep-alive of this member's etcd lease waited for etcd's answer.",
            value=session.slowest_keep_alive,
        )
