"""`pygazette journals ...`: list, apply, append to, read and list fragments of journals,
shaped like Gazette's `gazctl journals` commands.

Each command runs the async client on a fresh event loop. Expected failures are raised as
`click.ClickException` or pygazette errors, which `main` prints as one line. What only one
command needs (the append pipeline, the retrying reader, record framings, YAML) is imported by
that command, so that e.g. `journals list` starts quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click
import grpc
import grpc.aio

from pygazette.cli import output
from pygazette.cli.client_settings import CliState, client_settings
from pygazette.client.channel import channel_target
from pygazette.client.defaults import BROKER_ADDRESS_ENV, DEFAULT_BROKER
from pygazette.client.list_apply import (
    DEFAULT_APPLY_BATCH,
    apply_journals_in_batches,
    list_all,
    list_journals,
)
from pygazette.protocol.errors import GazetteError, error_for_status
from pygazette.protocol.go_duration import parse_duration
from pygazette.protocol.labels import label_value, label_values
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from pygazette.protocol.validation import CONTENT_TYPE_LABEL

if TYPE_CHECKING:
    from pygazette.client.append_service import AppendService, AsyncAppend
    from pygazette.client.journal_client import JournalClient
    from pygazette.client.watched_list import WatchedList
    from pygazette.message.mapping import MappingFunc

log = logging.getLogger(__name__)

T = TypeVar("T")

# Bytes read from stdin per call.
INPUT_CHUNK = 1 << 20
# With --framing lines or fixed, appends of records are at most about this large.
RECORDS_APPEND_CUTOFF = 8 << 20


class CommandError(click.ClickException):
    """An expected failure of a command, printed as one line."""


def broker_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--broker",
        default=None,
        metavar="URL",
        help=f"Broker to talk to [default: the root --broker, ${BROKER_ADDRESS_ENV}, "
        f"or {DEFAULT_BROKER}].",
    )(fn)


def column_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """gazctl's table columns of `journals list` and `shards list`: -L, -p, -r and --rf."""
    for option in (
        click.option("--rf", is_flag=True, help="Show the replication factor column."),
        click.option("-r", "--replicas", is_flag=True, help="Show the replicas column."),
        click.option("-p", "--primary", is_flag=True, help="Show the primary column."),
        click.option(
            "-L",
            "--label-columns",
            "label_columns",
            multiple=True,
            metavar="LABEL",
            help="Show this label as a column (repeatable).",
        ),
    ):
        fn = option(fn)
    return fn


def max_txn_size_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """gazctl's --max-txn-size, defaulting to batches a default etcd accepts."""
    return click.option(
        "--max-txn-size",
        type=click.IntRange(min=0),
        default=DEFAULT_APPLY_BATCH,
        show_default=True,
        help="Changes per transaction. The default fits a default etcd (--max-txn-ops 128), "
        "which refuses larger transactions; 0 sends every change in one transaction, as "
        "gazctl does by default. Applied in several transactions, a failed apply leaves the "
        "transactions before it applied.",
    )(fn)


class ApplyProgress:
    """Reports an apply of several transactions on stderr: after a transaction at most once
    a second, and after the last one (nothing for an apply of one transaction)."""

    INTERVAL = 1.0

    def __init__(self, what: str) -> None:
        self.what = what
        self.started = time.monotonic()
        self.reported = self.started
        self.transactions = 0

    def __call__(self, done: int, total: int) -> None:
        self.transactions += 1
        now = time.monotonic()
        if done == total:
            if self.transactions == 1:
                return
        elif now - self.reported < self.INTERVAL:
            return
        self.reported = now
        click.echo(
            f"applied {done}/{total} {self.what} changes in {self.transactions} "
            f"transaction(s) ({now - self.started:.1f}s)",
            err=True,
        )


def _broker(ctx: click.Context, override: str | None) -> str:
    if override:
        return override
    state = ctx.find_object(CliState)
    return state.broker if state is not None else DEFAULT_BROKER


def run_with_client(broker: str, fn: Callable[[JournalClient], Awaitable[T]]) -> T:
    """Run `fn` with a client of `broker` on a new event loop; RPC failures become one-line
    errors."""
    try:
        channel_target(broker)
    except ValueError as exc:
        raise CommandError(f"invalid broker address: {exc}") from None

    async def run() -> T:
        async with client_settings().journal_client(broker) as client:
            return await fn(client)

    try:
        return asyncio.run(run())
    except grpc.aio.AioRpcError as exc:
        details = (exc.details() or "").replace("\n", " ")
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            details = client_settings().unavailable(broker, details)
            raise CommandError(f"broker unavailable at {broker}: {details}") from None
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            details = client_settings().unimplemented(broker, details)
        raise CommandError(f"{exc.code().name}: {details}") from None


def _selector(text: str) -> pb.LabelSelector:
    return parse_selector(text)  # ValidationError is reported by main.


def _no_match(sel: pb.LabelSelector, text: str) -> Exception:
    """The error for a selector matching no journal: JOURNAL_NOT_FOUND if it names one."""
    names = label_values(sel.include, "name")
    if len(names) == 1 and names[0]:
        return error_for_status(pb.JOURNAL_NOT_FOUND, names[0])
    return CommandError(f"no journal matches selector {text!r}")


async def _served_journals(
    client: JournalClient, sel: pb.LabelSelector, selector: str
) -> list[str]:
    """The journals `sel` matches that some broker serves (not fully suspended: gazctl leaves
    those out); a selector naming a journal that doesn't exist is its JOURNAL_NOT_FOUND."""
    found = await list_journals(client, sel)
    if not found and label_values(sel.include, "name"):
        raise _no_match(sel, selector)
    return [j.spec.name for j in found if j.spec.suspend.level != pb.JournalSpec.Suspend.FULL]


@click.group("journals")
def journals() -> None:
    """Interact with broker journals."""


# apply -----------------------------------------------------------------------------------


@journals.command("apply")
@click.option(
    "--specs",
    "specs_path",
    default="-",
    show_default=True,
    metavar="FILE",
    help="Journalspace YAML to apply ('-' reads stdin, as gazctl's default).",
)
@click.option("--dry-run", is_flag=True, help="Print the changes instead of applying them.")
@max_txn_size_option
@broker_option
@click.pass_context
def apply_cmd(
    ctx: click.Context, specs_path: str, dry_run: bool, max_txn_size: int, broker: str | None
) -> None:
    """Apply journal creations, updates and deletions from a journalspace YAML file.

    The YAML is the hierarchy printed by "journals list --format yaml": directory nodes
    (names ending in '/') hold the values their children inherit. A journal's "revision" must
    match its current revision (0 creates it, -1 applies regardless); "delete: true" deletes
    the journals listed beneath a node. Nothing is applied unless every spec is valid.
    """
    from pygazette.cli.journalspace import apply_request, parse_journalspace

    text = _read_text(specs_path)
    tree = parse_journalspace(text)
    request = apply_request(tree)
    if dry_run:
        # The request as gazctl prints it (proto.MarshalText of Gazette's structs).
        click.echo(output.listing_proto_text(request), nl=False)
        return

    async def run(client: JournalClient) -> pb.ApplyResponse:
        return await apply_journals_in_batches(
            client, request, max_txn_size, ApplyProgress("journal")
        )

    resp = run_with_client(_broker(ctx, broker), run)
    log.info("successfully applied", extra={"revision": resp.header.etcd.revision})
    click.echo(
        f"applied {len(request.changes)} journal change(s) at revision {resp.header.etcd.revision}"
    )


@journals.command("edit")
@click.option("-l", "--selector", required=True, help="Label selector of journals to edit.")
@max_txn_size_option
@broker_option
@click.pass_context
def edit_cmd(ctx: click.Context, selector: str, max_txn_size: int, broker: str | None) -> None:
    """Edit the selected journals' specs in an editor, and apply the result.

    The editor is $GAZ_EDITOR, else $EDITOR, else vi. The journalspace YAML of the selected
    journals is opened, with their revisions; when the editor exits with changes they are
    validated and applied. If that fails (an invalid spec, or a journal changed meanwhile so
    that its revision no longer matches), the editor reopens with the error, keeping your
    edits. An empty or unchanged file cancels the edit. The specs keep their suspension.
    """
    from collections.abc import Coroutine

    from pygazette.cli.journalspace import apply_request, parse_journalspace
    from pygazette.cli.spec_editor import PartlyApplied, edit_retry_loop

    sel = _selector(selector)
    applied_revision: list[int] = []

    async def run(client: JournalClient) -> bool:
        loop = asyncio.get_running_loop()

        def call(coro: Coroutine[Any, Any, T]) -> T:
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        def select() -> str:
            found = call(list_journals(client, sel))
            if not found:
                raise _no_match(sel, selector)
            return output.journals_yaml(found)

        def apply(text: str) -> None:
            request = apply_request(parse_journalspace(text))
            applied = 0  # Changes of the transactions applied so far.

            def progress(done: int, _total: int) -> None:
                nonlocal applied
                applied = done

            try:
                resp = call(apply_journals_in_batches(client, request, max_txn_size, progress))
            except GazetteError as exc:
                if applied:  # Its message says what stays applied.
                    raise PartlyApplied(str(exc)) from exc
                raise
            applied_revision.append(resp.header.etcd.revision)

        # The editor and the loop block: run them off the event loop, which serves the RPCs.
        return await asyncio.to_thread(
            edit_retry_loop, select, apply, prefix="pygazette-journals-edit-"
        )

    if run_with_client(_broker(ctx, broker), run):
        click.echo(f"applied journal changes at revision {applied_revision[-1]}")


def _read_text(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CommandError(f"cannot read {path}: not UTF-8 text ({exc.reason})") from None


# list ------------------------------------------------------------------------------------


@journals.command("list")
@click.option(
    "-l", "--selector", default="", help='Label selector, e.g. "app=examples" or "prefix=a/b/".'
)
@click.option(
    "-o",
    "--format",
    "fmt",
    type=click.Choice(["table", "yaml", "json", "proto"]),
    default="table",
    show_default=True,
    help="yaml is the journalspace hierarchy that 'journals apply' accepts.",
)
@column_options
@click.option("--stores", is_flag=True, help="Show the (first) fragment store column.")
@click.option(
    "--watch",
    is_flag=True,
    help="Keep watching: print the listing again whenever it changes (until Ctrl-C).",
)
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
    stores: bool,
    watch: bool,
    broker: str | None,
) -> None:
    """List journals matching a label selector (meta-labels "name" and "prefix" work too).

    The table shows every column by default; with any of -L, -p, -r, --rf or --stores it
    shows the journal names and those columns only, as gazctl's does.
    """
    sel = _selector(selector)

    def render(listing: pb.ListResponse) -> None:
        journals_ = list(listing.journals)
        if fmt == "table":
            if label_columns or primary or replicas or rf or stores:
                table = output.journals_columns_table(
                    journals_,
                    rf=rf,
                    primary=primary,
                    replicas=replicas,
                    stores=stores,
                    label_columns=label_columns,
                )
            else:
                table = output.journals_table(journals_)
            click.echo(table, nl=False)
        elif fmt == "yaml":
            click.echo(output.journals_yaml(journals_), nl=False)
        elif fmt == "json":
            click.echo(output.listing_json(listing), nl=False)
        else:
            click.echo(output.listing_proto_text(listing), nl=False)

    if watch:
        _watch_listing(ctx, broker, sel, render)
        return

    async def run(client: JournalClient) -> pb.ListResponse:
        return await list_all(client, sel)

    render(run_with_client(_broker(ctx, broker), run))


def _watch_listing(
    ctx: click.Context,
    broker: str | None,
    sel: pb.LabelSelector,
    render: Callable[[pb.ListResponse], None],
) -> None:
    """Render the listing, then again whenever it changes, until interrupted (gazctl's
    `journals list --watch`)."""
    from pygazette.client.watched_list import WatchedList

    async def run(client: JournalClient) -> None:
        async with WatchedList(client, sel) as watched:
            shown = None
            while True:
                listing = watched.snapshot()
                if listing is not shown:
                    render(listing)
                    sys.stdout.flush()
                    shown = listing
                # A timeout too: an update may land before wait_update() waits for it.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watched.wait_update(), 1.0)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends.
        run_with_client(_broker(ctx, broker), run)


# append ----------------------------------------------------------------------------------


async def _read_chunk(stream: IO[bytes], n: int) -> bytes:
    read1 = getattr(stream, "read1", None)
    if read1 is not None:
        data: bytes = await asyncio.to_thread(read1, n)
    else:
        data = await asyncio.to_thread(stream.read, n)
    return data


async def _input_chunks(stream: IO[bytes]) -> AsyncIterator[bytes]:
    while True:
        data = await _read_chunk(stream, INPUT_CHUNK)
        if not data:
            return
        yield data


def _only_journal(listing: pb.ListResponse, selector: str) -> str:
    found = listing.journals
    if len(found) > 1:
        names = ", ".join(j.spec.name for j in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        raise CommandError(
            f"selector {selector!r} matches {len(found)} journals ({names}{more}); "
            "an append of unframed input needs exactly one"
        )
    return found[0].spec.name


def _mapping(name: str, partitions: WatchedList) -> MappingFunc:
    from pygazette.message.mapping import modulo_mapping, random_mapping, rendezvous_mapping

    if name == "modulo":
        return modulo_mapping(_key_of, partitions)
    if name == "rendezvous":
        return rendezvous_mapping(_key_of, partitions)
    if name == "direct":
        return _direct_mapping(partitions)
    return random_mapping(partitions)


def _direct_mapping(partitions: WatchedList) -> MappingFunc:
    """gazctl's --mapping direct: each record's key is the name of its journal, which must be
    one of the selected journals."""
    from pygazette.cli.records import RecordError

    def mapping(key: Any) -> tuple[str, str]:
        name = _key_of(key).decode("utf-8", "replace")
        for journal in partitions.snapshot().journals:
            if journal.spec.name == name:
                return name, label_value(journal.spec.labels, CONTENT_TYPE_LABEL)
        raise RecordError(f"journal {name!r} not found among the selected journals")

    return mapping


def _key_of(key: Any) -> bytes:
    assert isinstance(key, bytes)
    return key


class _Appends:
    """Appends queued on an AppendService; the first failure among them stops the command."""

    def __init__(self, service: AppendService) -> None:
        self.service = service
        self.ops: list[AsyncAppend] = []
        self.count = 0

    def add(self, journal: str, data: bytes) -> None:
        self.ops.append(self.service.append(journal, data))
        self.count += 1
        if len(self.ops) > 1024:
            self.check()

    def check(self) -> None:
        for op in self.ops:
            if op.done() and op.error(0) is not None:
                raise op.error(0)  # type: ignore[misc]
        self.ops = [op for op in self.ops if not op.done()]


async def _append_records(
    client: JournalClient,
    partitions: WatchedList,
    stream: IO[bytes],
    *,
    framing: str,
    mapping_name: str,
    base64_keys: bool,
) -> int:
    """Append the input's records, each mapped to a journal; returns the appends queued."""
    from pygazette.cli.records import RecordError, RecordSplitter
    from pygazette.client.append_service import AppendService

    splitter = RecordSplitter(framing)
    mapping = _mapping(mapping_name, partitions)
    keyed = mapping_name != "random"
    key: bytes | None = None
    async with AppendService(client, append_cutoff=RECORDS_APPEND_CUTOFF) as service:
        appends = _Appends(service)

        def route(records: list[bytes]) -> None:
            nonlocal key
            groups: dict[str, list[bytes]] = {}
            try:
                for record in records:
                    if keyed and key is None:
                        key = splitter.key(record, base64_keys)
                        continue
                    journal, _ = mapping(key if key is not None else b"")
                    key = None
                    group = groups.get(journal)
                    if group is None:
                        groups[journal] = [record]
                    else:
                        group.append(record)
                    log.debug("mapped record", extra={"journal": journal})
            finally:
                # Also when a key is bad: the records mapped before it are appended.
                for journal, group in groups.items():
                    appends.add(journal, b"".join(group))

        try:
            async for chunk in _input_chunks(stream):
                names = partitions.snapshot().journals
                if not keyed and len(names) == 1:
                    # One journal: whole runs of records go as they are, without per-record
                    # work.
                    block = splitter.whole(chunk)
                    if block:
                        appends.add(names[0].spec.name, block)
                else:
                    route(splitter.feed(chunk))
                appends.check()
            rest = splitter.finish()
            if rest:
                # As gazctl (its UnpackLine's unexpected EOF): appended, a line without its
                # newline would run into the journal's next record, breaking its framing.
                raise RecordError(
                    f"input ends within a line ({len(rest)} byte(s) without a final newline, "
                    "not appended)"
                )
            if key is not None:
                raise RecordError("input ends with a partition key but no record")
        except RecordError as exc:
            # The records before the bad one are queued: append them (leaving the service
            # on this error would abandon them, some committed and some not), and say so.
            await service.wait_all()
            raise RecordError(f"{exc}; the records before it were appended") from None
        await service.wait_all()
        return appends.count


@journals.command("append")
@click.option("-l", "--selector", required=True, help="Label selector of journals to append to.")
@click.option(
    "-f",
    "--framing",
    type=click.Choice(["none", "lines", "fixed"]),
    default="none",
    show_default=True,
    help="Framing of records in the input: none (all input is one append), lines, or fixed "
    "(Gazette's fixed framing: magic word, little-endian length, payload).",
)
@click.option(
    "-m",
    "--mapping",
    "mapping_name",
    type=click.Choice(["random", "modulo", "rendezvous", "direct"]),
    default="random",
    show_default=True,
    help="Mapping of records to the selected journals (direct: each record's key is the "
    "name of its journal).",
)
@click.option(
    "--base64",
    "base64_keys",
    is_flag=True,
    help="Partition keys of 'lines' framing are base64-encoded.",
)
@click.option(
    "-i", "--input", "input_path", default="-", show_default=True, help="Input file ('-': stdin)."
)
@broker_option
@click.pass_context
def append_cmd(
    ctx: click.Context,
    selector: str,
    framing: str,
    mapping_name: str,
    base64_keys: bool,
    input_path: str,
    broker: str | None,
) -> None:
    """Append input to the journals that the selector matches.

    With --framing none, all of the input is appended atomically to the one journal that
    the selector matches (e.g. "-l name=my/journal").

    With --framing lines or fixed, the input is read record by record, and each record is
    appended atomically to a journal of the selector, chosen by --mapping. Records mapped to
    the same journal keep their order there; they are batched into few appends. The set of
    selected journals is watched, so journals created meanwhile are used too.

    With --mapping modulo or rendezvous, every record must be preceded by its partition key,
    written with the same framing (e.g. for lines: "key\\nrecord\\n"); records of equal keys
    go to the same journal. Use --base64 for binary keys with lines framing. With --mapping
    direct, each record is preceded by the name of its journal (one of the selected ones).
    """
    from pygazette.cli.records import RecordError
    from pygazette.client.appender import append
    from pygazette.client.watched_list import WatchedList

    sel = _selector(selector)
    if framing == "none" and mapping_name != "random":
        raise click.UsageError("--framing none may only be used with --mapping random")
    if base64_keys and (framing != "lines" or mapping_name == "random"):
        raise click.UsageError(
            "--base64 requires --framing lines and --mapping modulo|rendezvous|direct"
        )
    stream = _open_input(input_path)

    async def run(client: JournalClient) -> None:
        async with WatchedList(client, sel) as partitions:
            if not partitions.snapshot().journals:
                raise _no_match(sel, selector)
            if framing == "none":
                journal = _only_journal(partitions.snapshot(), selector)
                resp = await append(client, journal, _input_chunks(stream))
                log.debug(
                    "appended",
                    extra={"journal": journal, "begin": resp.commit.begin, "end": resp.commit.end},
                )
                return
            n = await _append_records(
                client,
                partitions,
                stream,
                framing=framing,
                mapping_name=mapping_name,
                base64_keys=base64_keys,
            )
            log.debug("appended records", extra={"appends": n})

    try:
        run_with_client(_broker(ctx, broker), run)
    except RecordError as exc:
        raise CommandError(str(exc)) from None
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _open_input(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")  # Closed by the command.
    except OSError as exc:
        raise CommandError(f"cannot open {path}: {exc.strerror or exc}") from None


# read ------------------------------------------------------------------------------------


@journals.command("read")
@click.option("-l", "--selector", required=True, help="Label selector of journals to read.")
@click.option(
    "--offset",
    type=click.IntRange(min=-1),
    default=0,
    show_default=True,
    help="Offset to start each journal at (-1: its write head).",
)
@click.option(
    "--tail",
    is_flag=True,
    help="Start each journal at its write head (--offset -1), unless --offsets names it.",
)
@click.option(
    "-b", "--block", is_flag=True, help="Keep reading new content as it commits (until Ctrl-C)."
)
@click.option(
    "-o",
    "--output",
    "output_path",
    default="-",
    show_default=True,
    help="Output file ('-': stdout).",
)
@click.option(
    "--offsets",
    "offsets_path",
    type=click.Path(dir_okay=False),
    help="JSON file of journal offsets to start at (a journal it names starts there).",
)
@click.option(
    "--offsets-out",
    "offsets_out_path",
    type=click.Path(dir_okay=False),
    help="JSON file to write each journal's final offset to at exit (the same path as "
    "--offsets keeps the previous file as PATH.previous).",
)
@click.option(
    "--from",
    "from_unix",
    type=int,
    default=0,
    help="Skip over fragments persisted before this Unix time (seconds).",
)
@broker_option
@click.pass_context
def read_cmd(
    ctx: click.Context,
    selector: str,
    offset: int,
    tail: bool,
    block: bool,
    output_path: str,
    offsets_path: str | None,
    offsets_out_path: str | None,
    from_unix: int,
    broker: str | None,
) -> None:
    """Copy the content of the selected journals to stdout (or --output).

    Without --block each journal is read up to its write head, one journal after the other.
    With --block all selected journals are read at once, until interrupted (Ctrl-C or
    SIGTERM). Output is cut at message boundaries of each journal's framing (its content-type
    label: JSON lines, CSV or fixed framing), so messages of different journals never
    interleave; content of other types is copied as it is read. --offsets and --offsets-out
    (gazctl's) resume a read where an earlier one ended.
    """
    import json
    import os
    import signal

    from pygazette.cli.records import MessageAligner
    from pygazette.client.retry_reader import RetryReader, chunks_of

    sel = _selector(selector)
    start: dict[str, int] = {}
    if offsets_path:
        start = _read_offsets(offsets_path)
        if offsets_out_path and os.path.abspath(offsets_path) == os.path.abspath(offsets_out_path):
            # As gazctl: keep the input as PATH.previous (and show a crash by its absence).
            os.replace(offsets_path, offsets_path + ".previous")
    # Each journal's offset of the content written out so far.
    done: dict[str, int] = dict(start)
    if output_path == "-":
        out: IO[bytes] = sys.stdout.buffer
    else:
        try:
            out = open(output_path, "wb")  # Closed below.
        except OSError as exc:
            raise CommandError(f"cannot open {output_path}: {exc.strerror or exc}") from None

    async def pump(client: JournalClient, journal: pb.ListResponse.Journal) -> None:
        name = journal.spec.name
        aligner = MessageAligner(label_value(journal.spec.labels, CONTENT_TYPE_LABEL))
        at = done.get(name, -1 if tail else offset)
        request = pb.ReadRequest(journal=name, offset=at, block=block, begin_mod_time=from_unix)
        rr = RetryReader(client, request)
        try:
            async for chunk in chunks_of(rr):
                whole = aligner.feed(chunk)
                if whole:
                    out.write(whole)
                    if block:
                        out.flush()
                done[name] = rr.offset - aligner.held
            out.write(aligner.finish())
            out.flush()
            done[name] = rr.offset
        finally:
            await rr.aclose()

    def readable(listing: Sequence[pb.ListResponse.Journal]) -> list[pb.ListResponse.Journal]:
        return [j for j in listing if j.spec.suspend.level != pb.JournalSpec.Suspend.FULL]

    def no_match() -> None:
        if label_values(sel.include, "name"):
            raise _no_match(sel, selector)
        log.warning("no journals were matched by the selector", extra={"selector": selector})

    async def run(client: JournalClient) -> None:
        if block:
            await read_watched(client)
            return
        found = readable(await list_journals(client, sel))
        if not found:
            no_match()
        for j in found:
            await pump(client, j)

    async def read_watched(client: JournalClient) -> None:
        """Read every selected journal at once; as gazctl does, the selection is watched:
        a journal that comes to match is read too, one that no longer does stops."""
        from pygazette.client.watched_list import WatchedList

        async with WatchedList(client, sel) as watched:
            listing = watched.snapshot()
            if not readable(listing.journals):
                no_match()
                return
            pumps: dict[str, asyncio.Task[None]] = {}
            while True:
                names = set()
                for j in readable(listing.journals):
                    names.add(j.spec.name)
                    if j.spec.name not in pumps:
                        pumps[j.spec.name] = asyncio.create_task(pump(client, j))
                for name in [n for n in pumps if n not in names]:
                    pumps.pop(name).cancel()
                update = asyncio.create_task(watched.wait_update())
                try:
                    # A timeout too: an update may land before wait_update() waits for it.
                    await asyncio.wait(
                        [update, *pumps.values()], timeout=1.0, return_when="FIRST_COMPLETED"
                    )
                finally:
                    update.cancel()
                for task in pumps.values():
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        for other in pumps.values():
                            other.cancel()
                        task.result()
                listing = watched.snapshot()

    # SIGTERM ends a read as Ctrl-C does (gazctl's), so that --offsets-out is written: as
    # SIGINT, which asyncio.run turns into a cancellation at an await (never between writing
    # content and noting its offset).
    previous = signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        try:
            run_with_client(_broker(ctx, broker), run)
        except KeyboardInterrupt:
            if not block:
                raise
            # Ctrl-C is how a blocking read ends: not an error.
        finally:
            out.flush()
            if out is not sys.stdout.buffer:
                os.fsync(out.fileno())
                out.close()
            if offsets_out_path:
                _write_offsets(offsets_out_path, done, json)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _read_offsets(path: str) -> dict[str, int]:
    """The journal offsets of a --offsets file (gazctl's: a JSON object)."""
    import json

    try:
        with open(path, "rb") as f:
            offsets = json.load(f)
    except OSError as exc:
        raise CommandError(f"cannot read offsets {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CommandError(f"offsets {path} are not JSON: {exc}") from None
    if not isinstance(offsets, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= -1 for k, v in offsets.items()
    ):
        raise CommandError(f"offsets {path} are not an object of journal offsets")
    return offsets


def _write_offsets(path: str, offsets: dict[str, int], json: Any) -> None:
    """Write offsets atomically (a temporary renamed over `path`), as gazctl does."""
    import os

    temp = path + ".temp"
    with open(temp, "w") as f:
        json.dump(offsets, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


# fragments -------------------------------------------------------------------------------


@journals.command("fragments")
@click.option("-l", "--selector", default="", help="Label selector of journals.")
@click.option(
    "-o",
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "proto"]),
    default="table",
    show_default=True,
    help="json prints one fragment per line; proto a FragmentsResponse per journal.",
)
@click.option(
    "--url-ttl",
    default="0s",
    show_default=True,
    metavar="DURATION",
    help="Include a signed GET URL valid this long (e.g. 1h).",
)
@click.option(
    "--from",
    "from_unix",
    type=int,
    default=0,
    help="Only fragments persisted at or after this Unix time.",
)
@click.option(
    "--to", "to_unix", type=int, default=0, help="Only fragments persisted before this Unix time."
)
@broker_option
@click.pass_context
def fragments_cmd(
    ctx: click.Context,
    selector: str,
    fmt: str,
    url_ttl: str,
    from_unix: int,
    to_unix: int,
    broker: str | None,
) -> None:
    """List the fragments of the selected journals."""
    from pygazette.client.fragments import list_all_fragments

    sel = _selector(selector)
    ttl_ns = parse_duration(url_ttl)
    if ttl_ns < 0:
        raise CommandError(f"invalid --url-ttl {url_ttl!r}: negative")
    ttl = ttl_ns / 1e9 if ttl_ns else None

    async def run(client: JournalClient) -> list[list[pb.FragmentsResponse._Fragment]]:
        return await asyncio.gather(
            *(
                list_all_fragments(
                    client,
                    name,
                    begin_mod_time=from_unix,
                    end_mod_time=to_unix,
                    signature_ttl=ttl,
                )
                for name in await _served_journals(client, sel, selector)
            )
        )

    listed = run_with_client(_broker(ctx, broker), run)
    fragments = [f for frags in listed for f in frags]
    if fmt == "proto":
        for frags in listed:
            response = pb.FragmentsResponse(fragments=frags)
            click.echo(output.listing_proto_text(response), nl=False)
    elif fmt == "table":
        click.echo(output.fragments_table(fragments, with_urls=ttl is not None), nl=False)
    else:
        click.echo(output.fragments_json_lines(fragments), nl=False)


# suspend ---------------------------------------------------------------------------------

# Suspensions asked for at once.
SUSPEND_CONCURRENCY = 32


@journals.command("suspend")
@click.option("-l", "--selector", required=True, help="Label selector of journals to suspend.")
@click.option(
    "-f",
    "--force",
    is_flag=True,
    help="Suspend journals even if they are in use (content not persisted, or written "
    "within their flush interval).",
)
@broker_option
@click.pass_context
def suspend_cmd(ctx: click.Context, selector: str, force: bool, broker: str | None) -> None:
    """Suspend idle journals, so that they use fewer brokers, or none.

    A suspended journal is served by one broker (its content persisted first), or by none
    once no fragment holds any of its content. Its next append resumes it where it was. A
    journal is idle when its content is persisted and its newest fragment is older than its
    flush interval (a day, without one); --force suspends the others too. Prints each
    journal's outcome; journals fully suspended already are left out.

    Suspension is recorded in the journal's spec ('suspend'): to change specs of suspended
    journals, edit what 'journals list -o yaml' prints, which keeps it.
    """
    from pygazette.cli.progress import progress_display
    from pygazette.client.suspension import suspend_journal

    sel = _selector(selector)

    async def run(client: JournalClient) -> list[tuple[str, bool]]:
        names = await _served_journals(client, sel, selector)
        gate = asyncio.Semaphore(SUSPEND_CONCURRENCY)
        with progress_display("suspending") as update:
            update(total=len(names), completed=0)

            async def one(name: str) -> tuple[str, bool]:
                async with gate:
                    suspended = await suspend_journal(client, name, force=force)
                update(advance=1)
                return name, suspended

            return await asyncio.gather(*(one(n) for n in names))

    outcomes = run_with_client(_broker(ctx, broker), run)
    for name, suspended in outcomes:
        click.echo(f"{name}\t{'suspended' if suspended else 'in use: not suspended'}")


# reset-head ------------------------------------------------------------------------------


@journals.command("reset-head")
@click.option("-l", "--selector", required=True, help="Label selector of journals to reset.")
@broker_option
@click.pass_context
def reset_head_cmd(ctx: click.Context, selector: str, broker: str | None) -> None:
    """Move journals' write heads to the end of their fragments (disaster recovery).

    After as many broker failures as a journal has replicas, none of its brokers took part
    in its last appends, and they refuse new ones (INDEX_HAS_GREATER_OFFSET) rather than
    risk writing an offset twice. Once every fragment of the failed brokers is surely
    persisted (they have all exited), this lets appends go on after the last fragment. On a
    consistent journal, even one being appended to, it changes nothing. Prints each journal's
    write head; journals fully suspended are left out.
    """
    from pygazette.client.reset_head import reset_head

    sel = _selector(selector)

    async def run(client: JournalClient) -> list[tuple[str, int | None]]:
        names = await _served_journals(client, sel, selector)

        async def one(name: str) -> tuple[str, int | None]:
            return name, await reset_head(client, name)

        return await asyncio.gather(*(one(n) for n in names))

    for name, head in run_with_client(_broker(ctx, broker), run):
        click.echo(f"{name}\t{'appends moved it on' if head is None else f'head {head}'}")
