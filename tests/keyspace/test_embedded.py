"""The embedded keyspace: revisions, compare-and-swap, persistence across restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pygazette.keyspace.embedded import EmbeddedKeyspace
from pygazette.keyspace.keyspace import Compare, Delete, Put


async def test_txn_revisions_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "ks.json"
    ks = EmbeddedKeyspace(path)
    seen: list[int] = []
    ks.add_listener(seen.append)
    r1 = await ks.txn([Compare("/a", 0)], [Put("/a", b"1")])
    assert r1.succeeded and r1.revision == ks.revision == 2
    kv = ks.get("/a")
    assert kv is not None and (kv.value, kv.create_revision, kv.mod_revision) == (b"1", 2, 2)

    # A stale compare applies nothing.
    stale = await ks.txn([Compare("/a", 0)], [Put("/a", b"2"), Put("/b", b"x")])
    assert not stale.succeeded and ks.get("/b") is None and ks.revision == 2

    r2 = await ks.txn([Compare("/a", 2)], [Put("/a", b"2"), Put("/b", b"x")])
    assert r2.succeeded and r2.revision == 3
    assert [k.key for k in ks.range("/")] == ["/a", "/b"]
    kv = ks.get("/a")
    assert kv is not None and (kv.create_revision, kv.mod_revision) == (2, 3)
    assert seen == [2, 3]

    ident = ks.identity
    reopened = EmbeddedKeyspace(path)
    assert reopened.revision == 3 and reopened.identity == ident
    assert reopened.get("/b") is not None

    r3 = await reopened.txn([Compare("/b", 3)], [Delete("/b")])
    assert r3.succeeded and reopened.get("/b") is None
    await reopened.wait_for_revision(4)


def test_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ks.json"
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="cannot load keyspace"):
        EmbeddedKeyspace(path)


async def test_revision_waiters_wake_when_their_revision_is_applied() -> None:
    ks = EmbeddedKeyspace(None)  # In memory.
    woken: list[int] = []

    async def wait(revision: int) -> None:
        await ks.wait_for_revision(revision)
        woken.append(revision)

    waits = [asyncio.ensure_future(wait(r)) for r in (4, 3, 3, 2)]
    await asyncio.sleep(0)
    await ks.txn([], [Put("/a", b"1")])  # Revision 2.
    await asyncio.sleep(0)
    assert woken == [2] and ks._revision_waiters[0][0] == 3  # Only the satisfied one.
    await ks.txn([], [Put("/a", b"2")])  # 3.
    await asyncio.sleep(0)
    assert sorted(woken) == [2, 3, 3]
    # A waiter that times out leaves nothing behind once its revision is reached.
    with pytest.raises(TimeoutError):
        await ks.wait_for_revision(5, 0.01)
    await ks.txn([], [Put("/a", b"3")])  # 4.
    await ks.txn([], [Put("/a", b"4")])  # 5.
    await asyncio.gather(*waits)
    assert sorted(woken) == [2, 3, 3, 4] and ks._revision_waiters == []
    await ks.wait_for_revision(5)  # Already applied: returns at once.
