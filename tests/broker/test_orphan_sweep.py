"""The orphan sweep (`ClusterMember.sweep_orphans_once`): spools of journals this broker no
longer serves are moved aside and persisted, including what an earlier run moved aside and
did not finish, what an earlier version moved to `.orphaned`, and journals whose names begin
with a dot (`.orphaned` among them).

Real spools, persister and file store; the member's view of the cluster (keyspace, resolver,
assignments) is a stand-in that says every journal is settled on other brokers.
"""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pygazette.allocator.state import Assignment
from pygazette.broker import cluster_member
from pygazette.broker.fragment.frontier_log import FILE_NAME, LEGACY_FILE, FrontierLog
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.spool import Spool
from pygazette.broker.replica import spool_directory, spool_directory_name
from pygazette.keyspace.keyspace import KeyValue
from pygazette.keyspace.layout import KeyDecodeError
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import journal_spec


def _member(tmp_path: Path, persister: Persister, journals: set[str]) -> Any:
    """A member that serves nothing, where `journals` exist and are settled elsewhere."""

    def assignments_of(name: str) -> list[Assignment]:
        kv = KeyValue(key="", value=b"", create_revision=1, mod_revision=1)
        return [Assignment(item=name, zone="z", suffix="s", slot=0, kv=kv)]

    return SimpleNamespace(
        spool_root=tmp_path / "spools",
        frontiers=FrontierLog.at(tmp_path / "spools"),
        _orphan_candidates=None,
        _aside_in_progress=set(),
        resolver=SimpleNamespace(stopping_journals=set(), replicas={}),
        observed=SimpleNamespace(current=SimpleNamespace(assignments_of=assignments_of)),
        keyspace=SimpleNamespace(
            get=lambda key: SimpleNamespace(mod_revision=1, name=key) if key in journals else None
        ),
        layout=SimpleNamespace(item_key=lambda name: name),
        decoder=SimpleNamespace(journal_spec=lambda item: journal_spec(item.name)),
        stores=persister.stores,
        persister=persister,
        sync=False,
    )


def _spool(directory: Path, journal: str, content: bytes) -> None:
    spool = Spool.create(directory, journal, 0, pb.NONE, pb.LabelSet(), sync=False)
    pending = spool.start_append()
    pending.write(content)
    spool.commit(pending, None)
    spool.close()


def _stored(tmp_path: Path, journal: str) -> list[bytes]:
    root = tmp_path / "store" / journal
    return [p.read_bytes() for p in sorted(root.iterdir())] if root.is_dir() else []


async def _sweep(member: Any, persister: Persister) -> None:
    cluster_member.ClusterMember.sweep_orphans_once(member)
    persister.expedite()
    await persister.wait_idle()


@pytest.fixture(autouse=True)
def _settled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_member, "assignments_advertise", lambda _route, _group: True)


async def test_spools_an_earlier_run_moved_aside_are_persisted(
    tmp_path: Path, persister: Persister
) -> None:
    """A broker stopped after it moved a journal's spools aside and before they persisted:
    the next run persists them, then removes the directory."""
    aside = tmp_path / "spools" / cluster_member.ASIDE_DIR / "a%2Fjournal-1700000000000000000"
    _spool(aside, "a/journal", b"left aside\n")
    member = _member(tmp_path, persister, {"a/journal"})
    await _sweep(member, persister)
    assert _stored(tmp_path, "a/journal") == [b"left aside\n"]
    await _sweep(member, persister)
    assert not aside.exists()


async def test_spools_of_a_deleted_journal_left_aside_are_dropped(
    tmp_path: Path, persister: Persister
) -> None:
    aside = tmp_path / "spools" / cluster_member.ASIDE_DIR / "gone%2Fjournal-1700000000000000000"
    _spool(aside, "gone/journal", b"deleted\n")
    await _sweep(_member(tmp_path, persister, set()), persister)
    assert not aside.exists() and _stored(tmp_path, "gone/journal") == []


async def test_what_an_earlier_version_left_in_dot_orphaned_is_persisted(
    tmp_path: Path, persister: Persister
) -> None:
    legacy = tmp_path / "spools" / cluster_member.LEGACY_ASIDE_DIR
    _spool(legacy / "a%2Fjournal-1700000000000000000", "a/journal", b"old layout\n")
    member = _member(tmp_path, persister, {"a/journal"})
    await _sweep(member, persister)
    assert _stored(tmp_path, "a/journal") == [b"old layout\n"]
    assert not legacy.exists()


async def test_journals_named_with_a_leading_dot_are_swept(
    tmp_path: Path, persister: Persister
) -> None:
    """`.orphaned` and `.dotted/journal` are journal names like any: their orphaned spools
    are persisted too (the sweep used to skip every dotted directory, and used `.orphaned`
    for its own)."""
    root = tmp_path / "spools"
    for name in (".orphaned", ".dotted/journal"):
        _spool(spool_directory(root, name), name, f"{name}\n".encode())
    member = _member(tmp_path, persister, {".orphaned", ".dotted/journal"})
    await _sweep(member, persister)
    assert _stored(tmp_path, ".orphaned") == [b".orphaned\n"]
    assert _stored(tmp_path, ".dotted/journal") == [b".dotted/journal\n"]
    assert not list(root.rglob("*.log"))


def _spool_at(directory: Path, journal: str, begin: int, *contents: bytes) -> None:
    """A spool at `begin` left open (as by a killed broker), one commit per content."""
    spool = Spool.create(directory, journal, begin, pb.NONE, pb.LabelSet(), sync=False)
    for content in contents:
        pending = spool.start_append()
        pending.write(content)
        spool.commit(pending, None)


async def test_a_leftover_does_not_forget_the_frontier_of_the_journals_own_spools(
    tmp_path: Path, persister: Persister
) -> None:
    """A killed broker left both spools it had moved aside (their journal was orphaned, then
    served here again) and the journal's own spools, which end in content in doubt beyond its
    confirmed frontier. Persisting the leftover must not forget that frontier: the journal's
    own spools are swept next, and only their confirmed part may reach the store."""
    root = tmp_path / "spools"
    journal = "a/journal"
    aside = root / cluster_member.ASIDE_DIR / "a%2Fjournal-1700000000000000000"
    _spool_at(aside, journal, 0, b"early\n")
    _spool_at(spool_directory(root, journal), journal, 6, b"confirmed\n", b"in doubt")
    member = _member(tmp_path, persister, {journal})
    member.frontiers.set(journal, 16)
    await _sweep(member, persister)
    assert _stored(tmp_path, journal) == [b"early\n", b"confirmed\n"]
    assert member.frontiers.get(journal) is None  # Forgotten once no spool of it is left.


async def test_directories_that_are_not_spools_are_left_alone(
    tmp_path: Path, persister: Persister
) -> None:
    """What else sits in the spool root (a file system's `lost+found`, a snapshot directory,
    whose name may even be a valid journal name) is never moved aside and removed as a
    deleted journal's spools."""
    root = tmp_path / "spools"
    for name in ("lost+found", ".snapshot", "some%2Fjournal"):
        (root / name).mkdir(parents=True)
        (root / name / "keep.me").write_bytes(b"not a spool\n")
    await _sweep(_member(tmp_path, persister, set()), persister)
    for name in ("lost+found", ".snapshot", "some%2Fjournal"):
        assert (root / name / "keep.me").read_bytes() == b"not a spool\n"


async def test_an_adoption_that_collides_does_not_stop_the_sweep(
    tmp_path: Path, persister: Persister
) -> None:
    root = tmp_path / "spools"
    name = "a%2Fjournal-1700000000000000000"
    _spool(root / cluster_member.LEGACY_ASIDE_DIR / name, "a/journal", b"old layout\n")
    _spool(root / cluster_member.ASIDE_DIR / name, "a/journal", b"new layout\n")
    _spool(spool_directory(root, "b/journal"), "b/journal", b"orphan\n")
    member = _member(tmp_path, persister, {"a/journal", "b/journal"})
    await _sweep(member, persister)
    assert _stored(tmp_path, "a/journal") == [b"new layout\n"]
    assert _stored(tmp_path, "b/journal") == [b"orphan\n"]
    assert (root / cluster_member.LEGACY_ASIDE_DIR / name).is_dir()  # Kept, not lost.


async def test_spools_moved_aside_keep_the_frontier_they_were_moved_at(
    tmp_path: Path, persister: Persister
) -> None:
    """A broker stopped after it moved a journal's spools aside (and copied its frontier
    beside them) and before it cut them. Restarted, it serves the journal again, whose
    frontier moved on. The leftover is cut at the frontier it was moved at, not at the live
    journal's: its content in doubt never reaches the store."""
    root = tmp_path / "spools"
    journal = "a/journal"
    aside = root / cluster_member.ASIDE_DIR / "a%2Fjournal-1700000000000000000"
    _spool_at(aside, journal, 0, b"confirmed\n", b"in doubt")
    copy = FrontierLog(aside / FILE_NAME)
    copy.set(journal, 10)
    copy.close()
    member = _member(tmp_path, persister, {journal})
    member.resolver.replicas[journal] = object()  # Served here again...
    member.frontiers.set(journal, 500)  # ...and appended to since.
    await _sweep(member, persister)
    assert _stored(tmp_path, journal) == [b"confirmed\n"]
    assert member.frontiers.get(journal) == 500  # The live journal's, untouched.


async def test_the_first_sweep_copies_the_frontier_beside_the_spools_it_moves(
    tmp_path: Path, persister: Persister, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moved aside, a journal's spools are cut at its frontier as it was then, from the copy
    beside them; an earlier version's `confirmed` file among them (a leftover it moved aside)
    is read into that copy, never into the broker's own frontier log."""
    root = tmp_path / "spools"
    journal = "a/journal"
    _spool_at(spool_directory(root, journal), journal, 0, b"confirmed\n", b"in doubt")
    member = _member(tmp_path, persister, {journal})
    member.frontiers.set(journal, 10)
    await _sweep(member, persister)
    assert _stored(tmp_path, journal) == [b"confirmed\n"]

    old = root / cluster_member.LEGACY_ASIDE_DIR / "b%2Fjournal-1700000000000000000"
    _spool_at(old, "b/journal", 0, b"older\n", b"in doubt")
    (old / LEGACY_FILE).write_bytes(struct.pack("<Q", 6))
    member = _member(tmp_path, persister, {"b/journal"})
    member.resolver.replicas["b/journal"] = object()
    member.frontiers.set("b/journal", 2)  # A journal of that name, created again since.
    await _sweep(member, persister)
    assert _stored(tmp_path, "b/journal") == [b"older\n"]
    assert member.frontiers.get("b/journal") == 2


LONG = "long/" + "a/" * 150 + "b"  # Valid (at most 512 bytes), 600 once quoted.


def test_a_long_journal_name_gets_a_spool_directory_a_file_system_takes() -> None:
    assert spool_directory_name("a/journal") == "a%2Fjournal"
    name = spool_directory_name(LONG)
    assert len(name.encode()) <= 255 - len("-1700000000000000000")  # Moved aside too.
    assert "~" in name and name != spool_directory_name(LONG + "c")
    assert spool_directory_name("x" * 512) != spool_directory_name("x" * 511)


async def test_orphaned_spools_of_a_long_named_journal_are_persisted(
    tmp_path: Path, persister: Persister
) -> None:
    """Its directory's name does not say the journal (`spool_directory_name`): its spools'
    logs do, in place and moved aside."""
    root = tmp_path / "spools"
    _spool(spool_directory(root, LONG), LONG, b"in place\n")
    member = _member(tmp_path, persister, {LONG})
    await _sweep(member, persister)
    assert _stored(tmp_path, LONG) == [b"in place\n"]

    left = root / cluster_member.ASIDE_DIR / f"{spool_directory_name(LONG)}-1700000000000000000"
    _spool_at(left, LONG, 9, b"left aside\n")
    await _sweep(_member(tmp_path, persister, {LONG}), persister)
    assert _stored(tmp_path, LONG) == [b"in place\n", b"left aside\n"]


async def test_spools_of_a_journal_whose_spec_does_not_decode_stay(
    tmp_path: Path, persister: Persister
) -> None:
    """A spec that does not decode is no deleted journal: its spools, in place or left aside,
    are neither dropped nor persisted under a spec we can't read."""
    root = tmp_path / "spools"
    _spool(spool_directory(root, "a/journal"), "a/journal", b"in place\n")
    left = root / cluster_member.ASIDE_DIR / "b%2Fjournal-1700000000000000000"
    _spool(left, "b/journal", b"left aside\n")
    member = _member(tmp_path, persister, {"a/journal", "b/journal"})

    def undecodable(item: Any) -> pb.JournalSpec:
        raise KeyDecodeError(f"{item.name}: garbage")

    member.decoder = SimpleNamespace(journal_spec=undecodable)
    await _sweep(member, persister)
    await _sweep(member, persister)
    assert _stored(tmp_path, "a/journal") == _stored(tmp_path, "b/journal") == []
    assert list(spool_directory(root, "a/journal").glob("*.log"))
    assert list(left.glob("*.log"))
    assert member._orphan_candidates == {"a/journal"}  # Looked at again next sweep.


MID = "mid/" + "a" * 205  # Valid; quoted, longer than MAX_QUOTED, yet a directory name.


async def test_spools_an_earlier_version_kept_under_a_long_quoted_name_are_found(
    tmp_path: Path, persister: Persister
) -> None:
    """Before `path_name` cut long names, a journal whose quoted name is 201 to 255 bytes had
    its spools under that whole name. Served again, it recovers them (its directory is moved
    to the new name); not served here, they are swept and persisted, not left unread."""
    from urllib.parse import quote

    from pygazette.broker.replica import Replica

    root = tmp_path / "spools"
    assert spool_directory_name(MID) != quote(MID, safe="")
    _spool(root / quote(MID, safe=""), MID, b"kept\n")
    replica = Replica(
        journal_spec(MID),
        1,
        spool_root=root,
        stores=persister.stores,
        persister=persister,
        sync=False,
    )
    replica.recover_spools()
    assert replica.spool is not None and replica.spool.end == 5
    replica.spool.close()

    other = "mid/" + "b" * 205
    _spool(root / quote(other, safe=""), other, b"orphan\n")
    await _sweep(_member(tmp_path, persister, {other}), persister)
    assert _stored(tmp_path, other) == [b"orphan\n"]
