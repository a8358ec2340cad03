"""The etcd keyspace against a real etcd: mirror, watches, transactions, leases."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aetcd.rpc as etcd_rpc
import pytest

from pygazette.keyspace.etcd import EtcdKeyspace, parse_etcd_url
from pygazette.keyspace.keyspace import Compare, Delete, KeyChanges, KeyspaceUnavailable, Put
from tests.support.etcd_process import EtcdProcess


async def _open(etcd: EtcdProcess, root: str) -> EtcdKeyspace:
    ks = EtcdKeyspace(etcd.url, root)
    await ks.open()
    return ks


def test_parse_etcd_url() -> None:
    assert parse_etcd_url("http://127.0.0.1:2379") == ("127.0.0.1", 2379)
    assert parse_etcd_url("localhost:1234") == ("localhost", 1234)
    assert parse_etcd_url("http://etcd") == ("etcd", 2379)
    assert parse_etcd_url("https://etcd:2379") == ("etcd", 2379)  # TLS (--etcd-*-file flags).
    for bad in ["ftp://x:1", "http://a:1,http://b:2", "http://:1", "http://x:notaport"]:
        with pytest.raises(ValueError):
            parse_etcd_url(bad)


async def test_mirror_follows_writes_of_another_client(etcd: EtcdProcess, etcd_root: str) -> None:
    a = await _open(etcd, etcd_root)
    b = await _open(etcd, etcd_root)
    try:
        r1 = await a.txn([Compare(etcd_root + "/items/x", 0)], [Put(etcd_root + "/items/x", b"1")])
        assert r1.succeeded
        await b.wait_for_revision(r1.revision, 10)
        kv = b.get(etcd_root + "/items/x")
        assert kv is not None and kv.value == b"1"
        assert kv.create_revision == kv.mod_revision == r1.revision
        # A stale compare fails and changes nothing.
        r2 = await b.txn([Compare(etcd_root + "/items/x", 0)], [Put(etcd_root + "/items/x", b"2")])
        assert not r2.succeeded
        r3 = await b.txn(
            [Compare(etcd_root + "/items/x", kv.mod_revision)],
            [Put(etcd_root + "/items/x", b"3"), Put(etcd_root + "/items/y", b"y")],
        )
        assert r3.succeeded
        await a.wait_for_revision(r3.revision, 10)
        assert [k.key for k in a.range(etcd_root + "/items/")] == [
            etcd_root + "/items/x",
            etcd_root + "/items/y",
        ]
        assert a.get(etcd_root + "/items/x").value == b"3"  # type: ignore[union-attr]
        r4 = await a.txn([], [Delete(etcd_root + "/items/x")])
        await b.wait_for_revision(r4.revision, 10)
        assert b.get(etcd_root + "/items/x") is None
        assert a.identity.cluster_id != 0 and a.identity.cluster_id == b.identity.cluster_id
        # Keys outside the root are not mirrored.
        await a.txn([], [Put("/elsewhere" + etcd_root, b"z")])
        assert a.range("/elsewhere") == []
    finally:
        await a.close()
        await b.close()


async def test_listeners_and_lease_expiry(etcd: EtcdProcess, etcd_root: str) -> None:
    ks = await _open(etcd, etcd_root)
    seen: list[int] = []
    ks.add_listener(seen.append)
    try:
        lease = await ks.grant_lease(2)
        key = etcd_root + "/members/z#a"
        res = await ks.txn([], [Put(key, b"m", lease=lease)])
        await ks.wait_for_revision(res.revision, 10)
        assert ks.get(key).lease == lease  # type: ignore[union-attr]
        assert seen and seen[-1] == res.revision
        # An ignore_lease put keeps the key under its lease.
        res = await ks.txn([], [Put(key, b"m2", ignore_lease=True)])
        await ks.wait_for_revision(res.revision, 10)
        assert ks.get(key).lease == lease  # type: ignore[union-attr]
        assert await ks.keep_alive(lease, within=5) > 0
        # Not kept alive any more: the lease expires and takes the key with it.
        async with asyncio.timeout(20):
            while ks.get(key) is not None:
                await ks.wait_for_change(ks.revision)
        assert await ks.keep_alive(lease, within=5) == 0
    finally:
        await ks.close()


async def test_a_keyspace_over_4_mib_loads(etcd: EtcdProcess, etcd_root: str) -> None:
    """The initial load is one Range: over gRPC's default 4 MiB receive limit at ~10,000
    journals (a restarted broker failed to start: RESOURCE_EXHAUSTED)."""
    writer = await _open(etcd, etcd_root)
    try:
        for i in range(5):
            await writer.txn([], [Put(f"{etcd_root}/big/{i}", bytes([i]) * (1 << 20))])
    finally:
        await writer.close()
    ks = await _open(etcd, etcd_root)
    try:
        assert [len(kv.value) for kv in ks.range(etcd_root + "/big/")] == [1 << 20] * 5
    finally:
        await ks.close()


async def test_unreachable_etcd_is_a_clear_error() -> None:
    from tests.support.ports import free_port

    ks = EtcdKeyspace(f"http://127.0.0.1:{free_port()}", "/x")
    with pytest.raises(KeyspaceUnavailable):
        await ks.open()
    await ks.close()


async def test_mirror_survives_an_etcd_restart(tmp_path: Path) -> None:
    own = EtcdProcess(tmp_path / "etcd")
    own.start()
    ks = EtcdKeyspace(own.url, "/r")
    try:
        await ks.open()
        r1 = await ks.txn([], [Put("/r/a", b"1")])
        await ks.wait_for_revision(r1.revision, 10)
        own.stop()
        with pytest.raises(KeyspaceUnavailable):
            await ks.txn([], [Put("/r/b", b"2")])
        own.start()  # Same data directory and ports.
        async with asyncio.timeout(30):
            while True:
                try:
                    r2 = await ks.txn([], [Put("/r/c", b"3")])
                    break
                except KeyspaceUnavailable:
                    await asyncio.sleep(0.1)
        await ks.wait_for_revision(r2.revision, 30)
        assert ks.get("/r/c") is not None and ks.get("/r/a") is not None
        assert ks.watch_failures >= 1
    finally:
        await ks.close()
        own.stop()


async def test_change_listeners_get_each_change(etcd: EtcdProcess, etcd_root: str) -> None:
    ks = await _open(etcd, etcd_root)
    changes: list[KeyChanges] = []
    ks.add_change_listener(changes.append)
    x, y, z = (etcd_root + "/items/" + k for k in "xyz")
    try:
        r1 = await ks.txn([], [Put(x, b"1"), Put(y, b"1")])
        await ks.wait_for_revision(r1.revision, 10)
        r2 = await ks.txn([], [Delete(x), Put(y, b"2"), Put(z, b"1"), Delete(etcd_root + "/no")])
        await ks.wait_for_revision(r2.revision, 10)
        seen = [(c.revision, sorted(kv.key for kv in c.puts), sorted(c.deletes)) for c in changes]
        assert seen == [(r1.revision, [x, y], []), (r2.revision, [y, z], [x])]
        assert changes[1].prior == r1.revision and not changes[1].reset
        assert [kv.value for kv in changes[1].puts if kv.key == y] == [b"2"]
    finally:
        await ks.close()


async def test_a_watch_restarted_past_a_compaction_reloads(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    """A watch re-established from a revision etcd compacted meanwhile reloads the mirror:
    keys deleted while it was down are gone, and the allocator's observed state, rebuilt
    from the reload and then updated change by change, equals a full extract."""
    from pygazette.allocator.allocator import ObservedState
    from pygazette.allocator.state import AllocatorState
    from pygazette.keyspace.layout import KeyLayout
    from tests.allocator.test_allocation import TextDecoder
    from tests.allocator.test_incremental_state import view

    layout = KeyLayout(etcd_root)
    local = layout.member_key("a", "m0")
    ks = EtcdKeyspace(etcd.url, etcd_root)
    writer = EtcdKeyspace(etcd.url, etcd_root)
    await ks.open()
    await writer.open()
    changes: list[KeyChanges] = []
    try:
        r = await writer.txn(
            [],
            [
                Put(local, b"5"),
                Put(layout.item_key("x"), b"1"),
                Put(layout.assign_prefix + "x#a#m0#0", b""),
            ],
        )
        await ks.wait_for_revision(r.revision, 10)
        observed = ObservedState(ks, layout, TextDecoder(), local)
        ks.add_change_listener(changes.append)
        assert observed.current.local_items
        task = ks._watch_task
        assert task is not None
        task.cancel()
        await asyncio.wait([task])
        await writer.txn(
            [],
            [
                Delete(layout.item_key("x")),
                Delete(layout.assign_prefix + "x#a#m0#0"),
                Put(layout.item_key("y"), b"1"),
            ],
        )
        r = await writer.txn([], [Put("/elsewhere-" + etcd_root, b"z")])
        await writer._client.kvstub.Compact(
            etcd_rpc.CompactionRequest(revision=r.revision, physical=True)
        )
        ks._watch_task = asyncio.create_task(ks._watch_loop())
        async with asyncio.timeout(10):
            while ks.get(layout.item_key("y")) is None:
                await ks.wait_for_change(ks.revision)
        assert ks.get(layout.item_key("x")) is None
        assert changes and changes[-1].reset
        assert view(observed.current) == view(
            AllocatorState.extract(ks, layout, TextDecoder(), local)
        )
        assert not observed.current.local_items
        r = await writer.txn([], [Put(layout.item_key("z"), b"2")])
        await ks.wait_for_revision(r.revision, 10)
        assert view(observed.current) == view(
            AllocatorState.extract(ks, layout, TextDecoder(), local)
        )
    finally:
        await ks.close()
        await writer.close()


async def test_a_watch_resumed_at_the_compaction_revision_misses_no_delete(
    tmp_path: Path,
) -> None:
    """The mirror is at revision R when its watch breaks; a key is deleted at R + 1 and etcd
    compacted at R + 1. etcd accepts a watch from its compaction revision, but compaction
    dropped the tombstone there: a watch resumed from R + 1 got the puts of that revision
    and never the delete, and the mirror kept the deleted key for good (a deleted journal
    listed and resolved, a dead member or a removed assignment kept by the allocator). The
    watch resumes from R itself (whose events the mirror has), so etcd reports any
    compaction past it and the mirror reloads."""
    own = EtcdProcess(tmp_path / "etcd")  # Its own: no other writer moves the revision.
    own.start()
    ks = EtcdKeyspace(own.url, "/r")
    writer = EtcdKeyspace(own.url, "/r")
    try:
        await ks.open()
        await writer.open()
        r = await writer.txn([], [Put("/r/gone", b"1"), Put("/r/kept", b"1")])
        await ks.wait_for_revision(r.revision, 10)
        task = ks._watch_task
        assert task is not None
        task.cancel()
        await asyncio.wait([task])
        r2 = await writer.txn([], [Delete("/r/gone"), Put("/r/new", b"1")])
        assert r2.revision == ks.revision + 1
        await writer._client.kvstub.Compact(
            etcd_rpc.CompactionRequest(revision=r2.revision, physical=True)
        )
        ks._watch_task = asyncio.create_task(ks._watch_loop())
        await ks.wait_until(lambda: ks.get("/r/new") is not None, 10)
        assert ks.get("/r/gone") is None, "the delete at the compaction revision was missed"
        assert ks.get("/r/kept") is not None
        r3 = await writer.txn([], [Put("/r/later", b"1")])
        await ks.wait_for_revision(r3.revision, 10)
        assert [kv.key for kv in ks.range("/r/")] == ["/r/kept", "/r/later", "/r/new"]
    finally:
        await ks.close()
        await writer.close()
        own.stop()


async def test_a_store_revision_reached_by_writes_elsewhere_is_reached(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    """A revision etcd reached through writes outside the root (Gazette's Headers carry
    etcd's revision, and brokers and consumers often share an etcd) is reached by the
    mirror once no key under the root changed up to it; it waited for a change under the
    root, which may never come (a request fenced on it timed out after 30 s). A change
    under the root that the watch hasn't brought yet is still waited for."""
    ks = await _open(etcd, etcd_root)
    writer = await _open(etcd, etcd_root)
    try:
        r1 = await writer.txn([], [Put(etcd_root + "/items/a", b"1")])
        await ks.wait_for_revision(r1.revision, 10)
        r2 = await writer.txn([], [Put("/elsewhere" + etcd_root, b"z")])
        with pytest.raises(TimeoutError):
            await ks.wait_for_revision(r2.revision, 0.3)  # The mirror's own revision.
        await ks.wait_for_store_revision(r2.revision, 5)
        assert ks.revision >= r2.revision
        # The mirror still follows changes, and a change it hasn't applied is waited for.
        task = ks._watch_task
        assert task is not None
        task.cancel()
        await asyncio.wait([task])
        r3 = await writer.txn([], [Delete(etcd_root + "/items/a")])
        r4 = await writer.txn([], [Put("/elsewhere" + etcd_root, b"y")])
        with pytest.raises(TimeoutError):
            await ks.wait_for_store_revision(r4.revision, 0.5)
        assert ks.get(etcd_root + "/items/a") is not None
        ks._watch_task = asyncio.create_task(ks._watch_loop())
        await ks.wait_for_store_revision(r4.revision, 5)
        assert ks.get(etcd_root + "/items/a") is None and ks.revision >= r3.revision
        r5 = await writer.txn([], [Put(etcd_root + "/items/b", b"2")])
        await ks.wait_for_revision(r5.revision, 5)
        assert ks.get(etcd_root + "/items/b") is not None
    finally:
        await ks.close()
        await writer.close()


async def test_a_request_fenced_on_a_store_revision_passes(
    etcd: EtcdProcess, etcd_root: str
) -> None:
    """A proxied request whose Header names etcd's revision, reached through writes
    outside the root, passes the fence promptly."""
    from pygazette.allocator.request_fence import pass_request_fence
    from pygazette.protocol.pb import protocol_pb2 as pb

    ks = await _open(etcd, etcd_root)
    try:
        r = await ks.txn([], [Put("/elsewhere" + etcd_root, b"z")])
        header = pb.Header(
            process_id=pb.ProcessSpec.ID(zone="z", suffix="s"),
            etcd=pb.Header.Etcd(cluster_id=ks.identity.cluster_id, revision=r.revision),
        )
        async with asyncio.timeout(5):
            await pass_request_fence(ks, pb.ProcessSpec.ID(zone="z", suffix="s"), 0, header)
    finally:
        await ks.close()


async def test_a_watch_resumed_on_another_etcd_cluster_reloads(tmp_path: Path) -> None:
    """etcd replaced under a running mirror by another cluster (its data lost and the member
    recreated under another cluster token) that reached a revision past the mirror's before
    the watch resumed: nothing in the revisions tells, and the watch went on in the new store
    from the old one's revision, mixing the old store's keys (never deleted in the new one)
    with the new store's changes. Gazette's keyspace checks each response's cluster ID
    (checkHeader); the mirror now reloads when it changes."""
    import shutil

    own = EtcdProcess(tmp_path / "etcd")
    own.start()
    ks = EtcdKeyspace(own.url, "/r")
    try:
        await ks.open()
        r = await ks.txn([], [Put("/r/old", b"x")])
        await ks.wait_for_revision(r.revision, 10)
        old_cluster = ks.identity.cluster_id
        task = ks._watch_task
        assert task is not None
        task.cancel()
        await asyncio.wait([task])
        own.stop()
        shutil.rmtree(tmp_path / "etcd")
        own.extra_args.append("--initial-cluster-token=another")
        own.start()  # A new, empty cluster on the same ports.
        writer = EtcdKeyspace(own.url, "/elsewhere")
        await writer.open()
        try:
            for i in range(r.revision + 2):
                last = await writer.txn([], [Put(f"/elsewhere/{i}", b"y")])
            assert writer.identity.cluster_id != old_cluster
            new = await writer.txn([], [Put("/r/new", b"y")])
        finally:
            await writer.close()
        assert last.revision > r.revision
        ks._watch_task = asyncio.create_task(ks._watch_loop())
        await ks.wait_until(lambda: ks.get("/r/new") is not None, 15)
        assert ks.get("/r/old") is None, "the other cluster's keys were kept"
        assert ks.identity.cluster_id != old_cluster
        assert ks.revision >= new.revision
    finally:
        await ks.close()
        own.stop()


async def test_a_store_whose_revision_went_back_is_reloaded(tmp_path: Path) -> None:
    """etcd replaced under a running mirror (its data lost, or restored from an older
    snapshot) is at a revision below the mirror's. A watch resumed from the mirror's next
    revision then waits for a revision the store has yet to reach, missing every change
    until then: the mirror froze, silently (Gazette's keyspace fails on the header going
    back). Now it reloads from the store as it is."""
    import shutil

    own = EtcdProcess(tmp_path / "etcd")
    own.start()
    ks = EtcdKeyspace(own.url, "/r")
    try:
        await ks.open()
        for i in range(20):
            r = await ks.txn([], [Put(f"/r/old-{i}", b"x")])
        await ks.wait_for_revision(r.revision, 10)
        own.stop()
        shutil.rmtree(tmp_path / "etcd")
        own.start()  # A new, empty store on the same ports.
        async with asyncio.timeout(30):
            while True:
                try:
                    r = await ks.txn([], [Put("/r/new", b"y")])
                    break
                except KeyspaceUnavailable:
                    await asyncio.sleep(0.1)
        assert r.revision < 20
        await ks.wait_until(lambda: ks.get("/r/new") is not None, 15)
        assert ks.get("/r/old-0") is None
        assert ks.revision == r.revision
    finally:
        await ks.close()
        own.stop()
