"""Read edge cases the differential scenario leaves out, run against two brokers of each
system on etcd and compared response by response (as tests/interop/test_differential.py):
reads at and around fragment boundaries of each codec, end offsets inside, at and past
fragments and the write head, metadata-only and do-not-proxy reads of persisted fragments
and of spools, begin_mod_time, reads inside gaps of a journal's store (young and old),
before its first fragment, blocking reads woken by a store listing, suspended journals and
do-not-proxy reads sent to a broker that holds no replica.

Headers and routes are left out: which broker holds a journal is the allocator's choice."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from pathlib import Path

from pygazette.client import JournalClient, append
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.selector import parse_selector
from tests.interop.scenario import (
    PREFIX,
    WAIT_SECONDS,
    Identity,
    Recording,
    Scenario,
    appending,
    change,
    journal_spec,
    reading,
)
from tests.interop.test_append_edges_vs_gazette import compare, without_routes
from tests.interop.test_differential import identity_of
from tests.support.broker_cluster import BrokerCluster
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker

CODECS = {"n": pb.NONE, "s": pb.SNAPPY, "g": pb.GZIP}
SIZES = [700, 300, 24, 1500, 100]


def store_fragment(store: Path, journal: str, begin: int, end: int, age: float = 0) -> None:
    content = bytes([ord("a") + begin // 100 % 26]) * (end - begin - 1) + b"\n"
    digest = hashlib.sha1(content).hexdigest()
    path = store / PREFIX / journal / f"{begin:016x}-{end:016x}-{digest}.raw"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    if age:
        then = time.time() - age
        os.utime(path, (then, then))


def content(journal: str, n: int, size: int) -> bytes:
    line = f"{journal}{n}".encode()
    return (line * size)[: size - 1] + b"\n"


async def member_endpoint(client: JournalClient, journal: str) -> str:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        req = pb.ListRequest(selector=parse_selector(f"name={PREFIX}{journal}"))
        listing = [r async for r in client.rpc_list(req)]
        route = listing[0].journals[0].route
        if route.primary >= 0 and route.endpoints:
            return route.endpoints[route.primary]
        assert time.monotonic() < deadline, listing
        await asyncio.sleep(0.05)


async def edges(
    endpoints: list[str], ident: Identity, store: Path, *, lone: bool = False
) -> Recording:
    """The steps' responses; `lone`: without those a lone pygazette broker (no etcd) answers
    otherwise on purpose (no suspension, no second broker)."""
    async with contextlib.AsyncExitStack() as stack:
        clients = {e: await stack.enter_async_context(JournalClient(e)) for e in endpoints}
        client = clients[endpoints[0]]
        s = Scenario(client, ident)
        specs = [journal_spec(name, codec) for name, codec in CODECS.items()]
        specs += [journal_spec(name, pb.NONE) for name in ("young", "old", "late", "w", "sus")]
        partial = journal_spec("ps", pb.NONE)
        partial.replication = 2
        specs.append(partial)
        await s.apply("apply", [change(sp) for sp in specs])
        await s.wait_assigned([sp.name for sp in specs])

        for name in CODECS:
            for n, size in enumerate(SIZES):
                await s.append(f"{name}: append {n}", appending(name), [content(name, n, size)])
            listing = await client.rpc_list_fragments(pb.FragmentsRequest(journal=PREFIX + name))
            await s.wait_persisted(PREFIX + name, len(listing.fragments) - 1)
        head = sum(SIZES)
        for name in CODECS:
            member = await member_endpoint(client, name)
            direct = Scenario(clients[member], ident)
            direct.rec = s.rec
            listing = await client.rpc_list_fragments(pb.FragmentsRequest(journal=PREFIX + name))
            bounds = sorted({f.spec.begin for f in listing.fragments} - {0})
            await s.fragments(f"{name}: fragments", pb.FragmentsRequest(journal=PREFIX + name))
            for b in bounds:
                await s.read(f"{name}: at {b}", reading(name, offset=b))
                await s.read(f"{name}: before {b}", reading(name, offset=b - 1, end_offset=b + 1))
                await s.read(f"{name}: to {b}", reading(name, offset=b - 5, end_offset=b))
                await s.read(f"{name}: at {b} to it", reading(name, offset=b, end_offset=b))
                await s.read(
                    f"{name}: metadata at {b}", reading(name, offset=b, metadata_only=True)
                )
                await direct.read(
                    f"{name}: no proxy at {b}", reading(name, offset=b, do_not_proxy=True)
                )
            await s.read(f"{name}: past the head", reading(name, offset=10, end_offset=head + 5))
            await s.read(f"{name}: metadata -1", reading(name, offset=-1, metadata_only=True))
            await s.read(
                f"{name}: metadata at the head", reading(name, offset=head, metadata_only=True)
            )
            await s.read(
                f"{name}: metadata past the head",
                reading(name, offset=head + 3, metadata_only=True),
            )
            await s.read(f"{name}: -1 to the head", reading(name, offset=-1, end_offset=head))
            await direct.read(
                f"{name}: no proxy, spool", reading(name, offset=head - 3, do_not_proxy=True)
            )
            await s.read(
                f"{name}: persisted since later",
                reading(name, offset=0, begin_mod_time=int(time.time()) + 3600),
            )
            await s.read(
                f"{name}: persisted since long ago",
                reading(name, offset=5, begin_mod_time=1, end_offset=800),
            )
            await s.read(
                f"{name}: metadata, persisted since later",
                reading(name, offset=0, metadata_only=True, begin_mod_time=int(time.time()) + 3600),
            )

        # Gaps in the store (fragments written before the journals were created).
        for name in ("young", "old"):
            await s.fragments(f"{name}: fragments", pb.FragmentsRequest(journal=PREFIX + name))
            await s.read(f"{name}: from 0", reading(name))
            await s.read(f"{name}: in the gap", reading(name, offset=150))
            await s.read(
                f"{name}: in the gap, metadata", reading(name, offset=150, metadata_only=True)
            )
            await s.read(f"{name}: at the gap", reading(name, offset=100, end_offset=250))
            if not lone:  # A lone pygazette broker appends at the end of the store.
                await s.append(f"{name}: append", appending(name), [b"after\n"])
            await s.read(f"{name}: after append", reading(name, offset=290))
        await s.read("late: from 0", reading("late"))
        await s.read("late: from 0, metadata", reading("late", metadata_only=True))
        await s.read("late: from 0, to 50", reading("late", end_offset=50))
        await s.read("late: from 0, to 150", reading("late", end_offset=150))
        await s.read("late: past", reading("late", offset=250))
        await s.read("late: -1", reading("late", offset=-1))

        # A blocking read woken by a store listing.
        async def persist_later() -> None:
            await asyncio.sleep(0.5)
            store_fragment(store, "w", 100, 200)

        await s.read(
            "w: blocking at the end of the store",
            reading("w", offset=100, block=True, end_offset=150),
            during=persist_later,
        )

        # Blocking reads at the head woken by appends that roll the spool.
        n_member = await member_endpoint(client, "n")
        direct = Scenario(clients[n_member], ident)
        direct.rec = s.rec
        appends = [content("n", 10 + i, 1500) for i in range(3)]

        async def append_later(chunks: list[bytes]) -> None:
            await asyncio.sleep(0.3)
            for chunk in chunks:
                await append(clients[n_member], PREFIX + "n", chunk)

        await direct.read(
            "n: blocking at the head, through three appends",
            reading("n", offset=head, block=True, end_offset=head + 4000),
            during=lambda: append_later(appends),
        )
        head += 4500
        await direct.read(
            "n: metadata, blocking at the head",
            reading("n", offset=head, block=True, metadata_only=True),
            during=lambda: append_later([b"m\n"]),
        )
        await direct.read(
            "n: -1, blocking, to its end",
            reading("n", offset=-1, block=True, end_offset=head + 2 + 10),
            during=lambda: append_later([b"0123456789abcdef\n"]),
        )

        if lone:
            return s.rec

        # A fully suspended journal.
        await s.append("sus: suspend", appending("sus", suspend=pb.AppendRequest.SUSPEND_NOW), [])
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            req = pb.ListRequest(selector=parse_selector(f"name={PREFIX}sus"))
            listed = [r async for r in client.rpc_list(req)]
            route = listed[0].journals[0].route
            if not route.members:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await s.read("sus: read", reading("sus"))
        await s.read("sus: read, blocking", reading("sus", block=True))
        await s.read("sus: read -1", reading("sus", offset=-1))

        # A partially suspended journal (its content persisted, one member left).
        await s.append("ps: append", appending("ps"), [b"partial\n"])
        await s.append("ps: suspend", appending("ps", suspend=pb.AppendRequest.SUSPEND_NOW), [])
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            req = pb.ListRequest(selector=parse_selector(f"name={PREFIX}ps"))
            listed = [r async for r in client.rpc_list(req)]
            if len(listed[0].journals[0].route.members) == 1:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await s.wait_persisted(PREFIX + "ps", 1)  # Gazette lists it at its next listing.
        await s.fragments("ps: fragments", pb.FragmentsRequest(journal=PREFIX + "ps"))
        await s.read("ps: read", reading("ps"))
        await s.read("ps: read -1", reading("ps", offset=-1))
        await s.read("ps: metadata", reading("ps", offset=3, metadata_only=True))
        await s.read("ps: past the head", reading("ps", offset=9))

        # do_not_proxy to a broker holding no replica.
        member = await member_endpoint(client, "n")
        other = Scenario(clients[next(e for e in endpoints if e != member)], ident)
        other.rec = s.rec
        await other.read("n: no proxy, elsewhere", reading("n", offset=0, do_not_proxy=True))
        await other.read("n: proxied", reading("n", offset=0, end_offset=10))
        return s.rec


def seed(store: Path) -> None:
    store_fragment(store, "young", 0, 100)
    store_fragment(store, "young", 200, 300)
    store_fragment(store, "old", 0, 100, age=7 * 3600)
    store_fragment(store, "old", 200, 300, age=7 * 3600)
    store_fragment(store, "late", 100, 200)
    store_fragment(store, "w", 0, 100)


def test_read_edges_match_gazette(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    recordings = {}
    for system in ("gazette", "pygazette"):
        cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/reads", brokers=2)
        seed(cluster.store)
        cluster.start()
        try:

            async def record(c: BrokerCluster = cluster) -> Recording:
                return await edges(c.endpoints, await identity_of(c.endpoints[0]), c.store)

            recordings[system] = asyncio.run(record())
        finally:
            cluster.kill()
    ours, theirs = (without_routes(recordings[k]) for k in ("pygazette", "gazette"))
    compare(ours, theirs)


def test_read_edges_of_a_lone_broker_match_gazette(
    pygazette: BrokerProcess, gazette: GazetteBroker
) -> None:
    """The same against a lone broker of each system (pygazette's without etcd), up to the
    suspensions and a second broker."""
    for broker in (pygazette, gazette):
        seed(broker.file_root)

    async def record(broker: BrokerProcess | GazetteBroker) -> Recording:
        ident = await identity_of(broker.url)
        return await edges([broker.url], ident, broker.file_root, lone=True)

    async def both() -> tuple[Recording, Recording]:
        return await asyncio.gather(record(pygazette), record(gazette))

    ours, theirs = asyncio.run(both())
    compare(without_routes(ours), without_routes(theirs))
