"""`pygazette shards ...`: list, apply, edit, unassign, prune and recover consumer shards,
shaped like Gazette's `gazctl shards` commands.

The commands talk to a consumer process (`--consumer`, $CONSUMER_ADDRESS) over the
`consumer.Shard` service, and to a broker (`--broker`, $BROKER_ADDRESS) where journals are
involved: apply and edit check the journals that shards reference, list --lag reads write
heads, prune lists recovery-log fragments, recover plays a recovery log. Expected failures
are raised as `click.ClickException` or pygazette errors, which `main` prints as one line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import grpc
import grpc.aio

from pygazette.cli import output
from pygazette.cli.client_settings import CliState, client_settings
from pygazette.cli.journals_cmd import (
    ApplyProgress,
    CommandError,
    _broker,
    _read_text,
    broker_option,
    column_options,
    max_txn_size_option,
)
from pygazette.cli.progress import progress_display
from pygazette.cli.shardspace import (
    ShardSet,
    apply_request,
    dump_shardspace,
    from_list,
    parse_shardspace,
)
from pygazette.cli.spec_editor import PartlyApplied, edit_retry_loop
from pygazette.client.channel import channel_target
from pygazette.client.errors import ProtocolViolation
from pygazette.client.fragments import list_all_fragments
from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import get_journal
from pygazette.client.reader import Reader
from pygazette.client.store_health import fragment_store_health
from pygazette.consumer.shard_client import (
    DEFAULT_CONSUMER,
    ShardError,
    ShardEtcdTransactionFailed,
    shard_status_name,
)
from pygazette.protocol.errors import GazetteError, OffsetNotYetAvailable
from pygazette.protocol.fragment_name import fragment_content_path, fragment_location
from pygazette.protocol.labels import label_value, label_values
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rlpb
from pygazette.protocol.selector import parse_selector
from pygazette.protocol.shard_validation import (
    recovery_log,
    reduce_replica_status,
    validate_shard_apply_request,
)
from pygazette.protocol.validation import CONTENT_TYPE_LABEL

if TYPE_CHECKING:
    # Imported by the subcommands that use them (`prune`, `recover`): `shards list` and
    # `shards apply` load neither recovery logs nor fragment stores.
    from pygazette.consumer.recoverylog.segments import Segment
    from pygazette.stores.store import StoreRegistry

log = logging.getLogger(__name__)

T = TypeVar("T")

CONSUMER_ADDRESS_ENV = "CONSUMER_ADDRESS"
RECOVERY_LOG_CONTENT_TYPE = "application/x-gazette-recoverylog"
# Shards per Unassign RPC, as gazctl.
UNASSIGN_BATCH = 100
# Deadline of each Shard RPC: a consumer that cannot answer is reported, not waited on.
RPC_TIMEOUT = 60.0
# Editors, in order of preference, as gazctl.
NONE = output.NONE


@dataclass
class ShardsState(CliState):
    """Options of the root and `shards` commands that subcommands use."""

    consumer: str = DEFAULT_CONSUMER


def consumer_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--consumer",
        default=None,
        metavar="URL",
        help=f"Consumer to talk to [default: the shards --consumer, ${CONSUMER_ADDRESS_ENV}, "
        f"or {DEFAULT_CONSUMER}].",
    )(fn)


def _consumer(ctx: click.Context, override: str | None) -> str:
    if override:
        return override
    state = ctx.find_object(ShardsState)
    return state.consumer if state is not None else DEFAULT_CONSUMER


@click.group("shards")
@click.option(
    "--consumer",
    "--consumer.address",
    "consumer",
    envvar=CONSUMER_ADDRESS_ENV,
    default=DEFAULT_CONSUMER,
    show_default=True,
    metavar="URL",
    help=f"Consumer address (also ${CONSUMER_ADDRESS_ENV}).",
)
@click.pass_context
def shards(ctx: click.Context, consumer: str) -> None:
    """Interact with consumer shards."""
    root = ctx.find_object(CliState)
    ctx.obj = ShardsState(broker=(root or CliState()).broker, consumer=consumer)


# Talking to a consumer -------------------------------------------------------------------


def _rpc_error(exc: grpc.aio.AioRpcError, what: str, address: str) -> CommandError:
    details = " ".join((exc.details() or "").split())
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        details = client_settings().unavailable(address, details, consumer=what == "consumer")
        return CommandError(f"{what} unavailable at {address}: {details}")
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        details = client_settings().unimplemented(address, details, consumer=what == "consumer")
    return CommandError(f"{what} at {address}: {exc.code().name}: {details}")


def _status_error(status: int, doing: str) -> CommandError:
    return CommandError(f"{shard_status_name(status)}: {doing}")


class ShardService:
    """The `consumer.Shard` RPCs of one consumer process (a `ShardClient`). Statuses other
    than OK raise `ShardError`s; transport failures and protocol violations raise one-line
    `CommandError`s naming the consumer."""

    def __init__(self, address: str) -> None:
        try:
            channel_target(address)
        except ValueError as exc:
            raise CommandError(f"invalid consumer address: {exc}") from None
        self.address = address
        self.client = client_settings().shard_client(address)

    async def close(self) -> None:
        await self.client.close()

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc, "consumer", self.address) from None
        except ProtocolViolation as exc:
            raise CommandError(f"consumer at {self.address}: {exc}") from None

    async def list_shards(self, selector: pb.LabelSelector) -> cpb.ListResponse:
        return await self._call(self.client.list_all(selector, within=RPC_TIMEOUT))

    async def apply(self, request: cpb.ApplyRequest, max_txn_size: int = 0) -> cpb.ApplyResponse:
        """Apply the changes in transactions of `max_txn_size` (0: one transaction). If a batch
        fails, earlier batches stay applied (as Gazette's ApplyShardsInBatches)."""
        changes = list(request.changes)
        applied = 0  # Changes of the batches applied so far.
        report = ApplyProgress("shard")

        def progress(done: int, total: int) -> None:
            nonlocal applied
            applied = done
            report(done, total)

        try:
            if max_txn_size > 0 and len(changes) > max_txn_size:
                resp = await self._call(
                    self.client.apply_in_batches(
                        changes, max_txn_size, within=RPC_TIMEOUT, progress=progress
                    )
                )
                assert resp is not None
                return resp
            return await self._call(self.client.apply(changes, within=RPC_TIMEOUT))
        except ShardEtcdTransactionFailed as exc:
            text = (
                f"{exc}: a shard's revision no longer matches (it changed since it was read, "
                "or a shard to create exists); list the shards again, or use revision: -1"
            )
            if applied:  # PartlyApplied: an edit is not reopened as if nothing applied.
                raise PartlyApplied(text + _stay_applied(applied)) from None
            raise CommandError(text) from None
        except (CommandError, GazetteError) as exc:
            # A later batch failed: the earlier ones are applied, and must be said to be.
            if not applied:
                raise
            text = exc.format_message() if isinstance(exc, CommandError) else str(exc)
            raise PartlyApplied(text + _stay_applied(applied)) from exc

    async def stat(self, shard: str) -> cpb.StatResponse:
        return await self._call(self.client.stat(shard, within=RPC_TIMEOUT))

    async def get_hints(self, shard: str) -> cpb.GetHintsResponse:
        return await self._call(self.client.get_hints(shard, within=RPC_TIMEOUT))

    async def unassign(
        self, shard_ids: Sequence[str], *, only_failed: bool, dry_run: bool
    ) -> list[str]:
        return await self._call(
            self.client.unassign(
                shard_ids, only_failed=only_failed, dry_run=dry_run, within=RPC_TIMEOUT
            )
        )


def _stay_applied(applied: int) -> str:
    """What to add to the error of a failed batch of an apply after `applied` changes."""
    return f" (the {applied} change(s) before it stay applied)" if applied else ""


class Session:
    """A consumer connection, and a broker connection opened on first use."""

    def __init__(self, consumer: str, broker: str) -> None:
        self.shards = ShardService(consumer)
        self.broker = broker
        self._journals: JournalClient | None = None

    @property
    def journals(self) -> JournalClient:
        if self._journals is None:
            try:
                channel_target(self.broker)
            except ValueError as exc:
                raise CommandError(f"invalid broker address: {exc}") from None
            self._journals = client_settings().journal_client(self.broker)
        return self._journals

    async def close(self) -> None:
        await self.shards.close()
        if self._journals is not None:
            await self._journals.close()


def run_session(
    ctx: click.Context,
    consumer: str | None,
    broker: str | None,
    fn: Callable[[Session], Awaitable[T]],
) -> T:
    """Run `fn` on a new event loop with a Session; broker RPC failures become one line."""
    consumer_address = _consumer(ctx, consumer)
    broker_address = _broker(ctx, broker)

    async def run() -> T:
        session = Session(consumer_address, broker_address)
        try:
            return await fn(session)
        finally:
            await session.close()

    try:
        return asyncio.run(run())
    except grpc.aio.AioRpcError as exc:  # Shard RPC failures are CommandErrors already.
        raise _rpc_error(exc, "broker", broker_address) from None


def _selector(text: str) -> pb.LabelSelector:
    return parse_selector(text)  # ValidationError is reported by main.


async def _list_matching(
    session: Session, sel: pb.LabelSelector, text: str
) -> list[cpb.ListResponse.Shard]:
    """The shards a selector matches; an error if it matches none."""
    resp = await session.shards.list_shards(sel)
    if not resp.shards:
        ids = label_values(sel.include, "id")
        if len(ids) == 1:
            raise _status_error(cpb.SHARD_NOT_FOUND, f"no shard {ids[0]!r}")
        raise CommandError(f"no shard matches selector {text!r}")
    return list(resp.shards)


# apply -----------------------------------------------------------------------------------


async def verify_referenced_journals(client: JournalClient, request: cpb.ApplyRequest) -> None:
    """Gazette's VerifyReferencedJournals: each upserted shard's sources exist with a message
    framing content-type, and its recovery log exists labeled as a recovery log."""
    from pygazette.message.framing import UnknownContentType, framing_for

    cache: dict[str, pb.JournalSpec] = {}

    async def lookup(name: str, shard: str, what: str) -> pb.JournalSpec:
        spec = cache.get(name)
        if spec is None:
            try:
                spec = cache[name] = await get_journal(client, name)
            except GazetteError as exc:
                raise CommandError(f"shard {shard!r}: {what} {name!r}: {exc}") from None
        return spec

    for change in request.changes:
        if not change.HasField("upsert"):
            continue
        shard = change.upsert
        for source in shard.sources:
            spec = await lookup(source.journal, shard.id, "source journal")
            try:
                framing_for(label_value(spec.labels, CONTENT_TYPE_LABEL))
            except UnknownContentType as exc:
                raise CommandError(
                    f"shard {shard.id!r}: source journal {source.journal!r}: {exc}"
                ) from None
        log_name = recovery_log(shard)
        if log_name:
            spec = await lookup(log_name, shard.id, "recovery log")
            ct = label_value(spec.labels, CONTENT_TYPE_LABEL)
            if ct != RECOVERY_LOG_CONTENT_TYPE:
                raise CommandError(
                    f"shard {shard.id!r}: expected recovery log {log_name!r} to have "
                    f"{CONTENT_TYPE_LABEL} {RECOVERY_LOG_CONTENT_TYPE} but it has "
                    f"{ct or '(none)'!r}"
                )


def _checked_request(shard_set: ShardSet) -> cpb.ApplyRequest:
    request = apply_request(shard_set)
    validate_shard_apply_request(request)
    return request


@shards.command("apply")
@click.option(
    "--specs",
    "specs_path",
    default="-",
    show_default=True,
    metavar="FILE",
    help="Shardspace YAML to apply ('-' reads stdin, as gazctl's default).",
)
@click.option("--dry-run", is_flag=True, help="Print the changes instead of applying them.")
@max_txn_size_option
@consumer_option
@broker_option
@click.pass_context
def apply_cmd(
    ctx: click.Context,
    specs_path: str,
    dry_run: bool,
    max_txn_size: int,
    consumer: str | None,
    broker: str | None,
) -> None:
    """Apply shard creations, updates and deletions from a shardspace YAML file.

    The YAML is what "shards list --format yaml" prints: "common" values that each shard of
    "shards" inherits unless it sets its own. A shard's "revision" must match its current
    revision (0 or none creates it, -1 applies regardless); "delete: true" deletes it. The
    journals that shards read and record to must exist (checked on the broker), and nothing
    is applied unless every spec is valid.
    """
    request = _checked_request(parse_shardspace(_read_text(specs_path)))

    async def run(session: Session) -> cpb.ApplyResponse | None:
        await verify_referenced_journals(session.journals, request)
        if dry_run:
            return None
        return await session.shards.apply(request, max_txn_size)

    resp = run_session(ctx, consumer, broker, run)
    if resp is None:
        click.echo(output.listing_proto_text(request), nl=False)
        return
    log.info("successfully applied", extra={"revision": resp.header.etcd.revision})
    click.echo(
        f"applied {len(request.changes)} shard change(s) at revision {resp.header.etcd.revision}"
    )


# list ------------------------------------------------------------------------------------


def _route_cells(shard: cpb.ListResponse.Shard) -> tuple[str, str, cpb.ReplicaStatus]:
    """(primary, replicas, reduced status): members as "suffix:CODE", as gazctl shows them."""
    primary = NONE
    replicas: list[str] = []
    status = cpb.ReplicaStatus()
    for i, member in enumerate(shard.route.members):
        code = shard.status[i] if i < len(shard.status) else cpb.ReplicaStatus()
        reduce_replica_status(status, code)
        cell = f"{member.suffix or member.zone or '?'}:{cpb.ReplicaStatus.Code.Name(code.code)}"
        if i == shard.route.primary:
            primary = cell
        else:
            replicas.append(cell)
    return primary, ",".join(replicas), status


def shards_table(
    listed: Sequence[cpb.ListResponse.Shard],
    *,
    rf: bool,
    primary: bool,
    replicas: bool,
    label_columns: Sequence[str],
    lags: dict[str, str] | None,
) -> str:
    headers = ["ID", "STATUS"]
    if rf:
        headers.append("RF")
    if primary:
        headers.append("PRIMARY")
    if replicas:
        headers.append("REPLICAS")
    headers.extend(label.upper() for label in label_columns)
    if lags is not None:
        headers.append("LAG")
    rows = []
    for shard in listed:
        primary_cell, replicas_cell, status = _route_cells(shard)
        row = [shard.spec.id, cpb.ReplicaStatus.Code.Name(status.code)]
        if rf:
            row.append("0" if shard.spec.disable else str(shard.spec.hot_standbys + 1))
        if primary:
            row.append(primary_cell)
        if replicas:
            row.append(replicas_cell or NONE)
        row.extend(output.label_cells(shard.spec.labels, label_columns))
        if lags is not None:
            row.append(lags.get(shard.spec.id, NONE) or NONE)
        rows.append(row)
    return output.render_table(headers, rows)


async def write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head, from a non-blocking read at offset -1."""
    reader = Reader(client, journal, offset=-1, block=False, metadata_only=True)
    try:
        try:
            await reader.read()
        except OffsetNotYetAvailable:
            pass
        return reader.write_head
    finally:
        await reader.aclose()


async def shard_lag(session: Session, shard: str) -> str:
    """ "journal:unread bytes" of each source the shard has read through, as gazctl --lag."""
    try:
        stat = await session.shards.stat(shard)
    except ShardError as exc:  # E.g. NO_SHARD_PRIMARY: say so in the shard's row.
        return f"({exc.status_name})"
    parts = []
    for journal, offset in sorted(stat.read_through.items()):
        head = await write_head(session.journals, journal)
        parts.append(f"{journal}:{head - offset}")
    return ", ".join(parts)


def shards_yaml(listed: Sequence[cpb.ListResponse.Shard]) -> str:
    """The listing as a hoisted shardspace, which `shards apply` accepts back."""
    return dump_shardspace(from_list(listed))


@shards.command("list")
@click.option("-l", "--selector", default="", help='Label selector, e.g. "app=counter" or "id=s1".')
@click.option(
    "-o",
    "--format",
    "fmt",
    type=click.Choice(["table", "yaml", "json", "proto"]),
    default="table",
    show_default=True,
    help="yaml is the shardspace that 'shards apply' accepts.",
)
@column_options
@click.option(
    "--lag",
    is_flag=True,
    help="Show the unread bytes of each source (a Stat per shard and a read per journal).",
)
@consumer_option
@broker_option
@click.pass_context
def list_cmd(
    ctx: click.Context,
    selector: str,
    fmt: str,
    label_columns: tuple[str, ...],
    primary: bool,
    replicas: bool,
    rf: bool,
    lag: bool,
    consumer: str | None,
    broker: str | None,
) -> None:
    """List shards matching a label selector, with their status.

    Shard selectors also match the meta-label "id", e.g. -l "id in (shard-1, shard-2)".
    The STATUS column is the most severe replica status (IDLE < BACKFILL < STANDBY <
    PRIMARY < FAILED); PRIMARY and REPLICAS show each assigned consumer as "suffix:STATUS".
    """
    sel = _selector(selector)

    async def run(session: Session) -> tuple[cpb.ListResponse, dict[str, str] | None]:
        listing = await session.shards.list_shards(sel)
        if not (lag and fmt == "table"):
            return listing, None
        lags: dict[str, str] = {}
        with progress_display("fetching lag") as update:
            update(total=len(listing.shards))
            for shard in listing.shards:
                lags[shard.spec.id] = await shard_lag(session, shard.spec.id)
                update(advance=1)
        return listing, lags

    listing, lags = run_session(ctx, consumer, broker, run)
    if fmt == "table":
        click.echo(
            shards_table(
                listing.shards,
                rf=rf,
                primary=primary,
                replicas=replicas,
                label_columns=label_columns,
                lags=lags,
            ),
            nl=False,
        )
    elif fmt == "yaml":
        click.echo(shards_yaml(listing.shards), nl=False)
    elif fmt == "json":
        click.echo(output.listing_json(listing), nl=False)
    else:
        click.echo(output.listing_proto_text(listing), nl=False)


# edit ------------------------------------------------------------------------------------


@shards.command("edit")
@click.option("-l", "--selector", required=True, help="Label selector of shards to edit.")
@max_txn_size_option
@consumer_option
@broker_option
@click.pass_context
def edit_cmd(
    ctx: click.Context,
    selector: str,
    max_txn_size: int,
    consumer: str | None,
    broker: str | None,
) -> None:
    """Edit the selected shards' specs in an editor, and apply the result.

    The editor is $GAZ_EDITOR, else $EDITOR, else vi. The shardspace YAML of the selected
    shards is opened; when the editor exits with changes they are validated and applied. If
    that fails (an invalid spec, a missing journal, or a shard changed meanwhile so that its
    revision no longer matches), the editor reopens with the error, keeping your edits. An
    empty or unchanged file cancels the edit.
    """
    sel = _selector(selector)
    applied_revision: list[int] = []

    async def run(session: Session) -> bool:
        loop = asyncio.get_running_loop()

        def call(coro: Coroutine[Any, Any, T]) -> T:
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        async def verify_and_apply(request: cpb.ApplyRequest) -> cpb.ApplyResponse:
            try:
                await verify_referenced_journals(session.journals, request)
            except CommandError as exc:
                raise CommandError(f"verifying referenced journals: {exc.message}") from None
            return await session.shards.apply(request, max_txn_size)

        def select() -> str:
            listed = call(_list_matching(session, sel, selector))
            return shards_yaml(listed)

        def apply(text: str) -> None:
            request = _checked_request(parse_shardspace(text))
            resp = call(verify_and_apply(request))
            applied_revision.append(resp.header.etcd.revision)

        # The editor and the loop block: run them off the event loop, which serves the RPCs.
        return await asyncio.to_thread(
            edit_retry_loop, select, apply, prefix="pygazette-shards-edit-"
        )

    if run_session(ctx, consumer, broker, run):
        click.echo(f"applied shard changes at revision {applied_revision[-1]}")


# unassign --------------------------------------------------------------------------------


def _is_failed(shard: cpb.ListResponse.Shard) -> bool:
    return any(s.code == cpb.ReplicaStatus.FAILED for s in shard.status)


@shards.command("unassign")
@click.option("-l", "--selector", required=True, help="Label selector of shards to unassign.")
@click.option("--failed", is_flag=True, help="Only remove assignments of failed shards.")
@click.option("--dry-run", is_flag=True, help="Print the shards that would be unassigned.")
@consumer_option
@click.pass_context
def unassign_cmd(
    ctx: click.Context, selector: str, failed: bool, dry_run: bool, consumer: str | None
) -> None:
    """Remove the selected shards' assignments, so the allocator soon reassigns them.

    This restarts a failed shard (with --failed: only shards with a FAILED replica), or
    moves a shard off an overloaded consumer.
    """
    sel = _selector(selector)

    async def run(session: Session) -> tuple[list[cpb.ListResponse.Shard], list[str]]:
        listing = await session.shards.list_shards(sel)
        candidates = [s for s in listing.shards if not failed or _is_failed(s)]
        ids = [s.spec.id for s in candidates]
        done: list[str] = []
        for start in range(0, len(ids), UNASSIGN_BATCH):
            done.extend(
                await session.shards.unassign(
                    ids[start : start + UNASSIGN_BATCH], only_failed=failed, dry_run=dry_run
                )
            )
        return list(listing.shards), done

    listed, done = run_session(ctx, consumer, None, run)
    by_id = {s.spec.id: s for s in listed}
    rows = []
    for shard_id in done:
        shard = by_id.get(shard_id)
        if shard is None:
            rows.append([shard_id, NONE, NONE, NONE])
            continue
        primary_cell, replicas_cell, status = _route_cells(shard)
        rows.append(
            [
                shard_id,
                cpb.ReplicaStatus.Code.Name(status.code),
                primary_cell,
                replicas_cell or NONE,
            ]
        )
    if rows:
        click.echo(
            output.render_table(["ID", "PREVIOUS STATUS", "PRIMARY", "REPLICAS"], rows), nl=False
        )
    verb = "would unassign" if dry_run else "unassigned"
    click.echo(f"{verb} {len(done)} shard(s)")


# prune -----------------------------------------------------------------------------------


@dataclass
class PruneReport:
    """What `prune` found and did; counters as gazctl's shardsPruneMetrics."""

    shards_total: int = 0
    fragments_total: int = 0
    fragments_pruned: int = 0
    bytes_total: int = 0
    bytes_pruned: int = 0
    skipped_journals: int = 0
    skipped_logs: int = 0
    pruned: list[pb.Fragment] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def live_segments(hints: rlpb.FSMHints) -> list[Segment]:
    """The hinted live segments (Gazette's FSMHints.LiveLogSegments), with the LastOffset of
    the final one zeroed: playback reads on past it, so it overlaps every later fragment."""
    from pygazette.consumer.recoverylog.fsm import live_log_segments

    try:
        _, segment_set = live_log_segments(hints)
    except ValueError as exc:
        raise CommandError(f"invalid hints of recovery log {hints.log!r}: {exc}") from None
    segments = list(segment_set)
    if segments:
        segments[-1] = dataclasses.replace(segments[-1], last_offset=0)
    return segments


def overlaps_any_segment(segments: Sequence[Segment], fragment: pb.Fragment) -> bool:
    """Whether a fragment holds bytes of a live segment (gazctl's overlapsAnySegment)."""
    if not segments:
        return True
    return any(
        (seg.first_offset < fragment.end or fragment.end == 0)
        and (seg.last_offset > fragment.begin or seg.last_offset == 0)
        for seg in segments
    )


async def _unhealthy_store(client: JournalClient, journal: str) -> str | None:
    """Why the recovery log must be skipped: its spec cannot be fetched, or one of its
    fragment stores is not healthy (a prune must not hang on, or misread, a broken store)."""
    try:
        spec = await get_journal(client, journal)
    except GazetteError as exc:
        return f"cannot fetch its spec: {exc}"
    except grpc.aio.AioRpcError as exc:
        return f"cannot fetch its spec: {exc.code().name}: {exc.details()}"
    for store in spec.fragment.stores:
        try:
            resp = await fragment_store_health(client, store)
        except grpc.aio.AioRpcError as exc:
            return f"health check of store {store} failed: {exc.code().name}: {exc.details()}"
        if resp.status != pb.OK:
            detail = f": {resp.store_health_error}" if resp.store_health_error else ""
            return f"store {store} is {pb.Status.Name(resp.status)}{detail}"
    return None


async def prune_recovery_logs(
    session: Session,
    listed: Sequence[cpb.ListResponse.Shard],
    *,
    dry_run: bool,
    stores: StoreRegistry,
    update: Callable[..., None],
) -> PruneReport:
    """gazctl's `shards prune`: fold every hint set (primary and backups) of every shard into
    live segments per log, then remove each fragment of those logs that no live segment
    overlaps. A log is skipped if a shard recording to it lacks complete hints, or one of its
    stores is unhealthy. Nothing is removed if a fragment to remove is not yet persisted: the
    selector then misses a shard that uses the log."""
    from pygazette.stores.store import StoreError

    report = PruneReport()
    segment_sets: dict[str, list[Segment]] = {}
    skip: dict[str, str] = {}  # Recovery log -> why it is skipped.
    update(description="fetching hints", total=len(listed), completed=0)
    for shard in listed:
        report.shards_total += 1
        log_name = recovery_log(shard.spec)
        if not log_name:
            update(advance=1)
            continue
        reason = await _unhealthy_store(session.journals, log_name)
        if reason is not None:
            skip.setdefault(log_name, reason)
            update(advance=1)
            continue
        hints = await session.shards.get_hints(shard.spec.id)
        # Every hint set must be complete before any removal: hints are the only proof that
        # no shard still reads a fragment.
        for response_hints in [*hints.backup_hints, hints.primary_hints]:
            if response_hints.HasField("hints") and response_hints.hints.live_nodes:
                for seg in live_segments(response_hints.hints):
                    segment_sets.setdefault(seg.log, []).append(seg)
                continue
            report.skipped_journals += 1
            skip.setdefault(
                log_name,
                f"shard {shard.spec.id} "
                + (
                    "has hints without live files"
                    if response_hints.HasField("hints")
                    else "has not written all the hints that pruning needs"
                ),
            )
            break
        update(advance=1)

    for journal, reason in sorted(skip.items()):
        report.warnings.append(f"skipping recovery log {journal}: {reason}")
    report.skipped_logs = len(skip)

    # Decide every removal first, so that a refusal removes nothing.
    plan: list[pb.Fragment] = []
    journals = sorted(j for j in segment_sets if j not in skip)
    update(description="listing fragments", total=len(journals), completed=0)
    for journal in journals:
        segments = segment_sets[journal]
        for listed_fragment in await list_all_fragments(session.journals, journal):
            spec = listed_fragment.spec
            report.fragments_total += 1
            report.bytes_total += spec.end - spec.begin
            if overlaps_any_segment(segments, spec):
                continue
            if spec.mod_time == 0:
                raise CommandError(
                    f"fragment [{spec.begin}, {spec.end}) of {journal} is not persisted yet "
                    "and no hinted segment overlaps it: the selector must include every shard "
                    "that uses this recovery log; nothing was removed"
                )
            plan.append(spec)
        update(advance=1)

    # A file:// fragment is removed under this command's --file-root: one that is not the
    # broker's holds none of them, and unlinking what is not there would look like success.
    # A dry run (which needs no access to the stores) warns of it.
    for spec in plan:
        try:
            local = stores.get(spec.backing_store).local_path(fragment_content_path(spec))
        except StoreError:
            continue  # Reported by its removal.
        if local is not None and not await asyncio.to_thread(local.exists):
            missing = (
                f"fragment {fragment_location(spec)} is not at {local} (removed meanwhile, or "
                f"--file-root {stores.file_root} is not the broker's file root)"
            )
            if not dry_run:
                raise CommandError(f"{missing}; nothing was removed")
            report.warnings.append(f"{missing}: a run would remove nothing")
            break

    update(
        description="would remove" if dry_run else "removing fragments",
        total=len(plan),
        completed=0,
    )
    for spec in plan:
        if not dry_run:
            try:
                store = stores.get(spec.backing_store)
                await store.remove(fragment_content_path(spec))
            except StoreError as exc:
                report.failures.append(f"{fragment_location(spec)}: {exc}")
                update(advance=1)
                continue
        report.fragments_pruned += 1
        report.bytes_pruned += spec.end - spec.begin
        report.pruned.append(spec)
        update(advance=1)
    return report


@shards.command("prune")
@click.option("-l", "--selector", required=True, help="Label selector of shards.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@click.option(
    "--file-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Local directory of file:/// fragment stores (a broker's --file-root).",
)
@consumer_option
@broker_option
@click.pass_context
def prune_cmd(
    ctx: click.Context,
    selector: str,
    dry_run: bool,
    file_root: Path,
    consumer: str | None,
    broker: str | None,
) -> None:
    """Remove recovery-log fragments that no live file of the selected shards needs.

    Every hint set of each selected shard (primary and backups) names the log segments its
    live files were written in; a fragment of a recovery log that overlaps none of them is
    removed from its store. Include every shard that uses a log (forked logs are shared):
    hints of all of them are needed to know a fragment is unused.
    """
    from pygazette.stores.store import StoreRegistry

    sel = _selector(selector)

    async def run(session: Session) -> PruneReport:
        listed = (await session.shards.list_shards(sel)).shards
        with progress_display("pruning") as update:
            return await prune_recovery_logs(
                session,
                listed,
                dry_run=dry_run,
                stores=StoreRegistry(file_root),
                update=update,
            )

    report = run_session(ctx, consumer, broker, run)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    if report.pruned:
        click.echo(output.removed_fragments_table(report.pruned), nl=False)
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{verb} {report.fragments_pruned} of {report.fragments_total} fragment(s) "
        f"({output.human_bytes(report.bytes_pruned)} of "
        f"{output.human_bytes(report.bytes_total)}) of {report.shards_total} shard(s)"
        + (f"; skipped {report.skipped_logs} recovery log(s)" if report.skipped_logs else "")
    )
    if report.failures:
        raise CommandError(
            f"{len(report.failures)} fragment(s) could not be removed: {report.failures[0]}"
        )


# recover ---------------------------------------------------------------------------------


def pick_first_hints(hints: cpb.GetHintsResponse, log_name: str) -> rlpb.FSMHints:
    """The primary hints, else the most recent backup hints, else empty hints of the log
    (play it from the beginning), as Gazette's PickFirstHints."""
    if hints.primary_hints.HasField("hints"):
        return hints.primary_hints.hints
    for backup in hints.backup_hints:
        if backup.HasField("hints"):
            return backup.hints
    return rlpb.FSMHints(log=log_name)


def _nonempty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        raise CommandError(f"--dir {path} is not a directory") from None
    except OSError as exc:
        raise CommandError(f"cannot use --dir {path}: {exc.strerror or exc}") from None


@shards.command("recover")
@click.option("--id", "shard_id", default=None, help="ID of the shard to recover.")
@click.option("-l", "--selector", default=None, help="Label selector matching exactly one shard.")
@click.option(
    "-d",
    "--dir",
    "directory",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to play the recovery log into.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Allow --dir to be a non-empty directory (its content is removed first).",
)
@consumer_option
@broker_option
@click.pass_context
def recover_cmd(
    ctx: click.Context,
    shard_id: str | None,
    selector: str | None,
    directory: Path,
    overwrite: bool,
    consumer: str | None,
    broker: str | None,
) -> None:
    """Recover a shard's latest checkpointed store by playing its recovery log into DIR.

    The shard's hints (primary, else backups) say which parts of the log hold its live files;
    they are played up to the log's current write head, leaving the files in DIR. Playback
    starts by emptying DIR (as gazctl's does), so a non-empty DIR needs --overwrite.
    """
    if (shard_id is None) == (selector is None):
        raise click.UsageError("give exactly one of --id and --selector")
    text = f"id={shard_id}" if shard_id is not None else selector
    assert text is not None
    sel = _selector(text)
    if not overwrite and _nonempty_dir(directory):
        raise CommandError(
            f"--dir {directory} is not empty; playback removes its content first "
            "(use --overwrite to allow that)"
        )

    async def run(session: Session) -> tuple[str, str]:
        found = await _list_matching(session, sel, text)
        if len(found) != 1:
            ids = ", ".join(s.spec.id for s in found[:5])
            raise CommandError(
                f"selector {text!r} matches {len(found)} shards ({ids}); recover needs exactly one"
            )
        spec = found[0].spec
        log_name = recovery_log(spec)
        if not log_name:
            raise CommandError(f"shard {spec.id!r} has no recovery log (no recovery_log_prefix)")
        hints = pick_first_hints(await session.shards.get_hints(spec.id), log_name)
        log.debug("fetched shard recovery hints", extra={"shard": spec.id, "log": hints.log})
        with progress_display(f"playing {hints.log} into {directory}"):
            await play_recovery_log(session, hints, directory)
        return spec.id, hints.log

    recovered, log_name = run_session(ctx, consumer, broker, run)
    click.echo(f"recovered shard {recovered} from {log_name} into {directory}")


async def play_recovery_log(session: Session, hints: rlpb.FSMHints, directory: Path) -> None:
    """Play the hinted log into `directory`, finishing at the log's write head."""
    from pygazette.consumer.recoverylog.player import Player

    player = Player(session.journals, hints, directory)
    player.finish_at_write_head()
    try:
        await player.play()
    except (GazetteError, ValueError, OSError) as exc:
        raise CommandError(f"playing recovery log {hints.log}: {exc}") from None
