"""The narrow interfaces the append paths need from a journal's runtime (`replica.Replica`).

- `JournalRuntime`: `append_fsm` (the primary's state machine) and `replicate_service`
  (the replica side) drive one journal in cluster mode through it: its locks, its
  replicated spool and pipeline, the few facts the preconditions read, and the two ways the
  pipeline changes the journal (closing replication, moving the confirmed frontier).
- `LocalJournal`: a single-node append (`append_service`) reads its preconditions, starts
  an append at the write head, and commits it (or drops it, if empty).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
from typing import Protocol

from pygazette.broker.flow_control import RateLimiter
from pygazette.broker.fragment.fragment_index import FragmentIndex
from pygazette.broker.fragment.spool import PendingAppend, Spool
from pygazette.broker.pipeline import Pipeline
from pygazette.broker.replicated_spool import ReplicatedSpool
from pygazette.protocol.pb import protocol_pb2 as pb


class JournalRuntime(Protocol):
    """One journal on this broker, as appends and Replicate streams drive it."""

    name: str
    primary: bool  # This broker is the journal's primary.
    stopping: bool
    invalidated: asyncio.Event  # Set (and replaced) when the journal's assignments change.
    # Held by the append that streams and sends its commit (appends never interleave).
    pipeline: asyncio.Lock
    # Held by whoever owns the open spool: the primary's pipeline, or a peer's stream.
    spool_lock: asyncio.Lock
    rspool: ReplicatedSpool | None
    replication: Pipeline | None  # The primary's open pipeline.
    # When (monotonic) an append was last replicated whole, with no pipeline (`append_fsm`).
    replicated_whole_at: float
    index: FragmentIndex
    limiter: RateLimiter

    def append_refusal(self) -> str:
        """Why appends must be refused now (FRAGMENT_STORE_UNHEALTHY), or ""."""
        ...

    async def await_first_listing(self) -> str:
        """ "" once the stores' first listing landed, else why it keeps failing."""
        ...

    async def close_replication(self, *, graceful: bool = True) -> None:
        """Close the primary's pipeline (the caller holds `pipeline`) and give the spool
        back; gracefully, what was acknowledged is confirmed first."""
        ...

    def confirm_through(self, offset: int) -> None:
        """Every member holds (and has confirmed) the journal up to `offset`."""
        ...


class LocalJournal(Protocol):
    """One journal on a single-node broker, as an append drives it (holding `pipeline`)."""

    name: str
    registers: pb.LabelSet
    index: FragmentIndex
    spool: Spool | None  # The open spool.
    limiter: RateLimiter

    @property
    def head(self) -> int:
        """The journal's write head."""
        ...

    def start_append(self) -> tuple[Spool, PendingAppend, hashlib._Hash]:
        """The spool to append to, the append, and the spool's running SHA-1."""
        ...

    async def commit_append(
        self,
        spool: Spool,
        pending: PendingAppend,
        running: hashlib._Hash,
        summing: concurrent.futures.Future[None] | None,
        registers: pb.LabelSet,
    ) -> None:
        """Commit the append with the journal's new registers."""
        ...

    def drop_empty_append(self, spool: Spool) -> None:
        """Drop the spool if it was opened for this (empty) append alone."""
        ...
