"""Cluster resolution on a keyspace built by hand: routes, statuses, who serves, proxy headers."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pygazette.allocator.allocator import ObservedState
from pygazette.allocator.request_fence import ResolveError
from pygazette.broker.allocation import JournalDecoder, route_value
from pygazette.broker.cluster_member import ClusterMember
from pygazette.broker.cluster_resolver import ClusterResolver
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.resolver import BrokerIdentity
from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Delete, Put
from pygazette.keyspace.layout import AssignmentKey, KeyLayout
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.stores.store import StoreRegistry
from tests.broker.rpc_helpers import journal_spec

LAYOUT = KeyLayout()
LOCAL = BrokerIdentity("zone-a", "local-broker", "http://127.0.0.1:1")


def _broker(zone: str, suffix: str, port: int) -> bytes:
    spec = pb.BrokerSpec(journal_limit=10)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    spec.process_spec.endpoint = f"http://127.0.0.1:{port}"
    return spec.SerializeToString()


@pytest.fixture
async def resolver(tmp_path: Path) -> AsyncIterator[ClusterResolver]:
    ks = EmbeddedKeyspace(tmp_path / "keyspace.json")
    await ks.txn(
        [],
        [
            Put(LAYOUT.member_key("zone-a", "local-broker"), _broker("zone-a", "local-broker", 1)),
            Put(LAYOUT.member_key("zone-b", "peer-broker"), _broker("zone-b", "peer-broker", 2)),
            Put(LAYOUT.member_key("zone-a", "near-broker"), _broker("zone-a", "near-broker", 3)),
        ],
    )
    decoder = JournalDecoder(LAYOUT)
    observed = ObservedState(ks, LAYOUT, decoder, LAYOUT.member_key("zone-a", "local-broker"))
    (tmp_path / "store").mkdir(exist_ok=True)  # A file store's directory must exist.
    persister = Persister(StoreRegistry(tmp_path / "store"), tmp_path / "scratch")
    r = ClusterResolver(
        ks,
        LOCAL,
        layout=LAYOUT,
        observed=observed,
        decoder=decoder,
        spool_root=tmp_path / "spools",
        stores=persister.stores,
        persister=persister,
        sync=False,
    )
    r.start()
    yield r
    await r.stop()


async def _journal(r: ClusterResolver, name: str, members: list[tuple[str, str, int]]) -> None:
    ops = [
        Put(
            LAYOUT.item_key(name),
            journal_spec(name, replication=len(members) or 1).SerializeToString(),
        )
    ]
    for zone, suffix, slot in members:
        ops.append(Put(LAYOUT.assignment_key(AssignmentKey(name, zone, suffix, slot)), b""))
    await r.keyspace.txn([], ops)


async def test_statuses_and_targets(resolver: ClusterResolver) -> None:
    r = resolver
    res = await r.resolve_journal("no/such", require_primary=True, may_proxy=True)
    assert res.status == pb.JOURNAL_NOT_FOUND
    assert res.header.process_id.suffix == "local-broker"

    await _journal(r, "none/assigned", [])
    res = await r.resolve_journal("none/assigned", require_primary=False, may_proxy=True)
    assert res.status == pb.INSUFFICIENT_JOURNAL_BROKERS

    await _journal(r, "no/primary", [("zone-b", "peer-broker", 1), ("zone-a", "near-broker", 2)])
    res = await r.resolve_journal("no/primary", require_primary=True, may_proxy=True)
    assert res.status == pb.NO_JOURNAL_PRIMARY_BROKER
    # A read may go to a member: the one in this broker's zone.
    res = await r.resolve_journal("no/primary", require_primary=False, may_proxy=True)
    assert res.status == pb.OK and res.header.process_id.suffix == "near-broker"
    assert list(res.route.endpoints) == ["http://127.0.0.1:3", "http://127.0.0.1:2"]

    await _journal(r, "remote/one", [("zone-b", "peer-broker", 0), ("zone-a", "near-broker", 1)])
    res = await r.resolve_journal("remote/one", require_primary=True, may_proxy=True)
    assert res.status == pb.OK and not res.local
    assert res.header.process_id.suffix == "peer-broker"
    assert res.route.primary == 1  # Members in key order: near-broker (zone-a), peer-broker.
    res = await r.resolve_journal("remote/one", require_primary=True, may_proxy=False)
    assert res.status == pb.NOT_JOURNAL_PRIMARY_BROKER
    assert res.header.process_id.suffix == "local-broker"
    res = await r.resolve_journal("remote/one", require_primary=False, may_proxy=False)
    assert res.status == pb.NOT_JOURNAL_BROKER
    res = await r.resolve_journal(
        "remote/one", require_primary=False, may_proxy=True, prefer_primary=True
    )
    assert res.header.process_id.suffix == "peer-broker"

    await _journal(r, "local/one", [("zone-a", "local-broker", 0), ("zone-b", "peer-broker", 1)])
    res = await r.resolve_journal("local/one", require_primary=True, may_proxy=False)
    assert res.status == pb.OK and res.local and res.replica is not None
    assert res.replica.primary
    assert res.header.etcd.revision == r.keyspace.revision


async def test_proxy_headers_are_checked(resolver: ClusterResolver) -> None:
    r = resolver
    await _journal(r, "local/one", [("zone-a", "local-broker", 0)])
    hdr = pb.Header()
    hdr.process_id.zone, hdr.process_id.suffix = "zone-b", "peer-broker"
    with pytest.raises(ResolveError, match="process ID"):
        await r.resolve_journal("local/one", require_primary=True, may_proxy=True, proxy_header=hdr)
    hdr = pb.Header()
    hdr.etcd.cluster_id = r.keyspace.identity.cluster_id + 1
    with pytest.raises(ResolveError, match="cluster ID"):
        await r.resolve_journal("local/one", require_primary=True, may_proxy=True, proxy_header=hdr)
    # A proxying peer's revision is waited for.
    hdr = pb.Header()
    hdr.etcd.revision = r.keyspace.revision + 1

    async def bump() -> None:
        await r.keyspace.txn([], [Put(LAYOUT.items_prefix + "unrelated", b"x")])

    task = asyncio.create_task(bump())
    res = await r.resolve_journal(
        "local/one", require_primary=True, may_proxy=True, proxy_header=hdr
    )
    await task
    assert res.header.etcd.revision >= hdr.etcd.revision


async def test_advertised_routes_and_suspension(resolver: ClusterResolver) -> None:
    r = resolver
    await _journal(r, "local/one", [("zone-a", "local-broker", 0)])
    res = await r.resolve_journal("local/one", require_primary=True, may_proxy=True)
    value = route_value(res.route)
    parsed = pb.Route()
    parsed.ParseFromString(value)
    assert not parsed.endpoints and [m.suffix for m in parsed.members] == ["local-broker"]
    spec = journal_spec("local/one")
    spec.suspend.level = pb.JournalSpec.Suspend.FULL
    await r.keyspace.txn([], [Put(LAYOUT.item_key("local/one"), spec.SerializeToString())])
    res = await r.resolve_journal("local/one", require_primary=True, may_proxy=True)
    assert res.status == pb.SUSPENDED


async def test_journal_route_is_remembered_until_assignments_or_members_change(
    resolver: ClusterResolver,
) -> None:
    r = resolver
    await _journal(r, "a/one", [("zone-a", "local-broker", 0), ("zone-b", "peer-broker", 1)])
    await _journal(r, "a/two", [("zone-b", "peer-broker", 0)])
    first = r.journal_route(r.observed.current, "a/one")
    assert list(first.endpoints) == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert first.primary == 0

    # Another journal's change: the same route object, not rebuilt.
    await _journal(r, "a/two", [("zone-b", "peer-broker", 0), ("zone-a", "near-broker", 1)])
    assert r.journal_route(r.observed.current, "a/one") is first

    # Its own assignments change: a new route.
    await r.keyspace.txn(
        [],
        [
            Put(
                LAYOUT.assignment_key(AssignmentKey("a/one", "zone-a", "near-broker", 2)),
                b"",
            )
        ],
    )
    grown = r.journal_route(r.observed.current, "a/one")
    assert grown is not first
    assert [m.suffix for m in grown.members] == ["local-broker", "near-broker", "peer-broker"]

    # A member moves to another endpoint: the route names the new one.
    await r.keyspace.txn(
        [], [Put(LAYOUT.member_key("zone-b", "peer-broker"), _broker("zone-b", "peer-broker", 9))]
    )
    moved = r.journal_route(r.observed.current, "a/one")
    assert list(moved.endpoints) == [
        "http://127.0.0.1:1",
        "http://127.0.0.1:3",
        "http://127.0.0.1:9",
    ]
    # An unassigned journal has the empty route.
    assert r.journal_route(r.observed.current, "no/such").primary == -1


async def test_a_metadata_suffix_resolves_the_journal(resolver: ClusterResolver) -> None:
    """`<journal>;<meta>` resolves as `<journal>` (Gazette's resolver strips it): its route,
    and its local replica."""
    r = resolver
    await _journal(r, "local/meta", [("zone-a", "local-broker", 0), ("zone-b", "peer-broker", 1)])
    res = await r.resolve_journal("local/meta;reader/a", require_primary=True, may_proxy=False)
    assert res.status == pb.OK and res.local and res.replica is not None
    assert res.replica.name == "local/meta"
    assert len(res.route.members) == 2


async def test_a_replica_that_cannot_start_is_started_once_it_can(
    resolver: ClusterResolver,
) -> None:
    """A journal assigned here whose replica fails to start (its spools can't be listed: an
    EIO, EMFILE, or here a file where its spool directory goes) is not served half-built,
    doesn't keep the journals synced with it from starting, and starts once it can. The
    failure escaped the resolver's keyspace listener: the journal was left registered without
    its replicated spool, the items touched with it were never synced, and neither was it
    again until its keys next changed."""
    from pygazette.broker.replica import spool_directory

    r = resolver
    blocked = spool_directory(r.spool_root, "a/blocked")
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_bytes(b"")
    others = [f"b/other-{i}" for i in range(10)]
    ops = [
        Put(LAYOUT.item_key(name), journal_spec(name, replication=1).SerializeToString())
        for name in ["a/blocked", *others]
    ]
    ops += [
        Put(LAYOUT.assignment_key(AssignmentKey(name, "zone-a", "local-broker", 0)), b"")
        for name in ["a/blocked", *others]
    ]
    await r.keyspace.txn([], ops)  # In one change: synced together.
    assert "a/blocked" not in r.replicas
    assert all(name in r.replicas for name in others)
    blocked.unlink()
    async with asyncio.timeout(10):  # Tried again without any change of its keys.
        while "a/blocked" not in r.replicas:  # noqa: ASYNC110 (a retry timer's work)
            await asyncio.sleep(0.05)
    res = await r.resolve_journal("a/blocked", require_primary=True, may_proxy=True)
    assert res.status == pb.OK and res.local


async def _failing_to_start(
    r: ClusterResolver, monkeypatch: pytest.MonkeyPatch, name: str
) -> tuple[set[str], Any]:
    """`name`, assigned here (settled: its assignment advertises its route, as at a restart)
    with a spool left open in its directory, whose replica fails to start (an EIO reading
    its spools) until its name leaves the returned set; and a view of the broker for the
    orphan sweep (`ClusterMember.sweep_orphans_once`)."""
    from pygazette.broker.fragment.frontier_log import FrontierLog
    from pygazette.broker.fragment.spool import Spool
    from pygazette.broker.replica import Replica, spool_directory

    directory = spool_directory(r.spool_root, name)
    spool = Spool.create(directory, name, 0, pb.NONE, pb.LabelSet(), sync=False)
    pending = spool.start_append()
    pending.write(b"acknowledged\n")
    spool.commit(pending, None)  # Left open, as by a broker that was killed.

    failing = {name}
    start_clustered = Replica.start_clustered

    def start_or_fail(replica: Replica) -> None:
        if replica.name in failing:
            raise OSError(errno.EIO, "Input/output error", str(replica.spool_dir))
        start_clustered(replica)

    monkeypatch.setattr(Replica, "start_clustered", start_or_fail)
    me = pb.ProcessSpec.ID(zone="zone-a", suffix="local-broker")
    await r.keyspace.txn(
        [],
        [
            Put(LAYOUT.item_key(name), journal_spec(name, replication=1).SerializeToString()),
            Put(
                LAYOUT.assignment_key(AssignmentKey(name, "zone-a", "local-broker", 0)),
                route_value(pb.Route(members=[me], primary=0)),
            ),
        ],
    )
    assert name not in r.replicas  # Failed: retried.
    member = SimpleNamespace(
        spool_root=r.spool_root,
        frontiers=FrontierLog.at(r.spool_root),
        _orphan_candidates=None,
        _aside_in_progress=set(),
        resolver=r,
        observed=r.observed,
        keyspace=r.keyspace,
        layout=LAYOUT,
        decoder=r.decoder,
        stores=r.stores,
        persister=r.persister,
        sync=False,
    )
    r.on_stopped = lambda stopped: member._orphan_candidates.add(stopped)
    return failing, member


async def test_the_orphan_sweep_leaves_the_spools_of_a_replica_that_cannot_start_yet(
    resolver: ClusterResolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal assigned here whose replica fails to start is retried, not given up: its
    spools are still its own, and the orphan sweep must leave them in place. Left out of the
    replicas (and not stopping), the sweep took it for a journal this broker no longer
    serves: it moved the spools aside and persisted them from there, and the replica that
    then started found none (here: no spool, no content)."""
    from pygazette.broker.replica import spool_directory

    r, name = resolver, "a/failing"
    failing, member = await _failing_to_start(r, monkeypatch, name)
    ClusterMember.sweep_orphans_once(member)
    assert [p.name for p in spool_directory(r.spool_root, name).glob("*.log")] == [
        "0000000000000000.log"
    ]

    failing.clear()  # The cause goes away: the retry starts it, with its spool.
    async with asyncio.timeout(10):
        while name not in r.replicas:  # noqa: ASYNC110 (a retry timer's work)
            await asyncio.sleep(0.05)
    replica = r.replicas[name]
    assert replica.spool is not None and replica.spool.end == len(b"acknowledged\n")
    assert name not in r.stopping_journals


async def test_a_replica_that_cannot_start_and_leaves_has_its_spools_swept(
    resolver: ClusterResolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once such a journal is no longer assigned here (here: deleted), it isn't retried and
    its spools are an orphan's: the sweep takes them (a deleted journal's: dropped)."""
    from pygazette.broker.replica import spool_directory

    r, name = resolver, "a/failing"
    _failing, member = await _failing_to_start(r, monkeypatch, name)
    ClusterMember.sweep_orphans_once(member)  # Looked at once while retried: left.
    await r.keyspace.txn([], [Delete(LAYOUT.item_key(name))])
    ClusterMember.sweep_orphans_once(member)
    assert not spool_directory(r.spool_root, name).exists()
    assert name not in r.replicas
