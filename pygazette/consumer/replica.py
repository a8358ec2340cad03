"""`ShardReplica`: one shard assigned to this consumer process, from recovery to primary.

A replica is created by the resolver when the allocator assigns the shard here, and
stopped when the assignment goes away. Its life:

1. With a recovery log (`recovery_log_prefix`): fetch the shard's FSM hints and play the log
   into a fresh local directory, reporting BACKFILL; once the player has read through the
   log's write head, STANDBY — and keep tailing the log.
   Without one, a standby just waits (STANDBY).
2. Promoted (its assignment becomes slot 0), once the consumer's lease is surely alive (a
   promotion seen by a process frozen past its lease is stale): inject a hand-off into the
   log under a new author — which reads the log to its write head first (a standby takes
   over only once it is caught up) and takes the log's author register, fencing every
   earlier primary's recorder — then open the store on the played files with a Recorder
   of that author, restore the checkpoint, rotate the verified hints into the backup keys,
   report PRIMARY and run transactions (`transaction.Transactions`), storing recorded
   hints periodically.
3. A failure of the infrastructure under it — the lease uncertain through an etcd restart,
   an in-doubt recovery log append, a fenced log, an unreachable fragment store, a full
   disk (`transient_failure.is_transient`) — abandons the transaction (nothing of it is
   committed), logs and counts the error (`pygazette_shard_recoveries_total`), and after a
   backoff, once the lease is surely alive, recovers the shard again from step 1: the
   checkpoint's ACK intents go out then, as after a process restart. Its assignment's
   status stays what it was (statuses only grow per assignment). Gazette leaves such a
   shard FAILED until an operator unassigns it.
4. Any other failure — the app raising, a message that doesn't decode, a store that can't
   open, a corrupt log — ends the replica with FAILED and the error in its ReplicaStatus;
   nothing of the failed transaction is committed, and other shards are unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pygazette.client.append_service import AppendService
from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import get_journal
from pygazette.consumer.application import Application, maybe_await
from pygazette.consumer.checkpoint import checkpoint_sources
from pygazette.consumer.hints import (
    fetch_hints,
    pick_first_hints,
    store_recorded_hints,
    store_recovered_hints,
)
from pygazette.consumer.journal_specs import JournalSpecs, list_specs
from pygazette.consumer.metrics import RECOVERIES
from pygazette.consumer.progress import Progress
from pygazette.consumer.source_reader import SourceReaders
from pygazette.consumer.store import Store
from pygazette.consumer.transaction import Transactions
from pygazette.consumer.transient_failure import is_transient
from pygazette.keyspace.keyspace import Keyspace, KeyspaceUnavailable, KeyValue
from pygazette.message.framing import Framing, framing_for
from pygazette.message.publisher import Publisher
from pygazette.protocol.labels import label_value
from pygazette.protocol.path_name import path_name
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.shard_validation import recovery_log
from pygazette.protocol.validation import CONTENT_TYPE_LABEL

if TYPE_CHECKING:
    from pygazette.allocator.state import Assignment
    from pygazette.consumer.recoverylog.recorder import Recorder

# Under a consumer's data directory: each shard replica's local store, in a directory of its
# own made afresh as the replica starts (its state is recovered from the shard's log).
SHARDS_DIR = "shards"

log = logging.getLogger(__name__)

__all__ = ["RECOVERY_LOG_CONTENT_TYPE", "SHARDS_DIR", "ConsumerContext", "ShardReplica"]

RECOVERY_LOG_CONTENT_TYPE = "application/x-gazette-recoverylog"
# A replica interrupted by a transient failure recovers again after this backoff (doubling).
RESTART_BACKOFF_FIRST = 0.25
RESTART_BACKOFF_MAX = 10.0
# How long a replica about to recover again waits to learn whether it was deposed.
DEPOSED_CHECK_SECONDS = 5.0
# Messages read ahead of the transaction loop without a spec's read_channel_size, and the
# most sequenced at a time (see SourceReaders).
DEFAULT_READ_AHEAD_MESSAGES = 4096
DEFAULT_BATCH_MESSAGES = 1024
# A failure's message in a status is cut to this many characters (Gazette's MAX_ETCD_ERR_LEN):
# etcd values should be small, and etcd refuses a request past --max-request-bytes.
MAX_ETCD_ERR_LEN = 2048
StatusReporter = Callable[[cpb.ReplicaStatus], Awaitable[None]]


@dataclass(slots=True)
class ConsumerContext:
    """What every replica of a consumer process shares."""

    app: Application
    client: JournalClient
    keyspace: Keyspace
    data_dir: Path
    lease_check: Callable[[], bool] = lambda: True
    hints_interval: float = 5.0
    stop_timeout: float = 10.0
    replicas: dict[str, ShardReplica] = field(default_factory=dict)
    # Source journals' specs, looked up once for all shards (None: one made on the client).
    journal_specs: JournalSpecs | None = None

    def __post_init__(self) -> None:
        if self.journal_specs is None:
            self.journal_specs = JournalSpecs(list_specs(self.client))


class ShardReplica:
    """A shard assigned here (see module doc); also the `Shard` handle apps receive."""

    def __init__(
        self,
        ctx: ConsumerContext,
        spec: cpb.ShardSpec,
        assignment: KeyValue,
        report_status: StatusReporter,
    ) -> None:
        self.ctx = ctx
        self._spec = spec
        self._assignment = assignment
        self._report = report_status
        self._status = cpb.ReplicaStatus(code=cpb.ReplicaStatus.IDLE)
        self._stopping = asyncio.Event()
        self._promoted = asyncio.Event()
        self._serving = asyncio.Event()  # Set once PRIMARY (its store is recovered).
        self._ended = asyncio.Event()  # Set once the replica stopped or failed.
        self._task: asyncio.Task[None] | None = None
        self._recovered_hints: rpb.FSMHints | None = None
        self._local_dir = (
            ctx.data_dir / SHARDS_DIR / f"{path_name(spec.id)}-{assignment.create_revision}"
        ).absolute()
        self.progress_state = Progress()
        # Every source starts read through 0, until its checkpoint or a transaction says
        # more (Gazette's newShard): Stat answers every source, so `gazctl shards list
        # --lag` shows the lag of one not read yet.
        for src in spec.sources:
            self.progress_state.read_through[src.journal] = 0
        self.store: Store | None = None
        self.recorder: Recorder | None = None

    # The Shard handle ---------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._spec.id

    @property
    def spec(self) -> cpb.ShardSpec:
        return self._spec

    @property
    def assignment(self) -> KeyValue:
        return self._assignment

    @property
    def client(self) -> JournalClient:
        return self.ctx.client

    @property
    def stopping(self) -> asyncio.Event:
        return self._stopping

    @property
    def recovery_log(self) -> str:
        return recovery_log(self._spec)

    @property
    def local_dir(self) -> str:
        """The replica's own directory (made at first use for a shard without a log)."""
        self._local_dir.mkdir(parents=True, exist_ok=True)
        return str(self._local_dir)

    def progress(self) -> tuple[dict[str, int], dict[str, int]]:
        return self.progress_state.snapshot()

    # The resolver's handle ----------------------------------------------------------------

    @property
    def status(self) -> cpb.ReplicaStatus:
        return self._status

    @property
    def is_primary(self) -> bool:
        return self._status.code == cpb.ReplicaStatus.PRIMARY

    def update(
        self,
        spec: cpb.ShardSpec,
        assignment: KeyValue,
        slot: int,
        all_assignments: list[Assignment],
    ) -> None:
        self._spec = spec
        self._assignment = assignment
        if slot == 0:
            self._promoted.set()
        if self._task is None:
            self._task = asyncio.create_task(self._serve(), name=f"shard:{spec.id}")

    async def stop(self) -> None:
        self._stopping.set()
        task = self._task
        if task is None or task.done():
            return  # Not started, or stopped already.
        # Time to finish a transaction in flight, unless the lease may have expired: then
        # nothing can commit any more, and the shard stops at once.
        timeout = self.ctx.stop_timeout if self.ctx.lease_check() else 0.0
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        except Exception:
            pass  # Its failure was reported (FAILED status) where it happened.

    async def wait_read_through(
        self, read_through: dict[str, int], within: float | None
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Wait until the primary's store is recovered and its committed progress covers
        `read_through`; ReplicaStopped if the replica stops or fails first, TimeoutError
        after `within` seconds (None: no limit)."""
        from pygazette.consumer.resolver import ReplicaStopped

        async def wait() -> tuple[dict[str, int], dict[str, int]]:
            await self._serving.wait()
            return await self.progress_state.wait_for(read_through, None)

        waiting = asyncio.ensure_future(wait())
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            async with asyncio.timeout(within):
                await asyncio.wait([waiting, ended], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not waiting.done():
                waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            return waiting.result()
        raise ReplicaStopped(f"shard {self.id} stopped ({self._status_name()})")

    def _status_name(self) -> str:
        return cpb.ReplicaStatus.Code.Name(self._status.code)

    def hints(self) -> rpb.FSMHints | None:
        return self._recovered_hints

    # Lifecycle ----------------------------------------------------------------------------

    async def _set_status(self, code: int, error: str = "") -> None:
        status = cpb.ReplicaStatus(code=code)  # type: ignore[arg-type]
        if error:
            if len(error) > MAX_ETCD_ERR_LEN:
                # As Gazette's: whole, a long message was refused by etcd and retried for
                # ever, and the shard never showed FAILED.
                error = error[:MAX_ETCD_ERR_LEN] + " ...[truncated]"
            status.errors.append(error)
        self._status = status
        try:
            await self._report(status)
        except Exception as exc:  # Reported again on the next change; the shard goes on.
            log.warning(
                "cannot report shard status",
                extra={"shard": self.id, "status": status.code, "error": str(exc)},
            )

    async def _until(
        self,
        *events: asyncio.Event,
        task: asyncio.Task[Any] | None = None,
        task_may_end: bool = False,
    ) -> None:
        """Wait until any of `events` is set, or `task` ends (raising its failure; and an
        error if it wasn't expected to end)."""
        waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(e.wait()) for e in events}
        if task is not None:
            waits.add(task)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                if w is not task:
                    w.cancel()
        if task is not None and task.done():
            task.result()  # Raises the player's failure.
            if not task_may_end and not any(e.is_set() for e in events):
                raise RuntimeError("recovery log playback ended unexpectedly")

    async def _serve(self) -> None:
        attempt = 0
        try:
            while True:
                try:
                    served = self.progress_state.transactions
                    await self._serve_replica()
                    return
                except asyncio.CancelledError as cancelled:
                    current = asyncio.current_task()
                    if current is None or current.cancelling():
                        raise  # The replica's task was cancelled (`stop`).
                    # Raised by the application (awaiting a future something else
                    # cancelled), not a cancellation of the shard: its failure.
                    exc: BaseException = cancelled
                except Exception as failure:
                    exc = failure
                if self._stopping.is_set():
                    log.info("shard stopped", extra={"shard": self.id, "error": str(exc)})
                    return
                error = f"{type(exc).__name__}: {exc}"
                if not is_transient(exc):
                    log.error(
                        "shard failed",
                        extra={"shard": self.id, "error": f"{exc!r}"},
                        exc_info=exc,
                    )
                    await self._set_status(cpb.ReplicaStatus.FAILED, error)
                    return
                log.warning(
                    "shard interrupted (will recover it again)",
                    extra={"shard": self.id, "error": f"{exc!r}", "attempt": attempt},
                )
                RECOVERIES.labels(self.id).inc()
                if self.progress_state.transactions > served:
                    attempt = 0  # It recovered and committed since: back off afresh.
                self._release_store()
                self._serving.clear()
                # Recovering again. Its assignment keeps the status it reached (statuses only
                # grow, as Gazette reduces them, and only FAILED carries errors): the error
                # is logged and counted instead.
                await self._set_status(cpb.ReplicaStatus.BACKFILL)
                if not await self._wait_to_restart(attempt):
                    return  # Stopped meanwhile.
                attempt += 1
        finally:
            self._ended.set()
            self._release_store()
            if self._local_dir.exists():
                shutil.rmtree(self._local_dir, ignore_errors=True)

    def _release_store(self) -> None:
        store, self.store, self.recorder = self.store, None, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.destroy()

    async def _wait_to_restart(self, attempt: int) -> bool:
        """Back off before recovering the shard again, then wait until the consumer's lease
        is surely alive (a replica that may have lost it must not take the recovery log).
        False if the replica was stopped meanwhile."""
        delay = min(RESTART_BACKOFF_MAX, RESTART_BACKOFF_FIRST * (2 ** min(attempt, 16)))
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
            if self._stopping.is_set():
                return False
            if self.ctx.lease_check():
                await self._catch_up_if_deposed()
                return not self._stopping.is_set()
            delay = RESTART_BACKOFF_FIRST  # Keep-alives renew the lease within a second.

    async def _catch_up_if_deposed(self) -> None:
        """Before recovering again: if etcd no longer holds this replica's assignment as it
        was (deleted, or re-created), this process's view of the keyspace lags behind a
        hand-off (a newer primary fenced the log: the failure being recovered from). Wait,
        bounded, until the view shows it, so the resolver stops this replica: else it would
        take the log back and fence its successor in turn (Gazette fails such a shard
        instead). The recovery log's fencing keeps either outcome correct."""
        ks = self.ctx.keyspace
        get_remote = getattr(ks, "get_remote", None)
        if get_remote is None:
            return  # The embedded keyspace is the store itself: its view never lags.
        key, ours = self._assignment.key, self._assignment.create_revision

        def seen(remote: KeyValue | None) -> bool:
            local = ks.get(key)
            if remote is None:
                return local is None
            return local is not None and local.create_revision == remote.create_revision

        try:
            async with asyncio.timeout(DEPOSED_CHECK_SECONDS):
                remote: KeyValue | None = await get_remote(key)
                if remote is not None and remote.create_revision == ours:
                    return  # Still this replica's.
                await ks.wait_until(lambda: seen(remote))
        except (KeyspaceUnavailable, TimeoutError):
            return  # Unknown: recover anyway.
        await asyncio.sleep(0)  # A stop the resolver just began sets `_stopping` first.

    async def _serve_replica(self) -> None:
        ctx = self.ctx
        if self._local_dir.exists():
            shutil.rmtree(self._local_dir, ignore_errors=True)
        log_name = self.recovery_log
        if log_name:
            self._local_dir.mkdir(parents=True)
            self.recorder = await self._recover(log_name)
            if self.recorder is None:
                return  # Stopped.
        else:
            if not self._promoted.is_set():
                await self._set_status(cpb.ReplicaStatus.STANDBY)
                await self._until(self._promoted, self._stopping)
            if self._stopping.is_set():
                return
        store = await maybe_await(ctx.app.new_store(self, self.recorder))
        self.store = store
        cp = await store.restore_checkpoint(self)
        offsets, states = checkpoint_sources(cp)
        await self.progress_state.advance(offsets, {})
        if self.recorder is not None:
            await self._store_recovered_hints(self.recorder.build_hints())
        await self._set_status(cpb.ReplicaStatus.PRIMARY)
        self._serving.set()
        log.info("shard is primary", extra={"shard": self.id, "log": log_name})
        await self._run_primary(store, cp, offsets, states)

    async def _store_recovered_hints(self, hints: rpb.FSMHints) -> None:
        """Rotate the hints of the recovered store into the backup keys while this replica's
        assignment holds, retrying a lost race (a concurrent rotation, or a status update of
        the assignment) as Gazette does. A replica deposed meanwhile leaves them alone: its
        successor's may be newer (and the resolver stops it)."""
        attempt = 0
        while not self._stopping.is_set():
            stored = await store_recovered_hints(
                self.ctx.keyspace, self._spec, hints, self._assignment
            )
            if stored:
                return
            if stored is None:
                log.warning(
                    "not storing recovered hints: the shard's assignment is gone",
                    extra={"shard": self.id, "assignment": self._assignment.key},
                )
                return
            delay = min(RESTART_BACKOFF_MAX, RESTART_BACKOFF_FIRST * (2 ** min(attempt, 16)))
            attempt += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()

    async def _recover(self, log_name: str) -> Recorder | None:
        from pygazette.consumer.recoverylog import Author, Player, Recorder

        ctx = self.ctx
        spec = await get_journal(ctx.client, log_name)
        content_type = label_value(spec.labels, CONTENT_TYPE_LABEL)
        if content_type != RECOVERY_LOG_CONTENT_TYPE:
            raise ValueError(
                f"recovery log {log_name} must be labeled {CONTENT_TYPE_LABEL}="
                f"{RECOVERY_LOG_CONTENT_TYPE} (it is {content_type!r})"
            )
        fetched = await fetch_hints(ctx.keyspace, self._spec)
        for key, _kv, stored in fetched:
            if stored is not None and stored.log != log_name:
                # As Gazette: hints of another log say nothing of this one (the spec moved to
                # a new log, or hints were written by hand); playing them would record into
                # the wrong log.
                raise ValueError(
                    f"hints.Log {stored.log} != ShardSpec.RecoveryLog {log_name} (at {key})"
                )
        hints = pick_first_hints(fetched, log_name)
        self._recovered_hints = hints
        player = Player(ctx.client, hints, self._local_dir)
        play = asyncio.create_task(player.play(), name=f"play:{log_name}")
        try:
            await self._set_status(cpb.ReplicaStatus.BACKFILL)
            await self._until(player.tailing, self._promoted, self._stopping, task=play)
            if player.tailing.is_set() and not self._promoted.is_set():
                await self._set_status(cpb.ReplicaStatus.STANDBY)
                await self._until(self._promoted, self._stopping, task=play)
            if self._stopping.is_set():
                return None
            if not await self._lease_before_handoff(play):
                return None
            author = Author.random()
            began = time.monotonic()
            player.inject_handoff(author)
            await self._until(self._stopping, task=play, task_may_end=True)
            if self._stopping.is_set() and not play.done():
                return None
            log.info(
                "recovered shard store from its log",
                extra={
                    "shard": self.id,
                    "log": log_name,
                    "handoff_seconds": round(time.monotonic() - began, 3),
                },
            )
            fsm = play.result()
            return Recorder(ctx.client, fsm, author, self._local_dir)
        finally:
            if not play.done():
                play.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await play

    async def _lease_before_handoff(self, play: asyncio.Task[Any]) -> bool:
        """Wait until the consumer's lease is surely alive before taking the log (False if
        stopped first). A promotion seen while it may have expired (the process frozen past
        its lease, its watch then delivering what happened before the lease lapsed) is stale:
        handing the log off then would fence the primary that took over meanwhile. The
        player keeps tailing while this waits."""
        if self.ctx.lease_check():
            return True
        log.warning(
            "promoted while the consumer's lease may have expired: waiting for it before "
            "taking the recovery log",
            extra={"shard": self.id},
        )
        while not self.ctx.lease_check():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESTART_BACKOFF_FIRST):
                    await self._until(self._stopping, task=play)
            if self._stopping.is_set():
                return False
        return True

    async def _framing(self, journal: str) -> Framing | None:
        new_framing = getattr(self.ctx.app, "new_framing", None)
        assert self.ctx.journal_specs is not None
        spec = await self.ctx.journal_specs.get(journal)
        if new_framing is not None:
            framing: Framing | None = await maybe_await(new_framing(spec))
            if framing is not None:
                return framing
        return framing_for(label_value(spec.labels, CONTENT_TYPE_LABEL))

    async def _run_primary(
        self,
        store: Store,
        cp: cpb.Checkpoint,
        offsets: dict[str, int],
        states: dict[str, Any],
    ) -> None:
        ctx, spec = self.ctx, self._spec
        framings = {src.journal: await self._framing(src.journal) for src in spec.sources}
        # The spec's read_channel_size bounds the messages read ahead of the transaction
        # (Gazette's read channel), e.g. to bound memory when messages are large.
        queued = spec.read_channel_size or DEFAULT_READ_AHEAD_MESSAGES
        readers = SourceReaders(
            ctx.client,
            spec.sources,
            offsets,
            states,
            framings,
            ring_size=spec.ring_buffer_size or 4096,
            queue_messages=queued,
            batch_messages=min(DEFAULT_BATCH_MESSAGES, queued),
        )
        service = AppendService(ctx.client)
        publisher = Publisher(service)
        txns = Transactions(
            self,
            ctx.app,
            store,
            service,
            publisher,
            readers,
            self.progress_state,
            lease_check=ctx.lease_check,
        )
        hints_task = (
            asyncio.create_task(self._store_hints_periodically(), name=f"hints:{self.id}")
            if self.recorder is not None
            else None
        )
        readers.start()
        try:
            await txns.run(cp)
        finally:
            if hints_task is not None:
                hints_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await hints_task
            await readers.close()
            await service.close(cancel=True)

    async def _store_hints_periodically(self) -> None:
        recorder = self.recorder
        assert recorder is not None
        stored: rpb.FSMHints | None = None  # The hints this task last stored.
        while True:
            await asyncio.sleep(self.ctx.hints_interval)
            try:
                hints = recorder.build_hints()
                if hints == stored:
                    continue  # Unchanged: an idle shard leaves the keyspace quiet.
                if await store_recorded_hints(
                    self.ctx.keyspace, self._spec, hints, self._assignment
                ):
                    stored = hints
            except Exception as exc:
                log.warning(
                    "cannot store recorded hints (will retry)",
                    extra={"shard": self.id, "error": str(exc)},
                )
