"""The embedded keyspace: revisions, compare-and-swap, persistence across restarts."""

from __future__ import annotations

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
