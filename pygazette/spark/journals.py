"""What the driver asks brokers: which journals to read, their write heads, their fragments.

All functions are coroutines over a `JournalClient`; `pygazette.spark.runtime` runs them from
Spark's synchronous code.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

import grpc

from pygazette.client.fragments import list_all_fragments
from pygazette.client.journal_client import JournalClient, is_unavailable
from pygazette.client.list_apply import list_journals
from pygazette.client.reader import read_request
from pygazette.client.response_check import check_read_response, invalid_response
from pygazette.client.retry_reader import backoff
from pygazette.protocol.errors import (
    InsufficientJournalBrokers,
    JournalNotFound,
    NoJournalPrimaryBroker,
    NotJournalBroker,
    NotJournalPrimaryBroker,
    Suspended,
    error_for_status,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from pygazette.spark.options import EARLIEST, LATEST, OffsetSpec

# Signed fragment URLs handed to executors stay valid this long; an executor that finds one
# expired (or unreachable) reads the fragment through a broker instead.
SIGNATURE_TTL_SECONDS = 6 * 3600.0
# Journals whose heads / fragments are fetched at once.
CONCURRENCY = 32
# A running stream's look-ups (each trigger's journals, heads and fragments) that find no
# broker to answer (UNAVAILABLE: a broker restarting, a connection lost) are tried again, with
# backoff, for up to this long: a broker restart must not fail the query. Gazette's client
# waits for a broker to be ready for such look-ups too (grpc.WaitForReady on List); 60 s is
# the Kafka source's default (default.api.timeout.ms). Other look-ups (a query starting, a
# batch read's planning) fail at once: a wrong address or TLS setting is told at once.
UNAVAILABLE_RETRY_SECONDS = 60.0
_retry_seconds: ContextVar[float] = ContextVar("retry_seconds", default=0.0)

log = logging.getLogger(__name__)
T = TypeVar("T")


def patiently(
    fn: Callable[[JournalClient], Awaitable[T]],
) -> Callable[[JournalClient], Awaitable[T]]:
    """`fn`, its look-ups retried across a broker restart (UNAVAILABLE_RETRY_SECONDS)."""

    async def go(client: JournalClient) -> T:
        token = _retry_seconds.set(UNAVAILABLE_RETRY_SECONDS)
        try:
            return await fn(client)
        finally:
            _retry_seconds.reset(token)

    return go


# A broker refusing for want of an assignment (one just restarted, a route changing): tried
# again, as Gazette's RetryReader and Append try them again.
_UNASSIGNED = (
    NoJournalPrimaryBroker,
    NotJournalPrimaryBroker,
    NotJournalBroker,
    InsufficientJournalBrokers,
)


async def retry_unavailable(what: str, fn: Callable[[], Awaitable[T]]) -> T:
    """`fn()`, called again after a transport failure or a broker's refusal for want of an
    assignment, for as long as `patiently` allows."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _retry_seconds.get()
    attempt = 0
    while True:
        try:
            return await fn()
        except (grpc.aio.AioRpcError, *_UNASSIGNED) as exc:
            left = deadline - loop.time()
            if (isinstance(exc, grpc.aio.AioRpcError) and not is_unavailable(exc)) or left <= 0:
                raise
            (log.info if attempt == 0 else log.warning)(
                "%s: no broker to answer (%s); trying again", what, exc
            )
            await asyncio.sleep(min(backoff(attempt), left))
            attempt += 1


@dataclass(frozen=True, slots=True)
class FragmentInfo:
    """One fragment of a listing, as executors need it (picklable)."""

    journal: str
    begin: int
    end: int
    mod_time: int  # Unix seconds; 0 for a broker's local spool (not yet persisted).
    url: str  # Signed URL of the persisted file, or "" (read it through a broker).
    spec: bytes  # The serialized pb.Fragment.

    def fragment(self) -> pb.Fragment:
        frag = pb.Fragment()
        frag.ParseFromString(self.spec)
        return frag


async def resolve_journals(
    client: JournalClient, journals: tuple[str, ...], selector: str, *, must_exist: bool = True
) -> list[str]:
    """The journals to read, sorted: those named (each must exist) or those selected."""
    return sorted(await journal_revisions(client, journals, selector, must_exist=must_exist))


async def journal_revisions(
    client: JournalClient, journals: tuple[str, ...], selector: str, *, must_exist: bool = True
) -> dict[str, int]:
    """The journals of `resolve_journals`, each with the create revision of its spec: the
    identity of the journal, which changes when it is deleted and created again."""
    if selector:
        listed = await list_specs(client, parse_selector(selector))
        return {j.spec.name: int(j.create_revision) for j in listed}
    listed = await list_specs(
        client, pb.LabelSelector(include=pb.LabelSet(labels=_name_labels(journals)))
    )
    found = {j.spec.name: int(j.create_revision) for j in listed}
    missing = [j for j in journals if j not in found]
    if missing and must_exist:
        raise JournalNotFound(detail=", ".join(missing))
    return {j: found[j] for j in journals if j in found}


async def list_specs(
    client: JournalClient, selector: pb.LabelSelector
) -> list[pb.ListResponse.Journal]:
    """The journals `selector` matches (across a broker restart: `retry_unavailable`)."""
    return await retry_unavailable("listing journals", lambda: list_journals(client, selector))


def _name_labels(journals: tuple[str, ...]) -> list[pb.Label]:
    return [pb.Label(name="name", value=j) for j in sorted(journals)]


async def write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head: the offset its next append will begin at."""
    head = await _read_head(client, journal)
    if head is None:
        return (await suspended_heads(client, [journal]))[journal]
    return head


async def _read_head(client: JournalClient, journal: str) -> int | None:
    """The write head a broker reads for the journal; None if it is answered SUSPENDED."""
    return await retry_unavailable(
        f"reading the write head of {journal}", lambda: _read_head_once(client, journal)
    )


async def _read_head_once(client: JournalClient, journal: str) -> int | None:
    call = client.rpc_read(read_request(journal, offset=LATEST, metadata_only=True))
    try:
        resp = await call.read()
    finally:
        call.cancel()
    if not isinstance(resp, pb.ReadResponse):
        raise invalid_response("Read", journal, "stream ended without a response")
    check_read_response(journal, resp)
    if resp.status == pb.SUSPENDED:
        return None
    if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
        raise error_for_status(
            resp.status, journal, resp.header if resp.HasField("header") else None
        )
    return int(resp.write_head)


async def suspended_heads(
    client: JournalClient, journals: list[str], *, absent_ok: frozenset[str] = frozenset()
) -> dict[str, int]:
    """The write heads of journals answered SUSPENDED: fully suspended, no broker serves them
    (as no fragment holds content), and each resumes at the offset its spec records. One List
    for them all (a List walks every journal of the cluster). A journal of `absent_ok` no
    longer listed is left out; any other is an error."""
    listed = await list_specs(
        client, pb.LabelSelector(include=pb.LabelSet(labels=_name_labels(tuple(journals))))
    )
    specs = {j.spec.name: j.spec for j in listed}
    out: dict[str, int] = {}
    for journal in journals:
        spec = specs.get(journal)
        if spec is None:
            if journal in absent_ok:
                continue
            raise JournalNotFound(detail=journal)
        if spec.suspend.level != pb.JournalSpec.Suspend.FULL:
            raise Suspended(detail=f"{journal} (its spec says it is not fully suspended)")
        out[journal] = int(spec.suspend.offset)
    return out


async def write_heads(
    client: JournalClient, journals: list[str], *, absent_ok: frozenset[str] = frozenset()
) -> dict[str, int]:
    """Each journal's write head. A journal of `absent_ok` that no broker serves (yet: one
    just created is listed before its first assignment reaches the broker asked; or one
    deleted since it was listed) is left out; any other such journal is an error."""

    async def head(journal: str) -> int | JournalNotFound | None:
        try:
            return await _read_head(client, journal)
        except JournalNotFound as exc:
            if journal in absent_ok:
                return exc
            raise

    heads = await _gather(head(j) for j in journals)
    out = {j: h for j, h in zip(journals, heads, strict=True) if isinstance(h, int)}
    suspended = [j for j, h in zip(journals, heads, strict=True) if h is None]
    if suspended:
        out.update(await suspended_heads(client, suspended, absent_ok=absent_ok))
    return {j: out[j] for j in journals if j in out}


async def fragments(client: JournalClient, journal: str) -> list[FragmentInfo]:
    """The journal's fragments in offset order, with signed URLs of persisted ones (none for
    a fully suspended journal: no fragment holds content)."""
    try:
        listed = await retry_unavailable(
            f"listing the fragments of {journal}",
            lambda: list_all_fragments(client, journal, signature_ttl=SIGNATURE_TTL_SECONDS),
        )
    except Suspended:
        return []
    out = []
    for entry in listed:
        frag = entry.spec
        out.append(
            FragmentInfo(
                journal=journal,
                begin=frag.begin,
                end=frag.end,
                mod_time=frag.mod_time,
                url=entry.signed_url if frag.backing_store else "",
                spec=frag.SerializeToString(),
            )
        )
    out.sort(key=lambda f: (f.begin, -f.end))
    return out


async def all_fragments(
    client: JournalClient, journals: list[str], *, absent_ok: bool = False
) -> dict[str, list[FragmentInfo]]:
    """Each journal's listing. With `absent_ok`, a journal that does not exist (deleted since
    it was listed) is left out; else it is an error."""

    async def listing(journal: str) -> list[FragmentInfo] | None:
        try:
            return await fragments(client, journal)
        except JournalNotFound:
            if absent_ok:
                return None
            raise

    listings = await _gather(listing(j) for j in journals)
    return {
        j: frags  # type: ignore[misc]
        for j, frags in zip(journals, listings, strict=True)
        if frags is not None
    }


async def _gather(coros: object) -> list[object]:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(coro: object) -> object:
        async with sem:
            return await coro  # type: ignore[misc]

    return list(await asyncio.gather(*(one(c) for c in coros)))  # type: ignore[attr-defined]


def earliest_offset(listing: list[FragmentInfo], head: int) -> int:
    """The first readable offset: the first fragment's begin (the head if there is none)."""
    return min((f.begin for f in listing if f.end > f.begin), default=head)


def offset_at_timestamp(listing: list[FragmentInfo], head: int, timestamp_ms: int) -> int:
    """The begin of the first fragment modified at or after `timestamp_ms` (a local spool,
    not yet persisted, counts as modified now); the head if there is none."""
    for frag in listing:
        if frag.end <= frag.begin:
            continue
        if frag.mod_time == 0 or frag.mod_time * 1000 >= timestamp_ms:
            return frag.begin
    return head


def resolve_offset(
    spec: OffsetSpec,
    journal: str,
    listing: list[FragmentInfo],
    head: int,
    *,
    timestamp_ms: int | None = None,
) -> int:
    """A concrete offset for `journal` from an offset spec (or a starting timestamp)."""
    if timestamp_ms is not None:
        return offset_at_timestamp(listing, head, timestamp_ms)
    offset = spec.for_journal(journal)
    if offset == EARLIEST:
        return earliest_offset(listing, head)
    if offset == LATEST:
        return head
    return offset
