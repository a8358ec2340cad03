"""`JournalSpecs`: a consumer process's shared lookups of journal specs (its shards' sources).

A primary shard needs each source journal's spec once, to pick the journal's framing (as
Gazette's ReadUncommittedIter fetches it). Thousands of shards starting at once, many
reading the same journals, would each ask a broker to List one journal — a List RPC each,
and a selector of several names walks every journal the broker knows (a broker narrows its
List only to one name). Here the journals asked for at
the same time are looked up together: one List per `batch` names (a selector including
each name: `name in (a, b, ...)`, which Gazette's brokers answer the same way), by at most
`lookups` Lists in flight; each journal is looked up once however many shards ask, and its
spec serves every shard that asks within `max_age` seconds (no timer: an entry's age is
checked when it is asked for). A failed lookup is not kept: each of its askers gets the
error, and the next ask tries again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import list_journals
from pygazette.protocol.errors import error_for_status
from pygazette.protocol.pb import protocol_pb2 as pb

__all__ = ["DEFAULT_MAX_AGE", "JournalSpecs", "list_specs"]

# How long a fetched spec serves later asks (a relabeled journal's new framing is used by
# shards starting after this).
DEFAULT_MAX_AGE = 30.0
_LIMIT = 100_000  # Entries kept at most (all are dropped past it).

Fetch = Callable[[Sequence[str]], Awaitable[dict[str, pb.JournalSpec]]]


def list_specs(client: JournalClient) -> Fetch:
    """Look journals up with one List RPC through `client` (names without metadata)."""

    async def fetch(names: Sequence[str]) -> dict[str, pb.JournalSpec]:
        selector = pb.LabelSelector()
        for name in sorted(set(names)):  # A selector's labels are unique and sorted.
            selector.include.labels.add(name="name", value=name)
        journals = await list_journals(client, selector)
        for j in journals:  # A routed client reads each from its primary from the start.
            client.note_route(j.spec.name, j.route)
        return {j.spec.name: j.spec for j in journals}

    return fetch


class JournalSpecs:
    def __init__(
        self,
        fetch: Fetch,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        batch: int = 100,
        lookups: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.max_age = max_age
        self.batch = max(1, batch)
        self.lookups = max(1, lookups)
        self._clock = clock
        self._specs: dict[str, tuple[float, pb.JournalSpec]] = {}
        self._inflight: dict[str, asyncio.Future[pb.JournalSpec]] = {}
        self._wanted: list[str] = []
        self._fetchers: set[asyncio.Task[None]] = set()
        self.fetches = 0  # Lookups (List RPCs) sent: for tests and diagnostics.

    async def get(self, journal: str) -> pb.JournalSpec:
        """The spec of `journal` (shared: don't modify it); raises what the lookup raised,
        or JournalNotFound."""
        name = journal.split(";", 1)[0]  # Without a metadata path segment.
        cached = self._specs.get(name)
        if cached is not None and self._clock() - cached[0] < self.max_age:
            return cached[1]
        inflight = self._inflight.get(name)
        if inflight is None:
            inflight = asyncio.get_running_loop().create_future()
            # Its failure is each asker's; retrieved here in case every asker went away.
            inflight.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._inflight[name] = inflight
            self._wanted.append(name)
            # Count only lookups still running: one that found nothing more wanted and
            # returned stays in `_fetchers` until its done callback runs, later in this
            # turn of the loop, and would never take this name.
            if sum(1 for f in self._fetchers if not f.done()) < self.lookups:
                task = asyncio.create_task(self._fetch_wanted(), name="journal-specs")
                self._fetchers.add(task)
                task.add_done_callback(self._fetchers.discard)
        # Shielded: one asker's cancellation doesn't cancel the others' lookup.
        return await asyncio.shield(inflight)

    async def _fetch_wanted(self) -> None:
        while self._wanted:
            names, self._wanted = self._wanted[: self.batch], self._wanted[self.batch :]
            fetched_at = self._clock()
            self.fetches += 1
            try:
                specs = await self._fetch(names)
            except Exception as exc:
                for name in names:
                    self._settle(name, error=exc)
                continue
            if len(self._specs) + len(specs) > _LIMIT:
                self._specs.clear()
            for name in names:
                spec = specs.get(name)
                if spec is None:
                    self._settle(name, error=error_for_status(pb.JOURNAL_NOT_FOUND, name))
                else:
                    self._specs[name] = (fetched_at, spec)
                    self._settle(name, spec=spec)

    def _settle(
        self, name: str, *, spec: pb.JournalSpec | None = None, error: Exception | None = None
    ) -> None:
        fut = self._inflight.pop(name, None)
        if fut is None or fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(spec)  # type: ignore[arg-type]
