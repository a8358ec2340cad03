"""Append edge cases the differential scenario leaves out, run against one broker of each
system on etcd and compared response by response (as tests/interop/test_differential.py):
explicit offsets (on an empty journal, past the head, with an empty append), suspend modes
on journals in use, partially and fully suspended, and their resumption, registers with
refused or empty appends, O_RDONLY / O_WRONLY journals, journals without stores, and a
journal whose store holds a fragment past every spool (INDEX_HAS_GREATER_OFFSET, rolled
forward by an explicit offset).

Left out as races, not differences: a suspended journal resumed by an append lacks brokers
until the allocator assigns them (either system may answer NO_JOURNAL_PRIMARY_BROKER or
INSUFFICIENT_JOURNAL_BROKERS meanwhile, which clients retry: those steps are retried until
otherwise answered), and the
route of the answer to a full suspension is the one before or after the allocator dropped
the journal's assignments."""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from pygazette.client import JournalClient
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from pygazette.protocol.stream_write import send_all
from tests.interop.scenario import (
    PREFIX,
    WAIT_SECONDS,
    Identity,
    Recording,
    Scenario,
    Step,
    appending,
    change,
    journal_spec,
    reading,
)
from tests.interop.test_differential import deliberate, describe, identity_of
from tests.support.broker_cluster import BrokerCluster
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker

NO_RESUME = pb.AppendRequest.SUSPEND_NO_RESUME
IF_FLUSHED = pb.AppendRequest.SUSPEND_IF_FLUSHED
NOW = pb.AppendRequest.SUSPEND_NOW


async def edges(
    address: str, ident: Identity, *, lone: bool = False, replication: int = 1
) -> Recording:
    """The steps' responses; `lone`: without the steps a lone pygazette broker (no etcd)
    answers otherwise on purpose (README, "Differences from Gazette": no suspension, and a
    journal it holds no spool of continues at the end of its persisted fragments)."""
    async with JournalClient(address) as client:
        s = Scenario(client, ident)
        specs = [
            journal_spec("e", pb.NONE),
            journal_spec("ro", pb.NONE),
            journal_spec("wo", pb.NONE),
            journal_spec("s", pb.NONE),
            journal_spec("f", pb.NONE),
            journal_spec("g", pb.NONE),
            journal_spec("h", pb.NONE),
            journal_spec("r", pb.NONE),
            journal_spec("z", pb.NONE),
            journal_spec("n", pb.NONE),
            journal_spec("m", pb.NONE),
        ]
        for spec in specs:
            spec.replication = replication
        for spec in specs[-2:]:  # Journals without stores.
            del spec.fragment.stores[:]
        specs[1].flags = pb.JournalSpec.O_RDONLY
        specs[2].flags = pb.JournalSpec.O_WRONLY
        specs[6].flags = pb.JournalSpec.O_RDONLY
        await s.apply("apply", [change(sp) for sp in specs])
        await s.wait_assigned([sp.name for sp in specs])
        for spec in specs:
            await until_route(client, spec.name[len(PREFIX) :], replication)

        await s.append("e: explicit offset on an empty journal", appending("e", offset=5), [b"x\n"])
        await s.append("e: first", appending("e"), [b"first\n"])
        await s.append("e: explicit offset past head", appending("e", offset=100), [b"x\n"])
        await s.append("e: explicit offset at head", appending("e", offset=6), [b"second\n"])
        await s.append("e: no-resume, not suspended", appending("e", suspend=NO_RESUME), [b"nr\n"])
        await s.append(
            "e: check registers, empty selector",
            appending("e", check_registers=parse_selector("")),
            [b"c\n"],
        )
        await s.append(
            "e: union with content refused (if-flushed)",
            appending("e", suspend=IF_FLUSHED, union_registers=label_set({"owner": "v"})),
            [b"refused\n"],
        )
        await s.append("e: registers after", appending("e"), [b"after\n"])
        await s.append("e: if-flushed, dirty, empty", appending("e", suspend=IF_FLUSHED), [])
        await s.append("e: empty, with offset at head", appending("e", offset=24), [])
        await s.append("e: empty, with offset not at head", appending("e", offset=3), [])
        await s.append(
            "e: subtract only, empty",
            appending("e", subtract_registers=label_set({"owner": "v"})),
            [],
        )
        await s.append("e: no commit chunk", appending("e"), [b"x"], commit=False)
        # Later requests carry content alone (Gazette validates each).
        for name, chunk in [
            ("registers", pb.AppendRequest(union_registers=label_set({"owner": "v"}))),
            ("a check", pb.AppendRequest(check_registers=parse_selector("owner=v"))),
            ("a suspend mode", pb.AppendRequest(suspend=NOW)),
            ("do-not-proxy", pb.AppendRequest(do_not_proxy=True)),
            ("an offset", pb.AppendRequest(offset=5)),
            ("the journal", pb.AppendRequest(journal=PREFIX + "e")),
            ("an invalid journal", pb.AppendRequest(journal="bad name")),
        ]:
            chunk.content = b"x\n" if name != "the journal" else b""
            await streamed(s, f"e: a chunk with {name}", appending("e"), [chunk])
        # First requests Gazette's validation refuses.
        bad_header = appending("e")
        bad_header.header.route.primary = 3
        bad_check = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="a", value="b")]))
        for name, first in [
            ("a negative offset", appending("e", offset=-1)),
            ("an unknown suspend mode", appending("e", suspend=9)),  # type: ignore[arg-type]
            ("an invalid check", appending("e", check_registers=bad_check)),
            ("an invalid header", bad_header),
        ]:
            await streamed(s, f"e: a first request with {name}", first, [])
        after = [pb.AppendRequest(content=b"x\n"), pb.AppendRequest(), pb.AppendRequest()]
        await streamed(s, "e: a request after the commit chunk", appending("e"), after)
        await s.read("e: nothing of them appended", reading("e", offset=18))

        await s.append("ro: empty", appending("ro"), [])
        await s.append(
            "ro: union, content", appending("ro", union_registers=label_set({"owner": "v"})), [b"x"]
        )
        await s.append("ro: explicit offset", appending("ro", offset=4), [])
        await s.append("wo: content", appending("wo"), [b"wo\n"])
        await s.read("wo: read", reading("wo"))
        await s.fragments("wo: fragments", pb.FragmentsRequest(journal=PREFIX + "wo"))
        await s.append("wo: with metadata", appending("wo;meta=1"), [b"meta\n"])
        await s.read("e: with metadata", reading("e;meta=1", offset=18))
        await s.fragments("ro: fragments", pb.FragmentsRequest(journal=PREFIX + "ro"))

        # Suspension.
        if not lone:
            await s.append("s: write", appending("s"), [b"one\n"])
            await s.append("s: suspend now", appending("s", suspend=NOW), [])
            await s.list("s: listed", f"name={PREFIX}s")
            await s.append("s: suspend now again", appending("s", suspend=NOW), [])
            await s.append("s: if-flushed while partial", appending("s", suspend=IF_FLUSHED), [])
            await s.append(
                "s: no-resume while partial", appending("s", suspend=NO_RESUME), [b"x\n"]
            )
            await retried(s, "s: resume by append", appending("s"), [b"two\n"])
            await s.list("s: listed after", f"name={PREFIX}s")

            await suspend_fully(s, "f: suspend empty journal", appending("f", suspend=IF_FLUSHED))
            await until_route(client, "f", 0)
            await s.list("f: listed", f"name={PREFIX}f")
            await s.append("f: no-resume while full", appending("f", suspend=NO_RESUME), [b"x\n"])
            await s.append("f: suspend again", appending("f", suspend=NOW), [])
            await retried(s, "f: explicit offset while full", appending("f", offset=7), [b"x\n"])
            await retried(s, "f: resume with content", appending("f"), [b"resumed\n"])
            await s.list("f: listed after", f"name={PREFIX}f")
            await s.read("f: read", reading("f"))

            # Journals without stores: suspended, and resumed.
            await s.append("n: one", appending("n"), [b"one\n"])
            await s.append("n: if flushed", appending("n", suspend=IF_FLUSHED), [])
            await s.append("n: now", appending("n", suspend=NOW), [])
            await s.list("n: listed", f"name={PREFIX}n")
            await s.fragments("n: fragments", pb.FragmentsRequest(journal=PREFIX + "n"))
            await retried(s, "n: resume", appending("n"), [b"two\n"])
            await s.read("n: read", reading("n"))
            await suspend_fully(s, "m: suspend empty journal", appending("m", suspend=NOW))
            await until_route(client, "m", 0)
            await retried(s, "m: resume", appending("m"), [b"m\n"])
            await s.read("m: read", reading("m"))

        # A spec changing its journal's codec between appends.
        await s.append("z: one", appending("z"), [b"one\n"])
        gzipped = journal_spec("z", pb.GZIP)
        gzipped.replication = replication
        await s.apply("z: to gzip", [change(gzipped, -1)])
        await s.append("z: two", appending("z"), [b"two\n"])
        await s.append("z: three", appending("z"), [b"three\n"])
        # Gazette lists a persisted fragment at its next store listing (README): wait for it.
        listing = await client.rpc_list_fragments(pb.FragmentsRequest(journal=PREFIX + "z"))
        await s.wait_persisted(PREFIX + "z", len(listing.fragments) - 1)
        await s.read("z: read", reading("z"))

        # A fragment in the store past every spool (GAP_END bytes, written there before
        # the journals were created).
        if lone:
            return s.rec
        await s.fragments("g: fragments", pb.FragmentsRequest(journal=PREFIX + "g"))
        await s.append("g: append", appending("g"), [b"x\n"])
        await s.append("g: explicit offset short", appending("g", offset=50), [b"x\n"])
        await s.append("g: empty", appending("g"), [])
        await s.append("g: explicit offset past", appending("g", offset=GAP_END + 1), [b"x\n"])
        await s.append("g: explicit offset at its end", appending("g", offset=GAP_END), [b"y\n"])
        await s.append("g: then plain", appending("g"), [b"z\n"])
        await s.read("g: read", reading("g", offset=GAP_END - 2))
        # gazctl journals reset-head: an empty append at the end of the fragments.
        await s.append("r: reset head", appending("r", offset=GAP_END), [])
        await s.append("r: then plain", appending("r"), [b"r\n"])
        await s.read("r: read", reading("r", offset=GAP_END - 1))
        await s.append("h: read-only, empty", appending("h"), [])
        await s.append("h: read-only, offset", appending("h", offset=GAP_END), [])
        await s.append("h: read-only, wrong offset", appending("h", offset=3), [])
        return s.rec


GAP_END = 100
# What a resumed journal answers until the allocator assigned it (clients retry them).
TRANSIENT = (pb.NO_JOURNAL_PRIMARY_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS)


def gap_fragment(store: Path, journal: str) -> None:
    content = b"g" * (GAP_END - 1) + b"\n"
    digest = hashlib.sha1(content).hexdigest()
    path = store / PREFIX / journal / f"{0:016x}-{GAP_END:016x}-{digest}.raw"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


async def until_route(client: JournalClient, name: str, members: int) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        req = pb.ListRequest(selector=parse_selector(f"name={PREFIX}{name}"))
        listing = [r async for r in client.rpc_list(req)]
        if len(listing[0].journals[0].route.members) == members:
            return
        assert time.monotonic() < deadline, listing
        await asyncio.sleep(0.05)


async def streamed(
    s: Scenario, name: str, first: pb.AppendRequest, requests: list[pb.AppendRequest]
) -> None:
    """An append of `first`, `requests` and a commit chunk, recorded as `Scenario.append`."""

    async def stream() -> AsyncIterator[pb.AppendRequest]:
        yield first
        for req in requests:
            yield req
        yield pb.AppendRequest()

    call = s.client.rpc_append()
    try:
        await send_all(call, stream())
        resp = await call
    except grpc.aio.AioRpcError as exc:
        s.record(name, s.rpc_error(exc))
        return
    s.record(name, s.norm(resp))


async def suspend_fully(s: Scenario, name: str, request: pb.AppendRequest) -> None:
    """An append suspending an empty journal fully (SUSPENDED), its route left out: the
    allocator drops the journal's assignments meanwhile, before or after the answer."""
    await s.append(name, request, [])
    observed = s.rec.steps[-1].observed
    if isinstance(observed, dict) and "header" in observed:
        observed["header"].pop("route", None)


async def retried(s: Scenario, name: str, request: pb.AppendRequest, chunks: list[bytes]) -> None:
    """An append retried (unrecorded) while the journal's route is still being built."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        scratch = Scenario(s.client, s.ident)
        resp = await scratch.append(name, request, chunks)
        if resp is None or resp.status not in TRANSIENT:
            s.rec.steps += scratch.rec.steps
            s.rec.problems += scratch.rec.problems
            return
        assert time.monotonic() < deadline, resp
        await asyncio.sleep(0.05)


def test_append_edges_match_gazette(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    async def record(url: str) -> Recording:
        return await edges(url, await identity_of(url))

    recordings = {}
    for system in ("gazette", "pygazette"):
        cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/edges", brokers=1)
        for journal in ("g", "h", "r"):
            gap_fragment(cluster.store, journal)
        cluster.start()
        try:
            recordings[system] = asyncio.run(record(cluster.endpoints[0]))
        finally:
            cluster.kill()
    ours, theirs = recordings["pygazette"], recordings["gazette"]
    compare(ours, theirs)


def test_append_edges_at_replication_two_match_gazette(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The same through the first of two brokers, each journal on both (appends proxied to
    primaries, replicated through pipelines or whole). Which broker is primary is the
    allocator's choice: headers and routes are left out."""

    async def record(url: str) -> Recording:
        return await edges(url, await identity_of(url), replication=2)

    recordings = {}
    for system in ("gazette", "pygazette"):
        cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/edges", brokers=2)
        for journal in ("g", "h", "r"):
            gap_fragment(cluster.store, journal)
        cluster.start()
        try:
            recordings[system] = asyncio.run(record(cluster.endpoints[0]))
        finally:
            cluster.kill()
    ours, theirs = (without_routes(recordings[k]) for k in ("pygazette", "gazette"))
    compare(ours, theirs)


def without_routes(rec: Recording) -> Recording:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("header", "route")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return Recording([Step(s.name, strip(s.observed)) for s in rec.steps], rec.problems)


def test_append_edges_of_a_lone_broker_match_gazette(
    pygazette: BrokerProcess, gazette: GazetteBroker
) -> None:
    async def record(url: str) -> Recording:
        return await edges(url, await identity_of(url), lone=True)

    async def both() -> tuple[Recording, Recording]:
        return await asyncio.gather(record(pygazette.url), record(gazette.url))

    ours, theirs = asyncio.run(both())
    compare(ours, theirs)


def compare(ours: Recording, theirs: Recording) -> None:
    assert theirs.problems == []
    assert ours.problems == []
    differences = []
    for mine, gaz in zip(ours.steps, theirs.steps, strict=True):
        expected = deliberate(mine.observed, gaz.observed)
        if mine.observed != expected:
            differences.append(f"--- {mine.name}")
            differences += difflib.unified_diff(
                describe(expected), describe(mine.observed), "gazette", "pygazette", lineterm=""
            )
    assert not differences, "\n".join(differences)
