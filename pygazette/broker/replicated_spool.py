"""A journal's open fragment as the Replicate protocol drives it, on primary and replicas.

It follows Gazette's spool rules for ReplicateRequests: content is written at `content_delta`
past the committed end; a proposal is either

- a roll: it ends past everything held here (or is empty at our end): the current spool
  completes (and persists) and a new, empty fragment starts at the proposal's end, taking
  the proposal's registers when it ends further than we had;
- our exact fragment and registers: uncommitted content rolls back;
- our fragment extended by the content received, with its SHA-1: a commit, with the
  proposal's registers;
- anything else: PROPOSAL_MISMATCH, answered with our fragment and registers.

Spools stay crash-safe (`spool.py`) on every replica, which adds one duty Gazette's
memory-only replicas don't have: a replica may hold commits its primary never got
acknowledged by every peer (the primary died mid-commit), and may carry them across a
restart. So each replica tracks a *confirmed* frontier: the offset its primary last
confirmed, explicitly (`pipeline`: a later proposal carrying the pipeline's Header again),
once every peer had acknowledged the commits below it. Everything below the frontier is on
every replica of the route, while content above it is not known to be; and the primary
acknowledges an append only once every peer acknowledged a confirmation covering it
(`append_fsm`), so content above the frontier was never acknowledged. The frontier:

- is what a replica lets readers see (it never shows content that could be taken back):
  the open spool is held back to it (`Spool.hold_back`), so the fragment a Read or
  ListFragments response describes ends there too, with the SHA-1 of exactly that content;
- is kept in the broker's frontier log (`fragment.frontier_log`), surviving restarts;
- bounds what a replica keeps when a *new* pipeline (new primary, or the same after a
  failure) opens with a proposal other than exactly our fragment: unconfirmed content is
  cut first, so content no peer acknowledged never resurfaces beside what the cluster wrote
  at the same offsets in the meantime;
- bounds what a completed spool holds, on every member, primary included (a primary's
  commit whose confirming round failed lies beyond its frontier too), so a spool that
  completes — a roll, or the journal leaving this broker — never persists content that the
  next pipeline cuts everywhere else and writes over.

One exception to cutting at the frontier: content *in doubt* (`in_doubt`). A primary whose
pipeline failed after it sent a confirmation (or, on a route of two, a commit that confirms
itself) that not every peer acknowledged can't tell whether some peer took it: that peer
then holds the content up to it as confirmed (and keeps it, across restarts). Its own
frontier never moved, so cutting to it would let the journal continue below that offset
with other bytes, beside the peer's. So `Replica.close_replication` notes the greatest such
offset (`note_in_doubt`), and a new pipeline never cuts below a confirmation this broker
sent: its first proposal, as primary or as replica, cuts only above `max(confirmed,
in_doubt)` (`cut_unconfirmed(keep_in_doubt=True)`). Kept, that content is still held back
from readers (they see up to the confirmed frontier); as primary, the new pipeline's
synchronisation then confirms it everywhere; as replica, we answer a shorter proposal with
PROPOSAL_MISMATCH and our fragment, and the new primary rolls forward past it. A roll at our
end (the route goes on from it) closes the spool with it; a roll past our end cuts it (some
member holds content beyond ours: the content in doubt, if it took our confirmation, or
else what the route went on with at those offsets). Closed, that spool is still
held back at the frontier (the write head readers see stays there: no Read or ListFragments
response describes content past it), and it is persisted only once the frontier reaches its
end (the new pipeline's synchronisation confirms it: `Replica.set_readable`): a fragment in
the store is confirmed content, which every broker shows. The journal leaving this broker
(`complete`) still cuts to the confirmed frontier, the open spool and such closed ones alike
(`Replica.hold_closed`): the route it leaves may go on without us, with other bytes.
`in_doubt` is kept in memory only: a primary that crashes as well as losing an
acknowledgement (a double failure) forgets it, and cuts to its frontier after a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pygazette.broker.fragment.fragment_index import FragmentIndex
from pygazette.broker.fragment.frontier_log import LEGACY_FILE, FrontierLog, legacy_frontier
from pygazette.broker.fragment.spool import PendingAppend, Spool, SpoolCorrupt
from pygazette.broker.metrics import record_rollback
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)

_THREAD_CHUNK = 128 * 1024
_SHA1_PARTS = struct.Struct(">QQI")  # A SHA1Sum's parts (`fragment_name`).


class SpoolHost(Protocol):
    """What a replicated spool needs from its journal's runtime (`replica.Replica`)."""

    name: str
    spool_dir: Path
    frontiers: FrontierLog  # The broker's record of confirmed frontiers.
    sync: bool
    spool: Spool | None  # The open spool.
    registers: pb.LabelSet
    index: FragmentIndex

    def persist_spool(self, spool: Spool, *, check_existing: bool = False) -> None: ...

    def hold_closed(self, spool: Spool, *, check_existing: bool) -> None: ...


class ReplicationProtocolError(Exception):
    """A peer sent a request that breaks the protocol (e.g. content at the wrong delta)."""


class SpoolFinished(Exception):
    """The journal's replica stopped, and its spool takes no more writes: a Replicate stream
    or an append that outlived the stop (`Replica.stop`) is refused. A new replica of the
    journal may own the spool's files by now (it recovers them)."""


def fragments_equal(a: pb.Fragment, b: pb.Fragment) -> bool:
    """Equal as Gazette compares spool fragments: journal, offsets, sum and codec."""
    return (
        a.journal == b.journal
        and a.begin == b.begin
        and a.end == b.end
        and a.sum.part1 == b.sum.part1
        and a.sum.part2 == b.sum.part2
        and a.sum.part3 == b.sum.part3
        and a.compression_codec == b.compression_codec
    )


def roll_proposal(
    frag: pb.Fragment,
    first_append_time: float | None,
    roll_to: int,
    spec: pb.JournalSpec.Fragment,
    now: float,
) -> pb.Fragment:
    """The fragment to propose next: `frag` itself, or an empty one rolled to its end (or to
    `roll_to`) if it is empty, asked to roll, or due to (`due_to_roll`)."""
    length = frag.end - frag.begin
    flush = (
        length == 0
        or bool(roll_to and roll_to != frag.begin)
        or due_to_roll(length, first_append_time, spec, now)
    )
    if not flush:
        return frag
    end = roll_to if roll_to else frag.end
    if end < frag.end:
        raise ValueError(f"roll to {end}, before the fragment end {frag.end}")
    return pb.Fragment(
        journal=frag.journal, begin=end, end=end, compression_codec=spec.compression_codec
    )


def due_to_roll(
    length: int, first_append_time: float | None, spec: pb.JournalSpec.Fragment, now: float
) -> bool:
    """Whether a fragment holding `length` bytes, first appended to at `first_append_time`,
    is due to roll: longer than the spec's length, or from an earlier flush interval."""
    if spec.length > 0 and length > spec.length:
        return True
    interval = spec.flush_interval.seconds
    return (
        interval > 0
        and first_append_time is not None
        and int(first_append_time // interval) != int(now // interval)
    )


class ReplicatedSpool:
    """The open fragment of one journal on this broker (owned by one pipeline or stream)."""

    def __init__(self, replica: SpoolHost, confirmed: int | None) -> None:
        """Over `replica`'s recovered spools; `confirmed` is the frontier as this broker last
        recorded it (`load_frontier`; None: no record)."""
        self.replica = replica
        self.journal = replica.name
        self.pending: PendingAppend | None = None
        self.delta = 0
        self._running: hashlib._Hash | None = None  # SHA-1 of [begin, end + delta).
        self.confirmed = confirmed
        # Whether the broker's frontier log holds a record of this journal's frontier.
        self._recorded = confirmed is not None
        # The greatest offset this broker, as primary, sent a confirmation for that not
        # every peer acknowledged (-1: none above the frontier): some peer may hold the
        # content up to it as confirmed (see the module docstring). In memory only.
        self.in_doubt = -1
        # Set once the replica stops (`complete`): no write is taken after (`SpoolFinished`).
        self.finished = False
        # A write of content or a commit running on a worker thread, if one is (`settle`).
        self._writing: asyncio.Future[None] | None = None
        spool = replica.spool
        if spool is not None and self.confirmed is not None and spool.end < self.confirmed:
            # The cluster moved past this spool before we stopped: it is complete (and, being
            # below the frontier, confirmed).
            replica.spool = None
            spool.close()
            replica.persist_spool(spool, check_existing=True)
            spool = None
        if spool is not None:
            self.begin, self.end, self.codec = spool.begin, spool.end, spool.codec
            self._sha = spool.running_sha()
        else:
            self.begin = self.end = self.confirmed or 0
            self.codec = pb.NONE
            self._sha = hashlib.sha1()
        if self.confirmed is None:
            self.confirmed = self.end  # No record (a single-node data directory): trust it.
        if spool is not None:
            spool.hold_back(self.confirmed)  # Readers see only what is confirmed.

    # The confirmed frontier.
    def set_confirmed(self, offset: int) -> None:
        """Everything below `offset` is held by every replica of the route (the frontier
        never moves back)."""
        assert self.confirmed is not None
        if self.finished:
            return  # A stale stream's: a new replica of the journal may have recorded its own.
        if offset <= self.confirmed:
            if not self._recorded:
                # A frontier trusted for want of a record (a new journal's 0, say) is
                # recorded once a pipeline confirms it, before anything commits past it:
                # without a record, a restart would trust whatever was committed since.
                self._recorded = True
                self.replica.frontiers.set(self.journal, self.confirmed)
            return
        self._recorded = True
        self.confirmed = offset
        if self.in_doubt <= offset:
            self.in_doubt = -1  # Confirmed everywhere now: in doubt no longer.
        self.replica.frontiers.set(self.journal, offset)  # One write (`frontier_log`).

    def close(self) -> None:
        """Nothing to release: the confirmed-offset file is not held open."""

    @property
    def unconfirmed(self) -> bool:
        assert self.confirmed is not None
        return self.confirmed < self.end

    def note_in_doubt(self, confirm_sent: int, confirmed: int) -> None:
        """A pipeline of ours (as primary) ended having sent confirmations up to
        `confirm_sent`, of which every peer acknowledged those up to `confirmed`: anything
        between may be confirmed on some peer, so no new pipeline cuts below it."""
        assert self.confirmed is not None
        if confirm_sent <= max(confirmed, self.confirmed):
            return
        self.in_doubt = max(self.in_doubt, min(confirm_sent, self.end))

    # Fragments.
    @property
    def registers(self) -> pb.LabelSet:
        return self.replica.registers

    def fragment(self) -> pb.Fragment:
        frag = pb.Fragment(
            journal=self.journal, begin=self.begin, end=self.end, compression_codec=self.codec
        )
        if self.end > self.begin:
            frag.sum.CopyFrom(sha1sum_from_digest(self._sha.digest()))
        return frag

    def next_fragment(self) -> pb.Fragment:
        """The fragment a commit of the content received so far would make."""
        if not self.delta:
            return self.fragment()
        assert self._running is not None
        frag = pb.Fragment(
            journal=self.journal,
            begin=self.begin,
            end=self.end + self.delta,
            compression_codec=self.codec,
        )
        frag.sum.CopyFrom(sha1sum_from_digest(self._running.digest()))
        return frag

    @property
    def first_append_time(self) -> float | None:
        spool = self.replica.spool
        return spool.first_append_time if spool is not None else None

    # Content.
    async def apply_content(self, content: bytes, delta: int) -> None:
        if self.finished:
            raise SpoolFinished(f"the replica of {self.journal} stopped")
        if delta != self.delta:
            raise ReplicationProtocolError(f"invalid ContentDelta ({delta}; expected {self.delta})")
        if not content:
            return
        if self.pending is None:
            spool = self.replica.spool
            if spool is None:
                spool = Spool.create(
                    self.replica.spool_dir,
                    self.journal,
                    self.begin,
                    self.codec,
                    self.registers,
                    sync=self.replica.sync,
                )
                spool.hold_back(self.begin)  # Shown to readers once confirmed.
                self.replica.spool = spool
                self.replica.index.add_local(spool)
            self.pending = spool.start_append()
            self._running = self._sha.copy()
        pending, running = self.pending, self._running
        assert running is not None
        if len(content) >= _THREAD_CHUNK:
            # Over before a cancellation is raised: a write going on after the rollback
            # would land over the next append's bytes (at the same offsets).
            cancelled = await self._in_thread(_write_and_hash, pending, running, content)
            if cancelled is not None:
                raise cancelled
        else:
            _write_and_hash(pending, running, content)
        self.delta += len(content)

    def rollback(self) -> None:
        """Drop uncommitted content (its bytes past the end are overwritten later)."""
        record_rollback(self.delta)
        self.pending = None
        self._running = None
        self.delta = 0

    async def _in_thread(
        self, fn: Callable[..., None], *args: object
    ) -> asyncio.CancelledError | None:
        """`run_to_completion(fn, *args)`, a write to the spool, which a stopping replica
        waits for (`settle`); SpoolFinished if the replica stopped meanwhile."""
        writing = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self._writing = writing
        try:
            cancelled = await wait_to_completion(writing)
        finally:
            if self._writing is writing:
                self._writing = None
        if self.finished and cancelled is None:
            raise SpoolFinished(f"the replica of {self.journal} stopped during a write")
        return cancelled

    async def settle(self) -> None:
        """Wait for a write still running on a worker thread: one that a Replicate stream or
        an append started before the replica's stop gave up waiting for it (a slow disk). A
        cancellation doesn't stop the thread, and a new replica of the journal recovers this
        spool's files: landing after, the write would overwrite what that replica appends."""
        writing = self._writing
        if writing is not None and not writing.done():
            log.warning(
                "stopping replica waits for a spool write still in flight",
                extra={"journal": self.journal},
            )
            await asyncio.wait([writing])

    # Proposals.
    async def apply_proposal(
        self, proposal: pb.Fragment, registers: pb.LabelSet, *, primary: bool
    ) -> pb.ReplicateResponse:
        if self.finished:
            raise SpoolFinished(f"the replica of {self.journal} stopped")
        p = proposal
        if p.end > self.end + self.delta or (p.end == self.end and p.begin == p.end):
            self.rollback()
            if self.replica.spool is not None:
                # The route moves on from our end: content in doubt that we still hold is
                # kept in the closed spool, persisted once confirmed (see the module
                # docstring); until then a next pipeline still won't go back below it. Past
                # our end, some member holds content beyond ours: the content in doubt, if it
                # took our confirmation, or else what the route went on with at those
                # offsets. Either way, ours is cut to the confirmed frontier.
                self._complete_spool(primary=primary, keep_in_doubt=p.end == self.end)
            # Take the proposal's registers, also on an empty roll at our own end (Gazette
            # keeps its own there): registers can differ at an equal end only when this
            # replica cut content its primary never confirmed, and kept the registers that
            # content set; keeping them would fail every later proposal (a livelock).
            self.replica.registers = _copy_labels(registers)
            self.begin = self.end = p.end
            self.codec = p.compression_codec
            self._sha = hashlib.sha1()
            self.replica.index.spool_committed()

        # As `fragments_equal(self.fragment(), p)` and `…(self.next_fragment(), p)`, without
        # building either fragment (and hashing only when the offsets match).
        if p.end == self.end and self._proposes(p, self._sha) and registers == self.registers:
            self.rollback()
            return pb.ReplicateResponse(status=pb.OK)

        if self.delta and p.end == self.end + self.delta and self._proposes(p, self._running):
            await self._commit(registers)
            return pb.ReplicateResponse(status=pb.OK)

        return pb.ReplicateResponse(
            status=pb.PROPOSAL_MISMATCH,
            fragment=self.fragment(),
            registers=_copy_labels(self.registers),
        )

    def _proposes(self, p: pb.Fragment, sha: hashlib._Hash | None) -> bool:
        """`p` is our fragment up to `p.end`, whose SHA-1 is `sha` (an empty one has none)."""
        if p.begin != self.begin or p.journal != self.journal or p.compression_codec != self.codec:
            return False
        s = p.sum
        if p.end == p.begin:
            return s.part1 == 0 and s.part2 == 0 and s.part3 == 0
        if sha is None:
            return False
        part1, part2, part3 = _SHA1_PARTS.unpack(sha.digest())
        return bool(s.part1 == part1 and s.part2 == part2 and s.part3 == part3)

    async def _commit(self, registers: pb.LabelSet) -> None:
        spool, pending, running = self.replica.spool, self.pending, self._running
        assert spool is not None and pending is not None and running is not None
        changed = None if registers == self.registers else _copy_labels(registers)
        cancelled = None
        if spool.sync:
            cancelled = await self._in_thread(spool.commit, pending, changed, running)
        else:
            spool.commit(pending, changed, running)
        self.end = spool.end
        self._sha = running
        self.replica.registers = _copy_labels(registers)
        self.pending, self._running, self.delta = None, None, 0
        # Readers are not woken: they see the commit once it is confirmed (`set_readable`).
        if cancelled is not None:
            raise cancelled  # Committed all the same (and accounted for): unconfirmed.

    # Completion and cuts.
    def _complete_spool(self, *, primary: bool, keep_in_doubt: bool = False) -> None:
        """Cut the open spool to the confirmed frontier (with `keep_in_doubt`, to content in
        doubt, if beyond it), close it and hand it to the persister (a primary's is
        persisted without checking the store first)."""
        if self.replica.spool is None:
            return
        self.cut_unconfirmed(keep_in_doubt=keep_in_doubt)
        spool = self.replica.spool
        if spool is None:
            return
        self.replica.spool = None
        if spool.end == spool.begin:
            self.replica.index.remove_local(spool)
            spool.delete()
            return
        assert self.confirmed is not None
        spool.close()
        if spool.end <= self.confirmed:
            spool.set_readable(spool.end)  # Cut to the frontier: all of it is confirmed.
            self.replica.persist_spool(spool, check_existing=not primary)
        else:
            # It ends in content in doubt, and the route moved on: readers still see only
            # the confirmed frontier of it (the journal's write head stays there), and it is
            # persisted only once the frontier reaches its end (`Replica.hold_closed`).
            self.replica.hold_closed(spool, check_existing=not primary)

    def cut_unconfirmed(self, *, keep_in_doubt: bool = False) -> None:
        """Cut committed content above the confirmed frontier (see the module docstring);
        with `keep_in_doubt`, only above content in doubt (`in_doubt`), which stays held
        back from readers until it is confirmed."""
        assert self.confirmed is not None
        confirmed = self.confirmed
        keep = max(confirmed, self.in_doubt) if keep_in_doubt else confirmed
        if keep >= self.end:
            if not keep_in_doubt:
                self.in_doubt = -1
            return
        self.rollback()
        spool = self.replica.spool
        log.warning(
            "cutting unconfirmed replica content",
            extra={
                "journal": self.journal,
                "confirmed": confirmed,
                "in_doubt": self.in_doubt,
                "kept": keep,
                "end": self.end,
            },
        )
        # Content in doubt that was kept stays in doubt; otherwise none is left.
        if keep <= confirmed:
            self.in_doubt = -1
        if spool is None or keep <= spool.begin:
            if spool is not None:
                # All of its content is cut, and with it the registers its appends set.
                self.replica.registers = _copy_labels(spool.begin_registers)
                self.replica.index.remove_local(spool)
                spool.delete()
                self.replica.spool = None
            self.begin = self.end = max(keep, 0)
            self._sha = hashlib.sha1()
            self.replica.index.spool_committed()
            return
        log_path = spool.log_path
        self.replica.index.remove_local(spool)
        spool.detach()
        try:
            cut, _report = Spool.recover(log_path, sync=self.replica.sync, end_limit=keep)
        except (SpoolCorrupt, OSError, ValueError) as exc:
            log.error(
                "cannot cut spool; dropping it", extra={"journal": self.journal, "error": str(exc)}
            )
            self.replica.spool = None
            self.begin = self.end = keep
            self._sha = hashlib.sha1()
            return
        cut.hold_back(confirmed)  # All of it, unless content in doubt was kept.
        self.replica.spool = cut
        self.replica.index.add_local(cut)
        self.replica.registers = _copy_labels(cut.registers)
        self.begin, self.end, self.codec = cut.begin, cut.end, cut.codec
        self._sha = cut.running_sha()

    def complete(self, *, primary: bool) -> None:
        """Finish the open fragment for good (the replica stops serving the journal; a write
        in flight has ended, `settle`): no write is taken after."""
        self.finished = True
        self.rollback()
        self._complete_spool(primary=primary)
        self.in_doubt = -1
        self.begin = self.end
        self.close()


def load_frontier(host: SpoolHost) -> int | None:
    """The journal's confirmed frontier as this broker last recorded it (None: no record).

    A frontier in the journal's own `confirmed` file (written by earlier versions) is moved
    into the broker's frontier log."""
    recorded = host.frontiers.get(host.name)
    legacy = legacy_frontier(host.spool_dir)
    if legacy is None:
        return recorded
    if recorded is None or legacy > recorded:
        recorded = legacy
        host.frontiers.set(host.name, legacy)
    (host.spool_dir / LEGACY_FILE).unlink(missing_ok=True)
    return recorded


async def run_to_completion(
    fn: Callable[..., None], *args: object
) -> asyncio.CancelledError | None:
    """Run `fn(*args)` on a worker thread and wait until it has finished, even if the caller
    is cancelled meanwhile (the thread would go on regardless: a spool commit lands all the
    same, and whoever tracks the spool's end must know it). Returns the cancellation to
    raise once the caller has taken the result in (None: not cancelled); `fn`'s own error is
    raised."""
    return await wait_to_completion(asyncio.ensure_future(asyncio.to_thread(fn, *args)))


async def wait_to_completion(done: asyncio.Future[None]) -> asyncio.CancelledError | None:
    """`run_to_completion`, of a worker thread's call running as `done`."""
    cancelled = None
    while True:
        try:
            await asyncio.shield(done)
            return cancelled
        except asyncio.CancelledError as exc:
            cancelled = exc
            if done.done():  # It finished as the cancellation came.
                done.result()
                return cancelled


def _write_and_hash(pending: PendingAppend, running: hashlib._Hash, content: bytes) -> None:
    pending.write(content)
    running.update(content)


def _copy_labels(ls: pb.LabelSet) -> pb.LabelSet:
    out = pb.LabelSet()
    out.CopyFrom(ls)
    return out
