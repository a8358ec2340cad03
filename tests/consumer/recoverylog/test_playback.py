"""Recording into, and playing back, recovery logs on a real broker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pygazette.cli.shards_cmd import live_segments, overlaps_any_segment
from pygazette.client import JournalClient, RetryReader, append
from pygazette.client.fragments import list_all_fragments
from pygazette.consumer.recoverylog import (
    FNODE_STAGING_DIR,
    FSM,
    Author,
    FnodeNotTracked,
    LinkExists,
    Player,
    PlayerError,
    Recorder,
    RecorderFailed,
    RecorderFenced,
)
from pygazette.consumer.recoverylog import player as player_module
from pygazette.message.fixed_framing import encode_fixed_frame
from pygazette.protocol.errors import RegisterMismatch
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.consumer.recoverylog.conftest import (
    link_groups,
    new_log,
    play_to_head,
    read_ops,
    take_over,
    tree,
)
from tests.support.broker_process import BrokerProcess


class Files:
    """Does file operations in a directory and records them."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.root = rec.root

    def create(self, path: str, data: bytes = b"") -> int:
        # Like Gazette's, a recorded create of an existing path replaces its file with a
        # new one (rather than truncating a file which may have other links).
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).unlink(missing_ok=True)
        (self.root / path).write_bytes(b"")
        fnode = self.rec.record_create(path)
        if data:
            self.write(path, 0, data)
        return fnode

    def write(self, path: str, offset: int, data: bytes) -> None:
        fd = os.open(self.root / path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        fnode = self.rec.fnode_of(path)
        assert fnode is not None
        self.rec.record_write(fnode, offset, data)

    def link(self, src: str, dst: str) -> None:
        (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
        os.link(self.root / src, self.root / dst)
        fnode = self.rec.fnode_of(src)
        assert fnode is not None
        self.rec.record_link(fnode, dst)

    def remove(self, path: str) -> None:
        fnode = self.rec.fnode_of(path)
        assert fnode is not None
        (self.root / path).unlink()
        self.rec.record_unlink(fnode, path)

    def rename(self, src: str, dst: str) -> None:
        (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.root / src, self.root / dst)
        self.rec.record_rename(src, dst)

    def prop(self, path: str, content: str) -> None:
        (self.root / path).write_text(content)
        self.rec.record_property(path, content)


async def test_record_then_play_gives_identical_files(
    client: JournalClient, tmp_path: Path
) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "primary")
    assert tree(rec.root) == {}
    f = Files(rec)

    f.create("a/one", b"hello")
    f.write("a/one", 5, b", world")
    f.create("two", b"x" * 100_000)
    f.link("two", "b/two-link")
    f.prop("IDENTITY", "db-id-1")
    first_end = await rec.commit()

    f.create("doomed", b"soon gone")
    f.rename("a/one", "a/renamed")
    f.write("two", 50_000, b"middle")
    f.remove("doomed")
    f.create("sparse")
    f.write("sparse", 1000, b"tail")
    end = await rec.commit()
    assert end > first_end and rec.write_head == end

    expect = tree(rec.root)
    assert set(expect) == {"a/renamed", "two", "b/two-link", "IDENTITY", "sparse"}

    # From the beginning of the log, and from the recorder's hints.
    for name, hints in [("empty", rpb.FSMHints(log=log)), ("hinted", rec.build_hints())]:
        fsm = await play_to_head(client, hints, tmp_path / name)
        assert tree(tmp_path / name) == expect, name
        assert link_groups(tmp_path / name) == link_groups(rec.root)
        assert not (tmp_path / name / FNODE_STAGING_DIR).exists()
        assert fsm.links == rec.fsm.links
        assert fsm.properties == {"/IDENTITY": "db-id-1"}
        assert (fsm.next_seq_no, fsm.next_checksum) == (
            rec.fsm.next_seq_no,
            rec.fsm.next_checksum,
        )


async def test_recorded_paths_and_ops_are_gazettes(client: JournalClient, tmp_path: Path) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "d", author=1234)
    begin = rec.write_head
    fnode = rec.record_create(tmp_path / "d" / "path" / "to" / "file")  # Absolute, under root.
    assert fnode == rec.fnode_of("path/to/file") == rec.fnode_of("path//to/./file")
    rec.record_write(fnode, 0, b"first-write")
    rec.record_link(fnode, "linked")
    await rec.commit()

    ops = [op for at, op in await read_ops(client, log) if at >= begin]
    assert ops[0].create.path == "/path/to/file"
    assert ops[0].author == 1234 and ops[0].seq_no == fnode
    assert (ops[1].write.fnode, ops[1].write.offset, ops[1].write.length) == (fnode, 0, 11)
    assert ops[2].link == rpb.RecordedOp.Link(fnode=fnode, path="/linked")
    # Meta fields are never written.
    assert all(op.first_offset == op.last_offset == 0 and not op.log for op in ops)

    # The hints name the exact offset of the first op (single writer), and omit the log.
    hints = rec.build_hints()
    assert hints.log == log
    (node,) = hints.live_nodes
    (segment,) = node.segments
    assert (node.fnode, segment.author, segment.first_seq_no, segment.last_seq_no) == (
        fnode,
        1234,
        fnode,
        fnode + 2,
    )
    assert (segment.first_offset, segment.last_offset, segment.log) == (begin, 0, "")

    with pytest.raises(ValueError):
        rec.record_create("../outside")
    with pytest.raises(ValueError):
        rec.record_create(tmp_path / "elsewhere")
    with pytest.raises(LinkExists):
        rec.record_link(fnode, "linked")
    with pytest.raises(FnodeNotTracked):
        rec.record_write(fnode + 100, 0, b"x")


async def test_standby_tails_while_the_log_grows(client: JournalClient, tmp_path: Path) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "primary")
    f = Files(rec)
    f.create("early", b"before the standby")
    await rec.commit()

    standby = Player(client, rpb.FSMHints(log=log), tmp_path / "standby")
    task = asyncio.create_task(standby.play())
    await asyncio.wait_for(standby.tailing.wait(), 30)

    for i in range(20):
        f.create(f"f{i}", os.urandom(1000 + i))
        if i % 3 == 0:
            f.remove(f"f{i}")
        await rec.commit()
        await asyncio.sleep(0.01)
    assert not task.done()

    standby.finish_at_write_head()
    fsm = await asyncio.wait_for(task, 30)
    assert tree(tmp_path / "standby") == tree(rec.root)
    assert fsm.links == rec.fsm.links
    assert [n.fnode for n in fsm.build_hints(log).live_nodes] == [
        n.fnode for n in rec.build_hints().live_nodes
    ]


async def test_handoff_fences_the_previous_recorder(client: JournalClient, tmp_path: Path) -> None:
    log = await new_log(client)
    old_author, new_author = Author(1111), Author(2222)
    old = await take_over(client, rpb.FSMHints(log=log), tmp_path / "old", old_author)
    f = Files(old)
    f.create("kept", b"committed by the old primary")
    await old.commit()
    hints = old.build_hints()

    # A standby tails, then is promoted: it hands the log off to a new author.
    standby = Player(client, hints, tmp_path / "new")
    task = asyncio.create_task(standby.play())
    await asyncio.wait_for(standby.tailing.wait(), 30)
    f.write("kept", 0, b"COMMITTED")  # The old primary is still recording meanwhile.
    await old.commit()
    standby.inject_handoff(new_author)
    fsm = await asyncio.wait_for(task, 30)
    assert tree(tmp_path / "new") == {"kept": b"COMMITTED by the old primary"}
    head = fsm.read_through

    # The deposed recorder can append nothing more.
    f.create("zombie", b"never in the log")
    with pytest.raises(RecorderFenced):
        await old.commit()
    with pytest.raises(RecorderFenced):
        old.record_create("more")
    with pytest.raises(RecorderFenced):
        await old.commit()
    with pytest.raises(RecorderFenced):
        old.build_hints()

    ops = await read_ops(client, log)
    assert [op.author for at, op in ops if at >= head] == []
    handoff = [op for _at, op in ops if op.author == new_author]
    assert len(handoff) == 1
    assert not any(
        handoff[0].HasField(k) for k in ("create", "link", "unlink", "write", "property")
    )

    # The new primary records on; players see its history, not the zombie's.
    new = Recorder(client, fsm, new_author, tmp_path / "new")
    g = Files(new)
    g.create("fresh", b"by the new primary")
    await new.commit()
    assert all(op.author == new_author for at, op in await read_ops(client, log) if at >= head)
    await play_to_head(client, new.build_hints(), tmp_path / "check")
    assert tree(tmp_path / "check") == tree(tmp_path / "new")
    assert "zombie" not in tree(tmp_path / "check")


async def test_handoff_retries_after_losing_a_race(
    client: JournalClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec", Author(77))
    Files(rec).create("a", b"aaa")
    await rec.commit()

    # Just before the player injects its no-op, another (unfenced) writer appends an op
    # sequenced exactly where the no-op would go: the no-op loses, and the player retries.
    real_inject = Player._inject_noop
    raced: list[int] = []

    async def racing_inject(self: Player, fsm: FSM, author: int) -> int:
        if not raced:
            op = rpb.RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=77)
            resp = await append(client, log, encode_fixed_frame(op.SerializeToString()))
            raced.append(resp.commit.begin)
        return await real_inject(self, fsm, author)

    monkeypatch.setattr(Player, "_inject_noop", racing_inject)
    player = Player(client, rec.build_hints(), tmp_path / "new")
    player.inject_handoff(88)
    fsm = await asyncio.wait_for(player.play(), 30)
    assert raced
    handoffs = [at for at, op in await read_ops(client, log) if op.author == 88]
    assert len(handoffs) == 2  # The first was mis-sequenced, the second applied.
    assert fsm.read_through > handoffs[1]
    assert tree(tmp_path / "new") == {"a": b"aaa"}
    # The winner's FSM follows its own no-op.
    assert fsm.next_seq_no == rec.fsm.next_seq_no + 2


async def test_handoff_after_losing_a_race_with_a_retried_noop(
    client: JournalClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The no-op loses a race (as above), and its append was retried, its first attempt
    having committed (a response lost to a broker restart): the log holds the no-op twice.
    Reading on to the head to try again, the player meets the duplicate (of its own author,
    not sequenced) and must go on, not fail the hand-off."""
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec", Author(77))
    Files(rec).create("a", b"aaa")
    await rec.commit()

    real_append = player_module.append_to_log
    raced: list[int] = []

    async def racing_then_retried(client: JournalClient, journal: str, data: Any, **kw: Any) -> Any:
        if kw.get("union_registers") is None or raced:
            return await real_append(client, journal, data, **kw)
        # Another (unfenced) writer's op, sequenced where the no-op would go.
        op = rpb.RecordedOp(seq_no=rec.fsm.next_seq_no, checksum=rec.fsm.next_checksum, author=77)
        resp = await append(client, log, encode_fixed_frame(op.SerializeToString()))
        raced.append(resp.commit.begin)
        await real_append(client, journal, data, **kw)  # Committed; its response lost.
        return await real_append(client, journal, data, **kw)  # The retry.

    monkeypatch.setattr(player_module, "append_to_log", racing_then_retried)
    player = Player(client, rec.build_hints(), tmp_path / "new")
    player.inject_handoff(88)
    fsm = await asyncio.wait_for(player.play(), 30)
    assert raced
    handoffs = [at for at, op in await read_ops(client, log) if op.author == 88]
    assert len(handoffs) == 3  # Two copies mis-sequenced, then one applied.
    assert fsm.read_through > handoffs[2]
    assert tree(tmp_path / "new") == {"a": b"aaa"}
    assert fsm.next_seq_no == rec.fsm.next_seq_no + 2


async def test_recovery_from_hints_reads_only_live_segments(
    client: JournalClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec")
    f = Files(rec)
    for i in range(5):  # A stretch of log whose files are all gone.
        f.create(f"tmp{i}", os.urandom(20_000))
        await rec.commit()
        f.remove(f"tmp{i}")
        await rec.commit()
    f.create("live", b"the only live file")
    await rec.commit()
    hints = rec.build_hints()
    (node,) = hints.live_nodes
    first_offset = node.segments[0].first_offset
    assert first_offset > 100_000

    reads: list[tuple[str, int]] = []

    class SpyReader(RetryReader):
        def __init__(
            self, client: JournalClient, journal: str, *, offset: int, block: bool
        ) -> None:
            reads.append((journal, offset))
            super().__init__(client, journal, offset=offset, block=block)

    monkeypatch.setattr(player_module, "RetryReader", SpyReader)
    await play_to_head(client, hints, tmp_path / "hinted")
    assert tree(tmp_path / "hinted") == {"live": b"the only live file"}
    assert reads and min(offset for _j, offset in reads) == first_offset

    reads.clear()
    await play_to_head(client, rpb.FSMHints(log=log), tmp_path / "full")
    assert min(offset for _j, offset in reads) == 0
    assert tree(tmp_path / "full") == tree(tmp_path / "hinted")


async def test_a_file_dead_when_hints_were_built_is_not_played_back(
    client: JournalClient, tmp_path: Path
) -> None:
    """Hints name the files live when they were built; the player replays only the stretches
    of log holding them, and jumps over the rest. A file created inside a replayed stretch
    after the last hinted file's creation was dead when the hints were built: it must not be
    tracked, as the ops that renamed and removed it may lie in a stretch jumped over. It was:
    the file came back, and its removal, replayed after the hints, failed to apply and
    stalled the FSM, so that every later op (here a committed write) was lost."""
    log = await new_log(client)
    first = await take_over(client, rpb.FSMHints(log=log), tmp_path / "first")
    f = Files(first)
    f.create("keep", b"kept")
    f.create("doomed", b"removed by the next primary")
    f.rename("keep", "kept")  # Extends kept's stretch past doomed's creation.
    await first.commit()

    second = await take_over(client, first.build_hints(), tmp_path / "second")
    f = Files(second)
    f.rename("doomed", "moved")  # Jumped over: no live file's op.
    await second.commit()
    f.write("kept", 0, b"KEPT")
    f.remove("moved")  # After the last hinted stretch.
    await second.commit()
    hints = second.build_hints()  # As a primary stores them.
    f.write("kept", 4, b", and written after the hints")
    await second.commit()

    expect = {"kept": b"KEPT, and written after the hints"}
    assert tree(second.root) == expect
    await play_to_head(client, hints, tmp_path / "hinted")
    assert tree(tmp_path / "hinted") == expect
    # And a primary taking over from those hints continues from the right state.
    third = await take_over(client, hints, tmp_path / "third")
    assert tree(third.root) == expect
    assert (third.fsm.next_seq_no, third.fsm.links) == (
        second.fsm.next_seq_no + 1,  # After its hand-off no-op.
        second.fsm.links,
    )


async def test_a_log_missing_fragments_is_refused_without_hints(
    client: JournalClient, tmp_path: Path, rl_broker: BrokerProcess
) -> None:
    """Without hints, a player replays the log from its first operation (sequence number 1)
    on, every operation in turn. Where fragments holding some are gone (removed by `shards
    prune` while hints were kept, and the hints then lost: a changed hint_prefix, a shard
    deleted and applied again; or removed by a store's retention), no later operation
    applies: the player read through the log and completed with an empty directory, or the
    files as of before the gap, and a shard recovering so went on from that state, with
    nothing said (Gazette's Player does the same). It now fails, naming what is gone;
    playback from hints that don't need the removed fragments still works."""

    async def fragments(log: str) -> list[pb.Fragment]:
        return [f.spec for f in await list_all_fragments(client, log)]

    async def persisted(log: str, count: int) -> list[pb.Fragment]:
        for _ in range(300):
            frags = await fragments(log)
            if all(f.mod_time for f in frags[:count]):
                return frags
            await asyncio.sleep(0.05)
        raise AssertionError(f"fragments of {log} not persisted: {frags}")

    def files_of(log: str, frag: pb.Fragment) -> list[Path]:
        return list(rl_broker.file_root.glob(f"{log}/{frag.begin:016x}-{frag.end:016x}-*"))

    async def listed(log: str, removed: pb.Fragment, aged: bool) -> None:
        """Wait until the broker's listing drops `removed` (and shows the next one aged)."""
        for _ in range(300):
            frags = await fragments(log)
            if removed.begin not in [f.begin for f in frags] and (
                not aged or frags[2].mod_time < time.time() - 6 * 3600
            ):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the broker's listing of {log} did not change: {frags}")

    for gone in ("beginning", "middle"):
        log = await new_log(client)
        rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / gone / "rec")
        f = Files(rec)
        f.create("first", os.urandom(1_100_000))  # Fills a fragment (1 MiB).
        await rec.commit()
        f.create("second", os.urandom(1_100_000))  # And the next.
        await rec.commit()
        f.remove("second")
        if gone == "beginning":
            f.remove("first")
        f.create("third", os.urandom(1_100_000))
        await rec.commit()
        f.create("kept", b"created last")
        await rec.commit()
        expect = tree(rec.root)
        # The hints of a later primary, whose player learned where each segment ends.
        rec = await take_over(client, rec.build_hints(), tmp_path / gone / "later")
        hints = rec.build_hints()
        # [noop) [first) [second) [third) [kept, noop: still spooled]
        frags = await persisted(log, 4)
        removed = frags[0] if gone == "beginning" else frags[2]
        # No hinted file's: `shards prune` removes it.
        assert not overlaps_any_segment(live_segments(hints), removed)
        (path,) = files_of(log, removed)
        path.unlink()
        if gone == "middle":
            # A broker skips a gap only once the fragment after it is six hours old (before
            # that, it may still be on its way to the store): age it.
            aged = time.time() - 7 * 3600
            os.utime(*files_of(log, frags[3]), (aged, aged))
        await listed(log, removed, aged=gone == "middle")

        with pytest.raises(
            PlayerError,
            match=r"there are no hints to start from: "
            + ("the log's beginning" if gone == "beginning" else r"offsets \[\d+, \d+\)")
            + r" was removed .*possible data loss",
        ):
            await play_to_head(client, rpb.FSMHints(log=log), tmp_path / gone / "unhinted")
        assert not (tmp_path / gone / "unhinted").exists()
        await play_to_head(client, hints, tmp_path / gone / "hinted")
        assert tree(tmp_path / gone / "hinted") == expect


async def test_player_skips_garbage_and_foreign_ops(client: JournalClient, tmp_path: Path) -> None:
    log = await new_log(client)
    await append(client, log, b"irrelevant preceding content")
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec")
    f = Files(rec)
    f.create("foo/bar", b"hello")
    await rec.commit()
    await append(client, log, b"... garbage data ...")
    # A frame of some other author, out of sequence; and a duplicate of a real op.
    stray = rpb.RecordedOp(seq_no=2, checksum=0, author=999, write=rpb.RecordedOp.Write(fnode=1))
    await append(client, log, encode_fixed_frame(stray.SerializeToString()))
    f.write("foo/bar", 5, b" world")
    await rec.commit()

    for name, hints in [("empty", rpb.FSMHints(log=log)), ("hinted", rec.build_hints())]:
        await play_to_head(client, hints, tmp_path / name)
        assert tree(tmp_path / name) == {"foo/bar": b"hello world"}, name


async def test_commits_are_ordered_and_hints_only_describe_committed_ops(
    client: JournalClient, tmp_path: Path
) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec")
    f = Files(rec)
    assert await rec.commit() == rec.write_head  # Nothing recorded: nothing appended.
    empty_hints = rec.build_hints()

    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    f.create("first", b"1")
    first = asyncio.create_task(rec.commit([gate]))
    await asyncio.sleep(0)
    f.create("second", b"2")
    second = asyncio.create_task(rec.commit())
    await asyncio.sleep(0.2)
    assert not first.done() and not second.done()  # The second waits for the first.
    assert rec.build_hints() == empty_hints  # Neither committed yet.

    f.create("third", b"3")  # Buffered, not committed.
    gate.set_result(None)
    end1 = await first
    hints1 = rec.build_hints()
    assert [n.fnode for n in hints1.live_nodes] == [rec.fnode_of("first")]
    end2 = await second
    assert end2 > end1
    hints2 = rec.build_hints()
    assert [n.fnode for n in hints2.live_nodes] == [rec.fnode_of("first"), rec.fnode_of("second")]
    await rec.commit()
    assert len(rec.build_hints().live_nodes) == 3

    # Hints of a commit are playable on their own.
    await play_to_head(client, hints1, tmp_path / "p1")
    assert tree(tmp_path / "p1") == tree(rec.root)


async def test_failed_dependency_fails_the_recorder(client: JournalClient, tmp_path: Path) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec")
    before = rec.write_head
    rec.record_create("x")

    async def fails() -> None:
        raise RuntimeError("upstream append failed")

    with pytest.raises(RuntimeError, match="upstream"):
        await rec.commit([fails()])
    with pytest.raises(RecorderFailed):
        rec.record_create("y")
    with pytest.raises(RecorderFailed):
        await rec.commit()
    assert [op for at, op in await read_ops(client, log) if at >= before] == []

    # A failed dependency of an empty commit fails only that commit.
    rec2 = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec2")
    with pytest.raises(RuntimeError):
        await rec2.commit([fails()])
    rec2.record_create("z")
    await rec2.commit()


async def test_recorder_of_another_author_is_fenced(client: JournalClient, tmp_path: Path) -> None:
    log = await new_log(client)
    # As in Gazette, a log without registers accepts any register check...
    fsm = await play_to_head(client, rpb.FSMHints(log=log), tmp_path / "d")
    rec = Recorder(client, fsm, Author(5), tmp_path / "d")
    rec.record_create("a")
    await rec.commit()

    # ... but once a hand-off placed an author's fence, only that author may append.
    owner = await take_over(client, rec.build_hints(), tmp_path / "owner", Author(6))
    fsm = await play_to_head(client, owner.build_hints(), tmp_path / "other")
    other = Recorder(client, fsm, Author(7), tmp_path / "other")
    other.record_create("b")
    with pytest.raises(RecorderFenced) as info:
        await other.commit()
    assert isinstance(info.value.__cause__, RegisterMismatch)
    owner.record_create("c")
    await owner.commit()


async def test_recorder_forking_into_another_log(client: JournalClient, tmp_path: Path) -> None:
    source = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=source), tmp_path / "src")
    Files(rec).create("a", b"from the source log")
    await rec.commit()
    fsm = await play_to_head(client, rec.build_hints(), tmp_path / "copy")

    # Recording the recovered FSM into a new log: a fenced no-op sequences it there.
    target = await new_log(client)
    fork = Recorder(client, fsm, Author(31337), tmp_path / "copy", journal=target)
    Files(fork).create("b", b"in the new log")
    await fork.commit()
    (noop_at, noop), *_ = await read_ops(client, target)
    assert noop_at == 0 and noop.author == 31337 and noop.seq_no == rec.fsm.next_seq_no

    hints = fork.build_hints()
    assert hints.log == target
    assert {s.log for n in hints.live_nodes for s in n.segments} == {source, ""}
    await play_to_head(client, hints, tmp_path / "forked")
    assert tree(tmp_path / "forked") == tree(tmp_path / "copy")


async def test_player_errors_and_cancellation_clean_up(
    client: JournalClient, tmp_path: Path
) -> None:
    log = await new_log(client)
    # Hints promising a segment beyond the log's write head.
    bad = rpb.FSMHints(log=log)
    bad.live_nodes.add(
        fnode=1, segments=[rpb.Segment(author=1, first_seq_no=1, last_seq_no=1, first_offset=50)]
    )
    player = Player(client, bad, tmp_path / "bad")
    player.finish_at_write_head()
    with pytest.raises(PlayerError, match="possible data loss"):
        await player.play()
    assert not (tmp_path / "bad").exists()

    # Cancelling a tailing player removes its directory, too.
    standby = Player(client, rpb.FSMHints(log=log), tmp_path / "standby")
    task = asyncio.create_task(standby.play())
    await asyncio.wait_for(standby.tailing.wait(), 30)
    assert (tmp_path / "standby").exists()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (tmp_path / "standby").exists()

    standby.finish_at_write_head()
    with pytest.raises(RuntimeError):
        standby.inject_handoff(3)


async def test_standby_follows_a_handoff_to_another_primary(
    client: JournalClient, tmp_path: Path
) -> None:
    log = await new_log(client)
    first = await take_over(client, rpb.FSMHints(log=log), tmp_path / "first", Author(1))
    f = Files(first)
    f.create("shared", b"v1")
    await first.commit()

    standby = Player(client, first.build_hints(), tmp_path / "standby")
    standby_task = asyncio.create_task(standby.play())
    await asyncio.wait_for(standby.tailing.wait(), 30)

    # Another replica is promoted while the standby tails.
    second = await take_over(client, first.build_hints(), tmp_path / "second", Author(2))
    f.write("shared", 0, b"v2")
    with pytest.raises(RecorderFenced):
        await first.commit()
    g = Files(second)
    g.write("shared", 2, b"-by-second")
    g.create("new", b"from the second primary")
    await second.commit()

    standby.finish_at_write_head()
    fsm = await asyncio.wait_for(standby_task, 30)
    assert tree(tmp_path / "standby") == tree(second.root)
    assert tree(tmp_path / "standby")["shared"] == b"v1-by-second"
    assert (fsm.next_seq_no, fsm.next_checksum) == (
        second.fsm.next_seq_no,
        second.fsm.next_checksum,
    )


async def test_cancelled_commit_fails_the_recorder(client: JournalClient, tmp_path: Path) -> None:
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "rec")
    rec.record_create("x")
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(rec.commit([never]))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not never.cancelled()  # A future owned by someone else is left alone.
    assert isinstance(rec.failed, RecorderFailed)
    with pytest.raises(RecorderFailed):
        await rec.commit()


def _fds_under(directory: Path) -> list[str]:
    """What this process's open file descriptors name under `directory`."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory)):
                out.append(target)
    return out


async def test_cancelled_while_making_files_live_leaks_no_file(
    client: JournalClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Playback ends by linking its staged files into place, in a thread; a cancellation
    # then (the replica stopped) used to clean up at once, under that thread: it closed
    # staged files the thread was still to close (a double close, of a descriptor number
    # the process may have reused meanwhile), removed the directory under it, and left the
    # file the thread held open for ever (its link failed: the directory was gone).
    log = await new_log(client)
    rec = await take_over(client, rpb.FSMHints(log=log), tmp_path / "primary", Author(1))
    f = Files(rec)
    for name in ("a", "b", "c"):
        f.create(name, name.encode() * 100)
    await rec.commit()

    linking, release, linked = threading.Event(), threading.Event(), threading.Event()
    real_link = os.link

    def slow_link(src: Any, dst: Any, **kwargs: Any) -> None:
        if not linking.is_set():
            linking.set()
            release.wait(30)
        try:
            real_link(src, dst, **kwargs)
        finally:
            linked.set()

    monkeypatch.setattr(player_module.os, "link", slow_link)
    directory = tmp_path / "standby"
    player = Player(client, rec.build_hints(), directory)
    player.finish_at_write_head()
    task = asyncio.ensure_future(player.play())
    await asyncio.to_thread(linking.wait, 30)  # In the thread, its first file taken.
    task.cancel()
    # Playback must not end while the thread still works on its files: it used to, at once.
    await asyncio.wait({task}, timeout=0.5)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(linked.wait, 30)
    assert _fds_under(directory) == []
    assert not directory.exists()
