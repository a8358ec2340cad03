"""The replication protocol's spool rules (Gazette's Spool.Apply), on crash-safe spools.

Also the confirmed frontier: what a replica may show readers, keep across a restart, and
must cut when a new primary proposes something else.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import struct
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pygazette.allocator.state import Assignment
from pygazette.broker import cluster_member, replicated_spool
from pygazette.broker import replica as replica_module
from pygazette.broker.fragment.frontier_log import FrontierLog
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.fragment.spool import Spool
from pygazette.broker.replica import Replica, spool_directory
from pygazette.broker.replicate_service import _apply
from pygazette.broker.replicated_spool import (
    ReplicatedSpool,
    ReplicationProtocolError,
    fragments_equal,
    roll_proposal,
)
from pygazette.keyspace.keyspace import KeyValue
from pygazette.protocol.fragment_name import fragment_content_path, sha1sum_from_digest
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import journal_spec

JOURNAL = "a/journal"


def _frag(begin: int, end: int, content: bytes = b"", codec: int = pb.NONE) -> pb.Fragment:
    f = pb.Fragment(journal=JOURNAL, begin=begin, end=end, compression_codec=codec)  # type: ignore[arg-type]
    if end > begin:
        f.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
    return f


def _replica(tmp_path: Path, persister: Persister, *, sync: bool = False) -> Replica:
    r = Replica(
        journal_spec(JOURNAL),
        1,
        spool_root=tmp_path / "spools",
        stores=persister.stores,
        persister=persister,
        sync=sync,
    )
    r.recover_replicated()  # As `Replica.start_clustered`.
    r.readable_end = r.rspool.confirmed
    r.index.first_refresh_done.set()
    return r


async def _content(rs: ReplicatedSpool, data: bytes) -> None:
    await rs.apply_content(data, rs.delta)


async def test_commit_rollback_and_mismatch(tmp_path: Path, persister: Persister) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    regs = label_set({"reg": "one"})
    assert fragments_equal(rs.fragment(), _frag(0, 0))

    # Content, then a proposal of exactly that content: a commit, with new registers.
    await _content(rs, b"hello ")
    await _content(rs, b"world")
    assert rs.delta == 11
    assert fragments_equal(rs.next_fragment(), _frag(0, 11, b"hello world"))
    resp = await rs.apply_proposal(_frag(0, 11, b"hello world"), regs, primary=False)
    assert resp.status == pb.OK
    assert (rs.end, rs.delta) == (11, 0)
    assert r.registers == regs
    assert r.spool is not None and r.spool.read(0, 100) == b"hello world"

    # Content at a wrong delta breaks the protocol.
    with pytest.raises(ReplicationProtocolError):
        await rs.apply_content(b"x", 5)

    # Partial content rolled back by proposing the current fragment.
    await _content(rs, b"junk")
    resp = await rs.apply_proposal(_frag(0, 11, b"hello world"), regs, primary=False)
    assert resp.status == pb.OK and rs.delta == 0 and rs.end == 11

    # A proposal we can't reach: PROPOSAL_MISMATCH with our fragment and registers.
    resp = await rs.apply_proposal(_frag(0, 11, b"hello wurld"), regs, primary=False)
    assert resp.status == pb.PROPOSAL_MISMATCH
    assert fragments_equal(resp.fragment, _frag(0, 11, b"hello world"))
    assert resp.registers == regs
    # Same fragment, other registers: a mismatch too.
    resp = await rs.apply_proposal(_frag(0, 11, b"hello world"), pb.LabelSet(), primary=False)
    assert resp.status == pb.PROPOSAL_MISMATCH

    # Content then a commit with the wrong sum: mismatch, content stays pending.
    await _content(rs, b"!")
    resp = await rs.apply_proposal(_frag(0, 12, b"hello world?"), regs, primary=False)
    assert resp.status == pb.PROPOSAL_MISMATCH and rs.delta == 1


async def test_roll_forward_and_roll_to_empty(tmp_path: Path, persister: Persister) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"abc")
    assert (await rs.apply_proposal(_frag(0, 3, b"abc"), pb.LabelSet(), primary=False)).status == 0
    old_spool = r.spool
    rs.set_confirmed(rs.end)  # As the Replicate service does on a confirmation.

    # An empty proposal at our end rolls to a new fragment, with the proposal's codec.
    roll = _frag(3, 3, codec=pb.GZIP)
    assert (await rs.apply_proposal(roll, pb.LabelSet(), primary=False)).status == pb.OK
    assert (rs.begin, rs.end, rs.codec) == (3, 3, pb.GZIP)
    assert r.spool is None and old_spool is not None and old_spool.closed

    # A proposal past everything we hold: roll forward there, taking its registers.
    regs = label_set({"peer": "regs"})
    far = _frag(100, 100)
    assert (await rs.apply_proposal(far, regs, primary=False)).status == pb.OK
    assert (rs.begin, rs.end) == (100, 100) and r.registers == regs
    # Content lands at the new offset.
    await _content(rs, b"xyz")
    assert (await rs.apply_proposal(_frag(100, 103, b"xyz"), regs, primary=False)).status == 0
    assert r.spool is not None and r.spool.begin == 100 and r.spool.read(100, 10) == b"xyz"


def test_roll_proposal_rules() -> None:
    spec = journal_spec(JOURNAL, length=10).fragment
    cur = _frag(0, 5, b"12345")
    assert roll_proposal(cur, 0.0, 0, spec, 1.0) is cur
    assert fragments_equal(roll_proposal(_frag(0, 11, b"x" * 11), 0.0, 0, spec, 1.0), _frag(11, 11))
    assert fragments_equal(roll_proposal(cur, 0.0, 8, spec, 1.0), _frag(8, 8))
    assert fragments_equal(roll_proposal(_frag(7, 7), None, 0, spec, 1.0), _frag(7, 7))
    spec.flush_interval.seconds = 60
    assert roll_proposal(cur, 30.0, 0, spec, 59.0) is cur
    assert fragments_equal(roll_proposal(cur, 30.0, 0, spec, 61.0), _frag(5, 5))
    with pytest.raises(ValueError):
        roll_proposal(cur, 0.0, 2, spec, 1.0)


async def test_unconfirmed_content_is_cut_on_a_foreign_proposal(
    tmp_path: Path, persister: Persister
) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    regs = label_set({"k": "v1"})
    await _content(rs, b"confirmed;")
    await rs.apply_proposal(_frag(0, 10, b"confirmed;"), regs, primary=False)
    rs.set_confirmed(rs.end)  # The primary confirmed it.
    await _content(rs, b"tentative")
    await rs.apply_proposal(
        _frag(0, 19, b"confirmed;tentative"), label_set({"k": "v2"}), primary=False
    )
    assert rs.unconfirmed and rs.confirmed == 10

    # The confirmed frontier survives a restart: a new replica object finds it.
    r2 = _replica(tmp_path, persister)
    rs2 = r2.rspool
    assert rs2 is not None
    assert rs2.confirmed == 10 and rs2.end == 19 and rs2.unconfirmed
    # Cutting drops the unconfirmed commit, and its registers with it.
    rs2.cut_unconfirmed()
    assert (rs2.begin, rs2.end) == (0, 10)
    assert r2.registers == regs
    assert fragments_equal(rs2.fragment(), _frag(0, 10, b"confirmed;"))
    assert r2.spool is not None and r2.spool.read(0, 100) == b"confirmed;"
    # And what remains is a valid spool to keep appending to.
    await _content(rs2, b"next")
    ok = await rs2.apply_proposal(_frag(0, 14, b"confirmed;next"), regs, primary=False)
    assert ok.status == pb.OK


async def test_readers_see_only_readable_content(tmp_path: Path, persister: Persister) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"0123456789")
    await rs.apply_proposal(_frag(0, 10, b"0123456789"), pb.LabelSet(), primary=False)
    assert r.head == 0  # Committed, but not confirmed yet.
    assert r.index.query(0) == (None, None, 0)  # Neither served nor described.
    r.set_readable(4)  # No commit ends there: its sum is hashed from the spool.
    assert r.head == 4
    frag, spool, _ = r.index.query(0)
    assert spool is r.spool and frag is not None
    assert fragments_equal(frag, _frag(0, 4, b"0123"))
    assert r.index.query(4) == (None, None, 4)
    r.set_readable(2)  # Never backwards.
    assert r.head == 4
    r.set_readable(10)
    assert r.head == 10
    frag, _, _ = r.index.query(4)
    assert frag is not None and fragments_equal(frag, _frag(0, 10, b"0123456789"))


async def test_pipelined_commits_are_described_as_confirmed(
    tmp_path: Path, persister: Persister
) -> None:
    """Commits pipelined past the confirmed frontier show in no fragment a reader gets:
    the open spool's fragment ends at the last confirmed commit, with that commit's sum."""
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    content = b""
    for part in (b"one;", b"two;", b"three;", b"four;"):
        await _content(rs, part)
        content += part
        ok = await rs.apply_proposal(_frag(0, len(content), content), pb.LabelSet(), primary=False)
        assert ok.status == pb.OK
    assert r.spool is not None and r.spool.end == len(content)
    for confirmed in (4, 14):  # Commit boundaries: "one;" and "one;two;three;".
        r.confirm_through(confirmed)
        assert r.head == confirmed
        frag, _, _ = r.index.query(0)
        assert frag is not None and fragments_equal(frag, _frag(0, confirmed, content[:confirmed]))
        assert r.spool.readable_fragment() == frag
        assert r.index.query(confirmed) == (None, None, confirmed)
    # A spool that completes was cut to the frontier: all of it is shown, as persisted.
    rs.complete(primary=False)
    assert r.spool is None
    [closed] = r.index.local_spools()
    assert fragments_equal(closed.readable_fragment(), _frag(0, 14, content[:14]))
    assert closed.readable_fragment() == closed.fragment()


async def test_a_restarted_replica_shows_only_its_confirmed_content(
    tmp_path: Path, persister: Persister
) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"confirmed;")
    await rs.apply_proposal(_frag(0, 10, b"confirmed;"), pb.LabelSet(), primary=False)
    r.confirm_through(10)
    await _content(rs, b"tentative")
    await rs.apply_proposal(_frag(0, 19, b"confirmed;tentative"), pb.LabelSet(), primary=False)
    r2 = _replica(tmp_path, persister)
    assert r2.head == 10
    frag, _, _ = r2.index.query(3)
    assert frag is not None and fragments_equal(frag, _frag(0, 10, b"confirmed;"))


async def test_replica_completion_persists_only_confirmed_content(
    tmp_path: Path, persister: Persister
) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"kept")
    await rs.apply_proposal(_frag(0, 4, b"kept"), pb.LabelSet(), primary=False)
    rs.set_confirmed(4)
    await _content(rs, b"dropped")
    await rs.apply_proposal(_frag(0, 11, b"keptdropped"), pb.LabelSet(), primary=False)
    rs.complete(primary=False)
    persister.expedite()
    await persister.wait_idle()
    stored = sorted((tmp_path / "store" / JOURNAL).iterdir())
    assert [p.name.split("-")[:2] for p in stored] == [["0000000000000000", "0000000000000004"]]
    assert stored[0].read_bytes() == b"kept"


async def test_replica_completion_persists_nothing_the_store_covers(
    tmp_path: Path, persister: Persister
) -> None:
    """A replica's completed spool is not uploaded where fragments in the store cover it
    between them, as the fragment index drops it then: here the replica confirmed an append
    in doubt ("dropped", killed before its primary heard of it), and the journal went on
    without it from offset 4 ("other:..."), persisted by the primary in two fragments.
    Uploading the spool would put a fragment with other content at [4, 11) beside them."""
    journal_dir = tmp_path / "store" / JOURNAL
    journal_dir.mkdir(parents=True)
    for begin, content in ((0, b"kept"), (4, b"other:content")):
        frag = _frag(begin, begin + len(content), content)
        (tmp_path / "store" / fragment_content_path(frag)).write_bytes(content)
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"keptdropped")
    await rs.apply_proposal(_frag(0, 11, b"keptdropped"), pb.LabelSet(), primary=False)
    rs.set_confirmed(11)
    # The primary's next pipeline rolls this replica forward, past its end.
    assert (await rs.apply_proposal(_frag(17, 17), pb.LabelSet(), primary=False)).status == pb.OK
    persister.expedite()
    await persister.wait_idle()
    names = sorted(p.name.split("-")[:2] for p in journal_dir.iterdir())
    assert names == [
        ["0000000000000000", "0000000000000004"],
        ["0000000000000004", "0000000000000011"],
    ]
    assert not r.index.local_spools()
    assert [(f.begin, f.end) for f in r.index.persisted()] == [(0, 4), (4, 17)]


async def test_an_empty_roll_at_our_end_takes_the_primarys_registers(
    tmp_path: Path, persister: Persister
) -> None:
    """A replica whose registers differ from its primary's at the same end (it cut content
    the primary never confirmed, and kept the registers that content set) must follow the
    primary's roll, or every later proposal fails (a livelock the chaos suite found)."""
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"abc")
    assert (await rs.apply_proposal(_frag(0, 3, b"abc"), pb.LabelSet(), primary=False)).status == 0
    rs.set_confirmed(rs.end)
    r.registers = label_set({"author": "deposed"})  # Left by cut, unconfirmed content.

    primary_regs = label_set({"author": "current"})
    roll = _frag(3, 3)
    assert (await rs.apply_proposal(roll, primary_regs, primary=False)).status == pb.OK
    assert r.registers == primary_regs
    # The next proposal of the same fragment and registers is agreed, not a mismatch.
    assert (await rs.apply_proposal(roll, primary_regs, primary=False)).status == pb.OK


class _FailedPipeline:
    """A primary's pipeline that broke after sending a confirmation up to `confirm_sent`,
    of which every peer acknowledged those up to `confirmed` (`Replica.close_replication`)."""

    def __init__(self, confirm_sent: int, confirmed: int) -> None:
        self.confirm_sent, self.confirmed = confirm_sent, confirmed
        self.ok = False
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


async def _primary_with_content_in_doubt(
    tmp_path: Path, persister: Persister, *, sync: bool = False
) -> Replica:
    """A primary that confirmed "confirmed;" [0, 10) everywhere, then committed "doubtful"
    [10, 18) and sent the confirmation of it (a route of two: a self-confirming commit) but
    heard no acknowledgement, then committed "tentative" [18, 27), never confirmed."""
    r = _replica(tmp_path, persister, sync=sync)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"confirmed;")
    await rs.apply_proposal(_frag(0, 10, b"confirmed;"), pb.LabelSet(), primary=True)
    r.confirm_through(10)
    await _content(rs, b"doubtful")
    await rs.apply_proposal(_frag(0, 18, b"confirmed;doubtful"), pb.LabelSet(), primary=True)
    await _content(rs, b"tentative")
    await rs.apply_proposal(
        _frag(0, 27, b"confirmed;doubtfultentative"), pb.LabelSet(), primary=True
    )
    pln = _FailedPipeline(confirm_sent=18, confirmed=10)
    r.replication = pln  # type: ignore[assignment]
    await r.close_replication(graceful=False)
    assert pln.aborted and r.replication is None
    assert (rs.confirmed, rs.in_doubt, rs.end) == (10, 18, 27)
    return r


async def _rolled_at_content_in_doubt(
    tmp_path: Path, persister: Persister, *, primary: bool = True, sync: bool = False
) -> tuple[Replica, ReplicatedSpool]:
    """`_primary_with_content_in_doubt`, whose next pipeline kept the content in doubt and
    rolled at its end (a route change): the closed spool [0, 18) is held at the frontier."""
    r = await _primary_with_content_in_doubt(tmp_path, persister, sync=sync)
    rs = r.rspool
    assert rs is not None
    rs.cut_unconfirmed(keep_in_doubt=True)
    roll = await rs.apply_proposal(_frag(18, 18), pb.LabelSet(), primary=primary)
    assert roll.status == pb.OK and (rs.begin, rs.end) == (18, 18)
    return r, rs


async def test_content_in_doubt_survives_a_new_pipeline_hidden_until_confirmed(
    tmp_path: Path, persister: Persister
) -> None:
    """The primary's next pipeline keeps the content a confirmation it sent covers (a peer
    may hold it confirmed): it cuts only what lies beyond it. Readers still see only the
    confirmed frontier, until the new pipeline confirms the rest."""
    r = await _primary_with_content_in_doubt(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    rs.cut_unconfirmed(keep_in_doubt=True)
    assert (rs.begin, rs.end, rs.confirmed, rs.in_doubt) == (0, 18, 10, 18)
    assert fragments_equal(rs.fragment(), _frag(0, 18, b"confirmed;doubtful"))
    assert r.spool is not None and r.spool.read(0, 100) == b"confirmed;doubtful"
    assert r.head == 10
    frag, _, _ = r.index.query(0)
    assert frag is not None and fragments_equal(frag, _frag(0, 10, b"confirmed;"))
    assert r.index.query(10) == (None, None, 10)  # Neither served nor described.
    # Cut again (a pipeline that failed before confirming it): still kept.
    rs.cut_unconfirmed(keep_in_doubt=True)
    assert (rs.end, rs.in_doubt) == (18, 18)

    r.confirm_through(18)  # The new pipeline's synchronisation confirmed it everywhere.
    assert (rs.confirmed, rs.in_doubt, r.head) == (18, -1, 18)
    frag, _, _ = r.index.query(10)
    assert frag is not None and fragments_equal(frag, _frag(0, 18, b"confirmed;doubtful"))


async def test_a_plain_cut_and_completion_drop_content_in_doubt(
    tmp_path: Path, persister: Persister
) -> None:
    """The journal leaving this broker (`complete`) still cuts to the confirmed frontier:
    the route it leaves may go on without this broker."""
    r = await _primary_with_content_in_doubt(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    rs.cut_unconfirmed(keep_in_doubt=True)
    rs.complete(primary=True)
    assert rs.in_doubt == -1
    persister.expedite()
    await persister.wait_idle()
    stored = sorted((tmp_path / "store" / JOURNAL).iterdir())
    assert [p.name.split("-")[:2] for p in stored] == [["0000000000000000", "000000000000000a"]]
    assert stored[0].read_bytes() == b"confirmed;"

    r2 = await _primary_with_content_in_doubt(tmp_path / "other", persister)
    rs2 = r2.rspool
    assert rs2 is not None
    rs2.cut_unconfirmed()
    assert (rs2.end, rs2.in_doubt) == (10, -1)


def _stored(tmp_path: Path) -> list[tuple[str, bytes]]:
    """The journal's fragments in the store: (begin-end offsets in hex, content)."""
    root = tmp_path / "store" / JOURNAL
    if not root.is_dir():
        return []
    return [("-".join(p.name.split("-")[:2]), p.read_bytes()) for p in sorted(root.iterdir())]


async def test_a_roll_keeps_content_in_doubt_and_persists_it_once_confirmed(
    tmp_path: Path, persister: Persister
) -> None:
    """The new pipeline rolls the spool at our end (a route change): the route goes on from
    the content in doubt, which stays in the closed spool. Should that pipeline fail before
    it confirms the roll, the next one still never goes back below it; and the spool is not
    persisted before it is confirmed (a fragment in the store is shown by every broker)."""
    r, rs = await _rolled_at_content_in_doubt(tmp_path, persister)
    assert (rs.begin, rs.end) == (18, 18)
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == []
    rs.cut_unconfirmed(keep_in_doubt=True)  # The next pipeline, the roll unconfirmed.
    assert (rs.begin, rs.end) == (18, 18)

    r.confirm_through(18)  # The synchronisation of a pipeline confirmed the roll.
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == [("0000000000000000-0000000000000012", b"confirmed;doubtful")]


async def test_with_sync_a_spool_held_in_doubt_is_marked_durably(
    tmp_path: Path, persister: Persister, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under --sync, the mark that holds a closed spool back at the frontier (so that a
    restart persists only its confirmed part) is on disk, name and bytes, once written: a
    power loss must not persist content in doubt."""
    synced: list[str] = []
    fdatasync = os.fdatasync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fdatasync(fd)

    dirs_synced_with_a_mark: list[Path] = []
    fsync_dir = replica_module.fsync_dir

    def spy_dir(path: Path) -> None:
        if any(p.suffix == replica_module.HELD_SUFFIX for p in Path(path).iterdir()):
            dirs_synced_with_a_mark.append(Path(path))
        fsync_dir(path)

    monkeypatch.setattr(os, "fdatasync", spy)
    monkeypatch.setattr(replica_module, "fsync_dir", spy_dir)
    await _rolled_at_content_in_doubt(tmp_path, persister, sync=True)
    assert any(p.endswith(replica_module.HELD_SUFFIX) for p in synced), synced
    assert dirs_synced_with_a_mark


async def test_a_journal_leaving_persists_only_the_confirmed_part_of_a_spool_in_doubt(
    tmp_path: Path, persister: Persister
) -> None:
    """The primary rolled at the end of content in doubt, and the journal left this broker
    before any pipeline confirmed the roll: the route may go on without it, with other bytes
    at those offsets, so only the confirmed part of the closed spool is persisted."""
    r, _rs = await _rolled_at_content_in_doubt(tmp_path, persister)
    assert r.head == 10
    await r.stop(persist=True)
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == [("0000000000000000-000000000000000a", b"confirmed;")]
    assert not list((tmp_path / "spools").rglob("*.log"))  # No spool is left behind.


async def test_a_restart_persists_only_the_confirmed_part_of_a_spool_in_doubt(
    tmp_path: Path, persister: Persister
) -> None:
    """The primary rolled at the end of content in doubt, committed more in the next spool,
    and stopped (killed) before anything confirmed the roll. A restart forgets what was in
    doubt: the closed spool is persisted only up to the confirmed frontier."""
    _r, rs = await _rolled_at_content_in_doubt(tmp_path, persister)
    await _content(rs, b"next")
    commit = await rs.apply_proposal(_frag(18, 22, b"next"), pb.LabelSet(), primary=True)
    assert commit.status == pb.OK and rs.confirmed == 10
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == []

    r2 = _replica(tmp_path, persister)  # Killed: its spools are recovered from disk.
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == [("0000000000000000-000000000000000a", b"confirmed;")]
    assert r2.spool is not None and (r2.spool.begin, r2.spool.end) == (18, 22)
    assert r2.head == 10  # The open spool is held back at the frontier, as ever.


async def test_a_frontier_an_earlier_version_kept_per_journal_is_moved_into_the_log(
    tmp_path: Path, persister: Persister
) -> None:
    spool_dir = spool_directory(tmp_path / "spools", JOURNAL)
    spool_dir.mkdir(parents=True)
    (spool_dir / "confirmed").write_bytes(struct.pack("<Q", 7))
    r = _replica(tmp_path, persister)
    assert r.rspool is not None and r.rspool.confirmed == 7
    assert r.frontiers.get(JOURNAL) == 7 and not (spool_dir / "confirmed").exists()
    r.confirm_through(9)
    assert FrontierLog(r.frontiers.path).get(JOURNAL) == 9


async def test_a_restart_persists_closed_spools_whole_past_a_stale_frontier(
    tmp_path: Path, persister: Persister
) -> None:
    """Only a spool held in doubt is cut on a restart. The frontier's file is not synced: a
    machine that lost power may come back with an older one, below content that was
    confirmed and acknowledged. A closed spool not marked in doubt is persisted whole."""
    # The first run persists nothing: its jobs wait in a queue no worker takes from (a
    # persister runs workers as soon as a job is queued, started or not).
    idle = Persister(persister.stores, tmp_path / "idle-scratch", workers_per_store=0)
    r = _replica(tmp_path, idle)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"confirmed;")
    await rs.apply_proposal(_frag(0, 10, b"confirmed;"), pb.LabelSet(), primary=True)
    r.confirm_through(10)
    assert (await rs.apply_proposal(_frag(10, 10), pb.LabelSet(), primary=True)).status == 0
    await _content(rs, b"next")
    await rs.apply_proposal(_frag(10, 14, b"next"), pb.LabelSet(), primary=True)
    r.confirm_through(14)
    r.frontiers.forget(JOURNAL)  # Power was lost: the log comes back with an older frontier.
    r.frontiers.set(JOURNAL, 4)

    r2 = _replica(tmp_path, persister)
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == [("0000000000000000-000000000000000a", b"confirmed;")]
    assert r2.spool is not None and (r2.spool.begin, r2.spool.end) == (10, 14)
    await idle.stop()


async def test_an_orphan_sweep_persists_only_the_confirmed_part_of_a_spool_in_doubt(
    tmp_path: Path, persister: Persister, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a restart, but the journal moved on without this broker while it was down (the
    route may have written other bytes past the frontier): the orphan sweep persists the
    closed spool only up to the confirmed frontier too."""
    r, rs = await _rolled_at_content_in_doubt(tmp_path, persister)
    await _content(rs, b"next")
    commit = await rs.apply_proposal(_frag(18, 22, b"next"), pb.LabelSet(), primary=True)
    assert commit.status == pb.OK and rs.confirmed == 10

    # Killed, and restarted without the journal: its spools are an orphan's, and the
    # journal is settled on other brokers.
    monkeypatch.setattr(cluster_member, "assignments_advertise", lambda _route, _group: True)
    item = SimpleNamespace(mod_revision=1)
    member = SimpleNamespace(
        spool_root=tmp_path / "spools",
        frontiers=r.frontiers,
        _orphan_candidates=None,
        _aside_in_progress=set(),
        resolver=SimpleNamespace(stopping_journals=set(), replicas={}),
        observed=SimpleNamespace(
            current=SimpleNamespace(assignments_of=lambda _name: [_settled_assignment()])
        ),
        keyspace=SimpleNamespace(get=lambda _key: item),
        layout=SimpleNamespace(item_key=lambda name: name),
        decoder=SimpleNamespace(journal_spec=lambda _item: journal_spec(JOURNAL)),
        stores=persister.stores,
        persister=persister,
        sync=False,
    )
    cluster_member.ClusterMember.sweep_orphans_once(member)  # type: ignore[arg-type]
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == [("0000000000000000-000000000000000a", b"confirmed;")]
    assert not list((tmp_path / "spools").rglob("*.log"))  # Nothing is left behind.
    assert r.frontiers.get(JOURNAL) is None  # Nor its frontier: a journal of its name starts
    # afresh here.


def _settled_assignment() -> Assignment:
    return Assignment(
        item=JOURNAL,
        zone="z",
        suffix="s",
        slot=0,
        kv=KeyValue(key="", value=b"", create_revision=1, mod_revision=1),
    )


async def test_a_roll_past_our_end_cuts_content_in_doubt(
    tmp_path: Path, persister: Persister
) -> None:
    """A new primary's pipeline proposes a fragment ending past ours: some member holds
    content beyond ours — the content in doubt, if it took our confirmation, or else what the
    route went on with at those offsets. Ours is cut to the confirmed frontier."""
    r = await _primary_with_content_in_doubt(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    first = pb.ReplicateRequest(
        proposal=_frag(0, 25, b"confirmed;other bytes here"[:25]),
        registers=pb.LabelSet(),
        acknowledge=True,
    )
    first.header.CopyFrom(pb.Header(process_id=pb.ProcessSpec.ID(zone="z", suffix="s")))
    resp = await _apply(r, first, is_first=True)
    # Rolled to an empty fragment at its end (and so not its fragment: Gazette's rule).
    assert resp is not None and resp.status == pb.PROPOSAL_MISMATCH
    assert (resp.fragment.begin, resp.fragment.end) == (25, 25)
    assert (rs.begin, rs.end, rs.in_doubt) == (25, 25, -1)
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == [("0000000000000000-000000000000000a", b"confirmed;")]
    r.confirm_through(25)  # The route's frontier moves past: nothing of ours is shown.
    assert r.index.query(10)[1] is None


async def test_a_foreign_proposal_keeps_content_in_doubt(
    tmp_path: Path, persister: Persister
) -> None:
    """The former primary, now a replica of a new primary's pipeline: its first proposal is
    shorter than the content in doubt, which is kept (not cut to the frontier) and answered
    with PROPOSAL_MISMATCH and the larger fragment, so the new primary rolls forward past
    it. Content beyond it, never confirmed anywhere, is cut."""
    r = await _primary_with_content_in_doubt(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    first = pb.ReplicateRequest(
        proposal=_frag(0, 10, b"confirmed;"), registers=pb.LabelSet(), acknowledge=True
    )
    first.header.CopyFrom(pb.Header(process_id=pb.ProcessSpec.ID(zone="z", suffix="s")))
    resp = await _apply(r, first, is_first=True)
    assert resp is not None and resp.status == pb.PROPOSAL_MISMATCH
    assert fragments_equal(resp.fragment, _frag(0, 18, b"confirmed;doubtful"))
    assert (rs.end, rs.confirmed) == (18, 10)
    # The new primary rolls forward to its end; the new pipeline then confirms it.
    roll = pb.ReplicateRequest(proposal=_frag(18, 18), registers=pb.LabelSet(), acknowledge=True)
    resp = await _apply(r, roll, is_first=False)
    assert resp is not None and resp.status == pb.OK and (rs.begin, rs.end) == (18, 18)


def _shown_within_head(r: Replica) -> None:
    """Every fragment readers may be shown (a Read's or ListFragments') ends at or below the
    write head readers are shown (Gazette's ReadResponse rule)."""
    for spool in r.index.local_spools():
        assert spool.readable_fragment().end <= max(r.head, spool.begin), (spool.begin, r.head)
    for frag in r.index.persisted():
        assert frag.end <= r.head


@pytest.mark.parametrize("primary", [True, False])
async def test_a_rolled_spool_in_doubt_is_hidden_and_unpersisted_until_confirmed(
    tmp_path: Path, persister: Persister, primary: bool
) -> None:
    """A roll that keeps content in doubt (the route goes on from our end) closes the spool
    still held back at the confirmed frontier: no response describes it past the write
    head, which stays there, and it is not persisted, until the frontier reaches the
    spool's end (the new pipeline's synchronisation)."""
    r, rs = await _rolled_at_content_in_doubt(tmp_path, persister, primary=primary)
    assert (rs.begin, rs.end, rs.confirmed) == (18, 18, 10)
    assert r.spool is None and r.head == 10
    _shown_within_head(r)
    assert r.index.query(10) == (None, None, 10)
    assert r.holds_unconfirmed(10)
    frag, _, _ = r.index.query(0)
    assert frag is not None and fragments_equal(frag, _frag(0, 10, b"confirmed;"))
    persister.expedite()
    await persister.wait_idle()
    assert _stored(tmp_path) == [] and r.head == 10  # Not persisted while in doubt.

    r.confirm_through(18)
    assert r.head == 18 and rs.in_doubt == -1
    _shown_within_head(r)
    frag, spool, _ = r.index.query(10)
    assert frag is not None and fragments_equal(frag, _frag(0, 18, b"confirmed;doubtful"))
    persister.expedite()
    await persister.wait_idle()
    # Persisted once confirmed.
    assert r.index.local_spools() == [] and r.head == 18
    _shown_within_head(r)
    frag, spool, _ = r.index.query(10)
    assert spool is None and frag is not None and (frag.begin, frag.end) == (0, 18)


async def test_a_commit_cut_short_while_it_syncs_is_accounted_for(
    tmp_path: Path, persister: Persister, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `sync`, a commit runs on a worker thread, which goes on when the awaiting task
    is cancelled (a replica's stream cancelled by its primary's failing pipeline, or a
    primary's append by its client). The spool then holds the commit: the replicated spool
    must know it, or the next append is written after it while proposals say otherwise, and
    the failed append's bytes end up in the fragment at offsets the journal reuses."""
    r = Replica(
        journal_spec(JOURNAL),
        1,
        spool_root=tmp_path / "spools",
        stores=persister.stores,
        persister=persister,
        sync=True,
    )
    r.recover_replicated()
    r.readable_end = r.rspool.confirmed if r.rspool is not None else None
    rs = r.rspool
    assert rs is not None
    release, entered = threading.Event(), threading.Event()
    original = Spool.commit

    def slow_commit(self: Spool, *args: object, **kwargs: object) -> None:
        entered.set()
        release.wait(10)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Spool, "commit", slow_commit)
    await _content(rs, b"failed append")
    commit = asyncio.ensure_future(
        rs.apply_proposal(_frag(0, 13, b"failed append"), pb.LabelSet(), primary=False)
    )
    assert await asyncio.to_thread(entered.wait, 10)
    commit.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await commit
    rs.rollback()  # As the cancelled stream's end does.
    for _ in range(500):  # The worker thread goes on: the commit lands.
        if r.spool is not None and r.spool.end == 13:
            break
        await asyncio.sleep(0.01)
    assert r.spool is not None and r.spool.end == 13
    assert rs.end == r.spool.end

    # A new pipeline proposes the journal without it: the commit (unconfirmed) is cut, and
    # the next append lands at offset 0.
    assert rs.unconfirmed
    rs.cut_unconfirmed(keep_in_doubt=True)
    assert (await rs.apply_proposal(_frag(0, 0), pb.LabelSet(), primary=False)).status == pb.OK
    await _content(rs, b"other")
    ok = await rs.apply_proposal(_frag(0, 5, b"other"), pb.LabelSet(), primary=False)
    assert ok.status == pb.OK
    assert r.spool is not None and r.spool.read(0, 100) == b"other"


class _StalledPipeline:
    """A primary's pipeline whose peer stopped answering: a confirmation never returns."""

    def __init__(self) -> None:
        self.ok = True
        self.confirm_sent, self.confirmed = 10, 0
        self.aborted = False
        self.confirming = asyncio.Event()

    async def confirm(self, upto: int) -> None:
        self.confirming.set()
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


async def test_closing_a_pipeline_cut_short_gives_the_spool_back(
    tmp_path: Path, persister: Persister
) -> None:
    """An append (or a pulse) that finds its pipeline on an old route closes it gracefully,
    confirming what was acknowledged; a peer gone silent holds that up to the acknowledgement
    timeout, and the append's client may give up first. Cancelled there, the closing must
    still drop the pipeline and give its spool back: the journal has no pipeline any more, so
    nothing else would, and every later append waited for the spool forever."""
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    await _content(rs, b"confirmed;")
    await rs.apply_proposal(_frag(0, 10, b"confirmed;"), pb.LabelSet(), primary=True)
    await r.spool_lock.acquire()  # As `_start_pipeline`: the pipeline owns the spool.
    pln = _StalledPipeline()
    r.replication = pln  # type: ignore[assignment]
    closing = asyncio.ensure_future(r.close_replication())
    await pln.confirming.wait()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert r.replication is None and pln.aborted
    assert not r.spool_lock.locked()
    assert rs.in_doubt == 10  # Its confirmation may have reached a peer.


@pytest.mark.parametrize("restart", [False, True])
async def test_cutting_a_whole_unconfirmed_spool_takes_its_registers_back(
    tmp_path: Path, persister: Persister, restart: bool
) -> None:
    """The first append to a fragment (the spool begins at the confirmed frontier) sets new
    registers and is never confirmed: the next pipeline cuts the whole spool, and with it the
    registers that append set, as it does when it cuts part of a spool. Left in place, they
    were proposed to every replica with the next roll: the journal's registers were those of
    an append that failed and never surfaces (a later check_registers judged against it)."""
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    before, failed = label_set({"author": "before"}), label_set({"author": "failed"})
    await _content(rs, b"confirmed;")
    await rs.apply_proposal(_frag(0, 10, b"confirmed;"), before, primary=True)
    r.confirm_through(10)
    # A roll: the next fragment begins at the frontier.
    assert (await rs.apply_proposal(_frag(10, 10), before, primary=True)).status == pb.OK
    await _content(rs, b"failed")
    await rs.apply_proposal(_frag(10, 16, b"failed"), failed, primary=True)
    assert r.registers == failed and rs.unconfirmed
    if restart:  # The broker restarts before the next pipeline.
        r = _replica(tmp_path, persister)
        rs = r.rspool
        assert rs is not None and r.registers == failed and rs.unconfirmed

    rs.cut_unconfirmed(keep_in_doubt=True)  # As the next pipeline does.
    assert (rs.begin, rs.end) == (10, 10)
    assert r.registers == before
    assert fragments_equal(rs.fragment(), _frag(10, 10))


async def test_content_cut_short_while_it_is_written_is_never_written_after_the_next(
    tmp_path: Path, persister: Persister, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large chunk is written on a worker thread. Cancelled there (the stream ends), the
    write goes on; the next append's content lands at the same offsets past the committed
    end. The cancelled write must be over before anything else is written there, or it lands
    over the next append's bytes, which then commit with a SHA-1 their spool doesn't hold."""
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    release, entered, written = threading.Event(), threading.Event(), threading.Event()
    original = replicated_spool._write_and_hash

    def slow(pending: Any, running: Any, content: bytes) -> None:
        if content[:1] != b"A":
            original(pending, running, content)
            return
        entered.set()
        release.wait(10)
        original(pending, running, content)
        written.set()

    monkeypatch.setattr(replicated_spool, "_write_and_hash", slow)
    big = 256 << 10
    cut_short = asyncio.ensure_future(rs.apply_content(b"A" * big, 0))
    assert await asyncio.to_thread(entered.wait, 10)
    cut_short.cancel()
    # Not given up while its write goes on (the stream's end then rolls it back).
    done, _ = await asyncio.wait([cut_short], timeout=0.5)
    try:
        if done:  # It was: the next append streams in while the write goes on.
            rs.rollback()
            await _content(rs, b"B" * big)
            ok = await rs.apply_proposal(_frag(0, big, b"B" * big), pb.LabelSet(), primary=False)
            assert ok.status == pb.OK
    finally:
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await cut_short
    if not done:
        rs.rollback()
        await _content(rs, b"B" * big)
        ok = await rs.apply_proposal(_frag(0, big, b"B" * big), pb.LabelSet(), primary=False)
        assert ok.status == pb.OK
    assert await asyncio.to_thread(written.wait, 10)
    assert r.spool is not None and r.spool.read(0, big) == b"B" * big
