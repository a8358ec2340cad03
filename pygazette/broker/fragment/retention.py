"""Retention: removing a journal's fragments once they are older than `fragment.retention`,
or once the journal keeps more persisted content than its `pygazette.dev/retention-bytes`.

A fragment's age is its store modification time, an upper bound on when its content was
appended. Retention <= 0 keeps everything (gazctl's `journals prune` would remove every
persisted fragment of such a journal).

Size-bounded retention (`protocol.retention_bytes`) counts journal content: with a bound of
N bytes and the largest persisted offset H, a fragment beginning before H - N has expired,
whatever its age, so the persisted history kept spans at most N bytes — oldest removed
first — except that the fragment holding H is kept even when it alone is larger. Age and size
expire fragments independently; the same rules below decide what an expired fragment may
take away. The plan works from a fresh listing of every store of
the journal — not the broker's cover set — so smaller overlapping copies, which gazctl leaves
behind, expire too. Beyond age, a fragment is kept while removing it would take away the
only copy of offsets that readers of the retained history still need:

- the fragment(s) ending at the journal's largest persisted offset are kept, so that the
  write head is never lost and never moves backwards (a broker restarting over a store
  that retention had emptied would start the journal again at offset 0);
- retention trims history from its beginning: an expired fragment lying after the start of
  the retained content (out-of-order persistence, e.g. after a store outage, can leave old
  fragments between young ones) is kept unless other kept fragments hold all its offsets
  from that start on — removing it would leave a gap that readers of the retained content
  must stop at. (Its offsets before that start may go: readers jump to the start.)

Expired fragments wholly covered by kept ones (duplicates in another store, smaller copies)
are removed. The broker applies the plan on a timer (`RetentionEnforcer`) and on demand
(the Retention.Prune RPC behind `pygazette journals prune`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from pygazette.broker.fragment.cover_set import CoverSet
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import retention_pb2 as rpb
from pygazette.protocol.retention_bytes import retention_bytes
from pygazette.stores.store import StoreError, StoreRegistry

if TYPE_CHECKING:
    from pygazette.broker.peers import Peers
    from pygazette.broker.replica import Replica
    from pygazette.broker.resolver import Resolver

log = logging.getLogger(__name__)

DEFAULT_ENFORCE_INTERVAL_SECONDS = 15 * 60.0
# How long a peer is believed to be (or not be) a Gazette broker, and how long it is asked.
PROBE_TTL_SECONDS = 10 * 60.0
PROBE_TIMEOUT_SECONDS = 10.0

KEPT_HEAD = "holds the journal's last persisted offsets (its write head)"
KEPT_GAP = "only copy of offsets that retained fragments follow; removing it would leave a gap"


def retention_seconds(spec: pb.JournalSpec) -> float:
    r = spec.fragment.retention
    return r.seconds + r.nanos / 1e9


@dataclass(slots=True)
class RetentionPlan:
    remove: list[pb.Fragment] = field(default_factory=list)
    kept: list[tuple[pb.Fragment, str]] = field(default_factory=list)  # Expired, yet kept.


def plan_retention(
    listing: Sequence[pb.Fragment], retention: float, now: float, max_bytes: int = 0
) -> RetentionPlan:
    """Which fragments of `listing` (one journal, every store) retention removes at `now`.

    `retention` is the maximum age in seconds, `max_bytes` the most journal content to keep
    (`pygazette.dev/retention-bytes`); either <= 0 does not bound.
    """
    plan = RetentionPlan()
    if (retention <= 0 and max_bytes <= 0) or not listing:
        return plan
    head_end = max(f.end for f in listing)
    cutoff = now - retention if retention > 0 else None
    first_kept = head_end - max_bytes if max_bytes > 0 else None

    def is_expired(f: pb.Fragment) -> bool:
        if first_kept is not None and f.begin < first_kept:
            return True
        return cutoff is not None and bool(f.mod_time) and f.mod_time <= cutoff

    expired = [f for f in listing if is_expired(f)]
    if not expired:
        return plan
    head = min((f for f in listing if f.end == head_end), key=lambda f: f.begin)
    kept: CoverSet[pb.Fragment] = CoverSet()
    for f in listing:
        if f is head or not is_expired(f):
            kept.add(f)
    retained_from = min([f.begin for f in kept] or [head.begin])
    order = {id(f): i for i, f in enumerate(listing)}
    # The youngest expired fragments first: a pass planned a little earlier (another broker
    # of the journal, or the timer and `journals prune`, listing at once) found them young
    # and may have removed older ones as covered by them, so they are the ones to keep.
    # Then the largest, which hold the most of what may be needed.
    for f in sorted(
        expired, key=lambda f: (-f.mod_time, f.begin - f.end, f.begin, order[id(f)])
    ):
        if f is head:
            plan.kept.append((f, KEPT_HEAD))
        elif f.end <= retained_from or kept.covers(max(f.begin, retained_from), f.end):
            plan.remove.append(f)
        else:
            plan.kept.append((f, KEPT_GAP))
            kept.add(f)
    plan.remove.sort(key=lambda f: (f.begin, f.end, f.backing_store))
    plan.kept.sort(key=lambda k: (k[0].begin, k[0].end, k[0].backing_store))
    return plan


@dataclass(slots=True)
class PruneResult:
    removed: list[pb.Fragment]  # With dry_run, what would be removed.
    kept: list[tuple[pb.Fragment, str]]
    errors: list[str]


async def prune_journal(
    replica: Replica, stores: StoreRegistry, *, dry_run: bool, now: float | None = None
) -> PruneResult:
    """Apply retention to `replica`'s journal, from a fresh listing of all its stores (which
    leaves out a journal nested under its name: `Replica.list_stores`)."""
    listing = await replica.list_stores()
    plan = plan_retention(
        listing,
        retention_seconds(replica.spec),
        now or time.time(),
        retention_bytes(replica.spec),
    )
    if dry_run:
        return PruneResult(plan.remove, plan.kept, [])
    removed: list[pb.Fragment] = []
    errors: list[str] = []
    for frag in plan.remove:
        path = fragment_content_path(frag)
        try:
            await stores.get(frag.backing_store).remove(path)
        except StoreError as exc:
            errors.append(f"{frag.backing_store}{path}: {exc}")
            continue
        removed.append(frag)
        log.info(
            "pruned fragment",
            extra={"journal": frag.journal, "store": frag.backing_store, "path": path},
        )
    if removed:
        with contextlib.suppress(StoreError):
            await replica.refresh()  # Readers stop seeing what was removed.
    return PruneResult(removed, plan.kept, errors)


class RetentionEnforcer:
    """Prunes every journal this broker is the primary of, every `interval` seconds (0:
    never): those with a `fragment.retention`, a `pygazette.dev/retention-bytes` label, or
    both. Its other replicas leave the journal to the primary: each pass lists every store of
    the journal, so a pass on each of R brokers cost R listings and raced to remove the same
    files. A journal without a primary for a moment waits for the next pass.

    Unless the primary is a Gazette broker (brokers of both may share a cluster): Gazette's
    brokers never prune, so this broker's replica does, as before (with `peers`: it asks the
    primary's Retention service, which a Gazette broker answers UNIMPLEMENTED)."""

    def __init__(
        self,
        resolver: Resolver,
        stores: StoreRegistry,
        interval: float,
        *,
        peers: Peers | None = None,
        endpoint_of: Callable[[str, str], str] | None = None,
    ) -> None:
        self.resolver = resolver
        self.stores = stores
        self.interval = interval
        self.peers = peers
        self.endpoint_of = endpoint_of  # A member's (zone, suffix) endpoint.
        # Endpoint -> (whether it is a Gazette broker, until when that is believed).
        self._gazette: dict[str, tuple[bool, float]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.create_task(self._loop(), name="retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run_once(self) -> int:
        """One pass over every journal; returns how many fragments were removed."""
        total = 0
        for replica in list(self.resolver.replicas.values()):
            spec = replica.spec
            if not spec.fragment.stores or (
                retention_seconds(spec) <= 0 and retention_bytes(spec) <= 0
            ):
                continue
            if replica.clustered and not replica.primary:
                if not await self._primary_is_gazette(replica):
                    continue  # The primary's to prune.
            try:
                result = await prune_journal(replica, self.stores, dry_run=False)
            except StoreError as exc:
                log.warning(
                    "retention pass failed", extra={"journal": replica.name, "error": str(exc)}
                )
                continue
            total += len(result.removed)
            for error in result.errors:
                log.warning("retention could not remove a fragment", extra={"error": error})
        return total

    async def _primary_is_gazette(self, replica: Replica) -> bool:
        """Whether the journal's primary is a Gazette broker (False if unknown)."""
        if self.peers is None or self.endpoint_of is None:
            return False
        primary = next((a for a in replica.assignments if a.slot == 0), None)
        if primary is None:
            return False
        endpoint = self.endpoint_of(primary.zone, primary.suffix)
        if not endpoint:
            return False
        now = time.monotonic()
        known = self._gazette.get(endpoint)
        if known is not None and known[1] > now:
            return known[0]
        try:
            # An invalid request: a pygazette broker refuses it (INVALID_ARGUMENT), having
            # done nothing; a Gazette broker does not serve the method at all.
            await self.peers.retention_stub(endpoint).Prune(
                rpb.PruneRequest(journal=""), timeout=PROBE_TIMEOUT_SECONDS
            )
            gazette = False
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False  # Unreachable for now: ask again at the next pass.
            gazette = exc.code() == grpc.StatusCode.UNIMPLEMENTED
        if len(self._gazette) > 1024:
            self._gazette.clear()
        self._gazette[endpoint] = (gazette, now + PROBE_TTL_SECONDS)
        if gazette:
            log.info(
                "pruning a journal whose primary is a Gazette broker",
                extra={"journal": replica.name, "primary": endpoint},
            )
        return gazette

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.run_once()
