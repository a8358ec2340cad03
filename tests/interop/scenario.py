"""The differential scenario: one scripted sequence of Journal RPCs, recorded response by response.

`run_scenario` drives a broker through raw RPCs (no client-side interpretation): applies and
conflicting applies, selector listings, appends with offsets and registers, reads at the edges
(offset -1, the write head, past it, end offsets, metadata-only, do-not-proxy), blocking reads
woken by later appends, unknown journals, invalid requests and fragment listings. Every
response is checked against Gazette's response validation rules (what Gazette's Go client
checks) and reduced to a comparable form: process ids, etcd revisions and times are replaced
by placeholders, and content chunks are coalesced (chunk sizes are the broker's choice).

Run against a pygazette broker and a Gazette broker, the two recordings must be equal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from google.protobuf import json_format
from google.protobuf.message import Message

from pygazette.client import JournalClient
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from pygazette.protocol.stream_write import send_all
from pygazette.protocol.validation import (
    validate_append_response,
    validate_apply_response,
    validate_fragments_response,
    validate_list_response,
    validate_read_response,
)

PREFIX = "diff/"
FRAGMENT_LENGTH = 1024
WAIT_SECONDS = 60.0


def journal_spec(name: str, codec: int, **labels: str) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=PREFIX + name, replication=1, labels=label_set(labels))
    spec.fragment.length = FRAGMENT_LENGTH
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec


def scenario_journals() -> list[pb.JournalSpec]:
    specs = [
        journal_spec("a", pb.NONE, topic="clicks", region="eu"),
        journal_spec("b", pb.SNAPPY, topic="clicks", region="us"),
        journal_spec("c", pb.GZIP, topic="logs"),
        journal_spec("read-only", pb.NONE, topic="logs", region="eu"),
        journal_spec("write-only", pb.NONE, topic="audit"),
    ]
    specs[3].flags = pb.JournalSpec.O_RDONLY
    specs[4].flags = pb.JournalSpec.O_WRONLY
    return specs


def record_content(journal: str, n: int, size: int) -> bytes:
    """Deterministic, varied, newline-terminated records of `size` bytes in all."""
    lines = []
    total, i = 0, 0
    while total < size:
        line = f"{journal} append {n:04d} line {i:06d} {i * 7919 % 100003:05x}\n".encode()
        lines.append(line)
        total += len(line)
        i += 1
    return b"".join(lines)[: size - 1] + b"\n"


# --- normalization ---------------------------------------------------------------------


@dataclass
class Identity:
    """What differs between brokers by construction, mapped to placeholders."""

    process: tuple[str, str] = ("", "")
    endpoint: str = ""


def _to_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _normalize(value: Any, ident: Identity) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "etcd" and isinstance(item, dict):
                # Cluster and member ids, revisions and raft terms are the store's.
                out[key] = "<etcd>"
            elif key in ("mod_revision", "create_revision"):
                out[key] = "<revision>" if item not in ("0", 0) else 0
            elif key == "mod_time":
                out[key] = "<time>" if item not in ("0", 0) else 0
            elif key in ("process_id",) or (
                isinstance(item, dict) and set(item) == {"zone", "suffix"}
            ):
                out[key] = _process(item, ident)
            elif key == "members" and isinstance(item, list):
                out[key] = [_process(m, ident) for m in item]
            elif key == "endpoints" and isinstance(item, list):
                out[key] = ["<self>" if e == ident.endpoint else e for e in item]
            else:
                out[key] = _normalize(item, ident)
        return out
    if isinstance(value, list):
        return [_normalize(v, ident) for v in value]
    return value


def _process(item: dict[str, str], ident: Identity) -> Any:
    if (item.get("zone", ""), item.get("suffix", "")) == ident.process:
        return "<self>"
    if not item.get("zone") and not item.get("suffix"):
        return "<none>"
    return item


# --- the recording -----------------------------------------------------------------------


@dataclass
class Step:
    name: str
    observed: Any


@dataclass
class Recording:
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # Responses Gazette's rules reject.


class Scenario:
    def __init__(self, client: JournalClient, ident: Identity) -> None:
        self.client = client
        self.ident = ident
        self.rec = Recording()

    def record(self, name: str, observed: Any) -> None:
        self.rec.steps.append(Step(name, observed))

    def norm(self, msg: Message) -> Any:
        return _normalize(_to_dict(msg), self.ident)

    def check(self, name: str, validator: Callable[[Any], None], msg: Message) -> None:
        try:
            validator(msg)
        except Exception as exc:
            self.rec.problems.append(f"{name}: {type(msg).__name__} fails validation: {exc}")

    @staticmethod
    def rpc_error(exc: grpc.aio.AioRpcError) -> dict[str, Any]:
        return {"grpc_code": exc.code().name, "details": exc.details()}

    # RPC wrappers -----------------------------------------------------------------------

    async def apply(self, name: str, changes: list[pb.ApplyRequest.Change]) -> None:
        try:
            resp = await self.client.rpc_apply(pb.ApplyRequest(changes=changes))
        except grpc.aio.AioRpcError as exc:
            self.record(name, self.rpc_error(exc))
            return
        self.check(name, validate_apply_response, resp)
        self.record(name, self.norm(resp))

    async def list(self, name: str, selector: str) -> None:
        req = pb.ListRequest()
        if selector:
            req.selector.CopyFrom(parse_selector(selector))
        try:
            responses = [r async for r in self.client.rpc_list(req)]
        except grpc.aio.AioRpcError as exc:
            self.record(name, self.rpc_error(exc))
            return
        for resp in responses:
            if resp.header.etcd.revision:  # A snapshot's first response (Gazette checks those).
                self.check(name, validate_list_response, resp)
        # A snapshot may span several responses: compare the journals it lists.
        journals = [self.norm(j) for r in responses for j in r.journals]
        head = self.norm(responses[0]) if responses else None
        if head is not None:
            head.pop("journals", None)
        self.record(name, {"first": head, "journals": journals})

    async def watch_snapshot(self, name: str, selector: str) -> None:
        """A watched List's first snapshot, through the empty response that ends it."""
        req = pb.ListRequest(selector=parse_selector(selector), watch=True)
        call = self.client.rpc_list(req, timeout=WAIT_SECONDS)
        out = []
        try:
            async for resp in call:
                if resp.header.etcd.revision:  # A snapshot's first response.
                    self.check(name, validate_list_response, resp)
                out.append(self.norm(resp))
                if not resp.journals and not resp.header.etcd.revision:
                    break  # The end of the snapshot: no journals, a zero-valued header.
        finally:
            call.cancel()
        self.record(name, out)

    async def append(
        self, name: str, request: pb.AppendRequest, chunks: list[bytes], *, commit: bool = True
    ) -> pb.AppendResponse | None:
        async def requests() -> AsyncIterator[pb.AppendRequest]:
            yield request
            for chunk in chunks:
                yield pb.AppendRequest(content=chunk)
            if commit:
                yield pb.AppendRequest()

        # Written as pygazette's clients write (`send_all`): a broker refusing the append
        # ends the stream while we write, and grpc.aio's own request-iterator writer then
        # reports INTERNAL "Internal error from Core" in place of the broker's status
        # (seen once against Gazette's broker in `make test`).
        call = self.client.rpc_append()
        try:
            await send_all(call, requests())
            resp = await call
        except grpc.aio.AioRpcError as exc:
            self.record(name, self.rpc_error(exc))
            return None
        self.check(name, validate_append_response, resp)
        self.record(name, self.norm(resp))
        return resp

    async def read(
        self, name: str, request: pb.ReadRequest, *, during: Callable[[], Any] | None = None
    ) -> list[Any]:
        """A Read RPC to its end, with content coalesced per fragment.

        `during` is awaited once the first response arrived (to append while a blocking
        read waits); a blocking read is given WAIT_SECONDS to end on its own (end_offset).
        """
        out: list[Any] = []
        call = self.client.rpc_read(request, timeout=WAIT_SECONDS)
        pending: asyncio.Task[Any] | None = None
        try:
            if during is not None:
                pending = asyncio.ensure_future(during())
            async for resp in call:
                self.check(name, validate_read_response, resp)
                if resp.content:
                    last = out[-1] if out else None
                    if isinstance(last, dict) and isinstance(last.get("data"), bytearray):
                        last["data"] += resp.content
                    else:
                        out.append({"offset": resp.offset, "data": bytearray(resp.content)})
                else:
                    out.append(self.norm(resp))
        except grpc.aio.AioRpcError as exc:
            out.append(self.rpc_error(exc))
        finally:
            if pending is not None:
                await pending
        for item in out:
            if isinstance(item, dict) and isinstance(item.get("data"), bytearray):
                item["data"] = item["data"].decode("utf-8", "backslashreplace")
        self.record(name, out)
        return out

    async def fragments(
        self, name: str, request: pb.FragmentsRequest
    ) -> pb.FragmentsResponse | None:
        try:
            resp = await self.client.rpc_list_fragments(request)
        except grpc.aio.AioRpcError as exc:
            self.record(name, self.rpc_error(exc))
            return None
        self.check(name, validate_fragments_response, resp)
        self.record(name, self.norm(resp))
        return resp

    # Waiting on the broker (not recorded) ------------------------------------------------

    async def wait_assigned(self, names: list[str]) -> None:
        """Until every journal has a primary: Gazette assigns new journals asynchronously."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            req = pb.ListRequest(selector=parse_selector(f"prefix={PREFIX}"))
            listed = {
                j.spec.name: j.route.primary
                async for r in self.client.rpc_list(req)
                for j in r.journals
            }
            if all(listed.get(n, -1) >= 0 for n in names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"journals not assigned: {listed}")
            await asyncio.sleep(0.05)

    async def wait_persisted(self, journal: str, count: int) -> None:
        """Until the first `count` fragments of the journal are listed as persisted."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            resp = await self.client.rpc_list_fragments(pb.FragmentsRequest(journal=journal))
            frags = [f.spec for f in resp.fragments]
            if len(frags) >= count and all(f.backing_store for f in frags[:count]):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{journal}: fragments not persisted: {frags}")
            await asyncio.sleep(0.1)


def change(spec: pb.JournalSpec, expect: int = 0) -> pb.ApplyRequest.Change:
    return pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=expect)


def appending(journal: str, **kwargs: Any) -> pb.AppendRequest:
    return pb.AppendRequest(journal=PREFIX + journal, **kwargs)


def reading(journal: str, **kwargs: Any) -> pb.ReadRequest:
    return pb.ReadRequest(journal=PREFIX + journal, **kwargs)


# The appends that build multi-fragment journals: (journal, sizes of successive appends).
# The sizes exercise Gazette's roll rules: the first append sits alone in its fragment, a
# spool rolls once it holds more than fragment.length, and never splits an append.
BULK_APPENDS: dict[str, list[int]] = {
    "a": [700, 300, 24, 1, 1500, 200, 600, 100],
    "b": [1024, 1024, 1, 4000, 150_000, 10, 20],
    "c": [100, 2000, 3000, 50],
}


async def run_scenario(address: str, ident: Identity) -> Recording:
    async with JournalClient(address) as client:
        s = Scenario(client, ident)
        specs = scenario_journals()
        names = [sp.name for sp in specs]

        # Apply.
        await s.apply("apply: create journals", [change(sp) for sp in specs])
        await s.wait_assigned(names)
        await s.apply("apply: create again (stale revision)", [change(specs[0])])
        bad = pb.JournalSpec()
        bad.CopyFrom(specs[0])
        bad.name = PREFIX + "bad name"
        await s.apply("apply: invalid name", [change(bad)])
        await s.apply(
            "apply: delete unknown journal",
            [pb.ApplyRequest.Change(delete=PREFIX + "nope", expect_mod_revision=0)],
        )
        await s.apply("apply: no changes", [])
        short = pb.JournalSpec()
        short.CopyFrom(specs[0])
        short.fragment.length = 100
        await s.apply("apply: fragment too short", [change(short)])
        gzod = pb.JournalSpec()
        gzod.CopyFrom(specs[0])
        gzod.fragment.compression_codec = pb.GZIP_OFFLOAD_DECOMPRESSION
        await s.apply("apply: offloaded gzip in a file store", [change(gzod)])
        unlabelled = pb.JournalSpec()
        unlabelled.CopyFrom(specs[0])
        unlabelled.labels.labels.add(name="name", value="x")
        await s.apply("apply: reserved label", [change(unlabelled)])

        # List with selectors.
        for selector in [
            f"prefix={PREFIX}",
            f"name={PREFIX}a",
            f"name={PREFIX}nope",
            "topic=clicks",
            "topic in (clicks, logs), region!=us",
            f"prefix={PREFIX}, !region",
            "region",
            f"name in ({PREFIX}a, {PREFIX}c)",
            f"prefix={PREFIX}, topic notin (clicks)",
        ]:
            await s.list(f"list: {selector}", selector)
        await s.watch_snapshot("list: watch", "topic=logs")
        bad_selector = pb.ListRequest()
        bad_selector.selector.include.labels.add(name="bad label!", value="x")
        try:
            resp = await client.rpc_list(bad_selector).read()
            s.record("list: invalid selector", s.norm(resp) if resp else None)
        except grpc.aio.AioRpcError as exc:
            s.record("list: invalid selector", s.rpc_error(exc))

        # Appends: offsets, registers, refusals.
        await s.append("append: first", appending("a"), [b"hello, "])
        await s.append("append: at explicit offset", appending("a", offset=7), [b"world\n"])
        await s.append("append: wrong offset", appending("a", offset=3), [b"nope\n"])
        await s.append(
            "append: check registers while empty",
            appending("a", check_registers=parse_selector("owner=bob")),
            [b"unchecked\n"],
        )
        await s.append(
            "append: union registers",
            appending("a", union_registers=label_set({"owner": "alice"})),
            [b"owned\n"],
        )
        await s.append(
            "append: register mismatch",
            appending("a", check_registers=parse_selector("owner=bob")),
            [b"refused\n"],
        )
        await s.append(
            "append: check and subtract registers",
            appending(
                "a",
                check_registers=parse_selector("owner=alice"),
                subtract_registers=label_set({"owner": "alice"}),
            ),
            [b"released\n"],
        )
        await s.append(
            "append: subtract and union the same register",
            appending(
                "a",
                union_registers=label_set({"owner": "dave"}),
                subtract_registers=label_set({"owner": "dave"}),
            ),
            [b"both\n"],
        )
        await s.append(
            "append: subtract and union",
            appending(
                "a",
                union_registers=label_set({"owner": "erin"}),
                subtract_registers=label_set({"owner": "dave"}),
            ),
            [b"swap\n"],
        )
        await s.append("append: empty", appending("a"), [])
        await s.append(
            "append: empty with registers",
            appending("a", union_registers=label_set({"owner": "carol"})),
            [],
        )
        await s.append("append: several chunks", appending("a"), [b"one ", b"two ", b"three\n"])
        await s.append("append: unknown journal", appending("nope"), [b"x"])
        await s.append("append: read-only journal", appending("read-only"), [b"x"])
        await s.append("append: invalid journal name", appending("bad name"), [b"x"])
        await s.append("append: aborted", appending("a"), [b"never"], commit=False)

        for journal, sizes in BULK_APPENDS.items():
            for n, size in enumerate(sizes):
                chunks = [record_content(journal, n, size)]
                await s.append(f"append: {journal} bulk {n}", appending(journal), chunks)

        # Gazette persists a rolled spool at once but lists it as persisted only after its
        # next store listing; pygazette lists it at once. Wait for both to agree.
        for journal in BULK_APPENDS:
            # Every fragment but the open spool has been rolled.
            listing = await client.rpc_list_fragments(pb.FragmentsRequest(journal=PREFIX + journal))
            await s.wait_persisted(PREFIX + journal, len(listing.fragments) - 1)
        head = 0
        resp = await client.rpc_list_fragments(pb.FragmentsRequest(journal=PREFIX + "a"))
        if resp.fragments:
            head = resp.fragments[-1].spec.end

        # Non-blocking reads at the edges.
        await s.read("read: from 0", reading("a"))
        await s.read("read: range", reading("a", offset=3, end_offset=12))
        await s.read("read: end offset at a boundary", reading("a", offset=0, end_offset=7))
        await s.read("read: empty range", reading("a", offset=5, end_offset=5))
        await s.read("read: offset -1", reading("a", offset=-1))
        await s.read("read: at the write head", reading("a", offset=head))
        await s.read("read: past the write head", reading("a", offset=head + 100))
        await s.read("read: metadata only", reading("a", offset=10, metadata_only=True))
        await s.read("read: last byte", reading("a", offset=head - 1))
        await s.read("read: b from 0", reading("b"))
        await s.read("read: c from 1000", reading("c", offset=1000))
        await s.read("read: unknown journal", reading("nope"))
        await s.read("read: write-only journal", reading("write-only"))
        await s.read("read: invalid offset", reading("a", offset=-2))
        await s.read("read: end before offset", reading("a", offset=10, end_offset=5))

        for journal in BULK_APPENDS:
            await s.fragments(
                f"fragments: {journal}", pb.FragmentsRequest(journal=PREFIX + journal)
            )
        await s.read("read: do not proxy", reading("a", offset=2, do_not_proxy=True))
        token = 0
        for page in range(10):
            resp = await s.fragments(
                f"fragments: page {page}",
                pb.FragmentsRequest(journal=PREFIX + "b", page_limit=2, next_page_token=token),
            )
            if resp is None or not resp.next_page_token:
                break
            token = resp.next_page_token
        now = int(time.time())
        await s.fragments(
            "fragments: persisted since an hour ago",
            pb.FragmentsRequest(journal=PREFIX + "a", begin_mod_time=now - 3600),
        )
        await s.fragments(
            "fragments: persisted until in an hour",
            pb.FragmentsRequest(journal=PREFIX + "a", end_mod_time=now + 3600),
        )
        await s.fragments(
            "fragments: persisted before an hour ago",
            pb.FragmentsRequest(journal=PREFIX + "a", end_mod_time=now - 3600),
        )
        await s.fragments(
            "fragments: a time range, paged",
            pb.FragmentsRequest(
                journal=PREFIX + "b", begin_mod_time=1, end_mod_time=now + 3600, page_limit=2
            ),
        )
        signed = pb.FragmentsRequest(journal=PREFIX + "c")
        signed.signatureTTL.seconds = 60
        await s.fragments("fragments: signed urls", signed)
        await s.fragments(
            "fragments: unknown journal", pb.FragmentsRequest(journal=PREFIX + "nope")
        )
        await s.fragments(
            "fragments: page limit too large",
            pb.FragmentsRequest(journal=PREFIX + "a", page_limit=100_000),
        )
        await s.fragments(
            "fragments: invalid mod times",
            pb.FragmentsRequest(journal=PREFIX + "a", begin_mod_time=20, end_mod_time=10),
        )

        # Blocking reads, woken by later appends.
        listing = await client.rpc_list_fragments(pb.FragmentsRequest(journal=PREFIX + "a"))
        head = listing.fragments[-1].spec.end
        later = b"later\n"

        async def append_later() -> None:
            await asyncio.sleep(0.3)
            await client.rpc_append(_stream(appending("a"), [later]))

        await s.read(
            "read: blocking at the head",
            reading("a", offset=head, block=True, end_offset=head + len(later)),
            during=append_later,
        )
        await s.read(
            "read: blocking, -1",
            reading("a", offset=-1, block=True, end_offset=head + 2 * len(later)),
            during=append_later,
        )
        return s.rec


async def _stream(first: pb.AppendRequest, chunks: list[bytes]) -> AsyncIterator[pb.AppendRequest]:
    yield first
    for chunk in chunks:
        yield pb.AppendRequest(content=chunk)
    yield pb.AppendRequest()
