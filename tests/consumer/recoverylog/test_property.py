"""Property: any sequence of file operations, recorded and committed in any grouping, plays
back into identical directory contents (from the log's beginning, and from hints); and so
with hand-offs to new authors (from the latest hints or older ones) while deposed ones keep
writing."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pygazette.client import JournalClient
from pygazette.consumer.recoverylog import FSMError, RecorderError, RecorderFenced
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.consumer.recoverylog.conftest import (
    link_groups,
    new_log,
    play_to_head,
    take_over,
    tree,
)
from tests.consumer.recoverylog.test_playback import Files
from tests.support.broker_process import BrokerProcess

PATHS = ["a", "b", "d/c", "d/e", "f/g/h"]
PROPERTIES = ["IDENTITY", "OPTIONS"]

data = st.binary(max_size=300)
commands = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(PATHS), data),
    st.tuples(st.just("write"), st.integers(0, 9), st.integers(0, 400), data),
    st.tuples(st.just("link"), st.integers(0, 9), st.sampled_from(PATHS)),
    st.tuples(st.just("remove"), st.integers(0, 9)),
    st.tuples(st.just("rename"), st.integers(0, 9), st.sampled_from(PATHS)),
    st.tuples(st.just("prop"), st.sampled_from(PROPERTIES), st.text(max_size=20)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("hints")),
)


def live_paths(f: Files) -> list[str]:
    return sorted(p.lstrip("/") for p in f.rec.fsm.links)


def run(f: Files, cmd: tuple[object, ...]) -> None:
    kind = cmd[0]
    paths = live_paths(f)
    if kind == "create":
        f.create(str(cmd[1]), bytes(cmd[2]))  # type: ignore[call-overload]
    elif kind == "write" and paths:
        f.write(paths[int(cmd[1]) % len(paths)], int(cmd[2]), bytes(cmd[3]))  # type: ignore[call-overload]
    elif kind == "link" and paths and cmd[2] not in paths:
        f.link(paths[int(cmd[1]) % len(paths)], str(cmd[2]))  # type: ignore[call-overload]
    elif kind == "remove" and paths:
        f.remove(paths[int(cmd[1]) % len(paths)])  # type: ignore[call-overload]
    elif kind == "rename" and paths:
        f.rename(paths[int(cmd[1]) % len(paths)], str(cmd[2]))  # type: ignore[call-overload]
    elif kind == "prop":
        f.prop(str(cmd[1]), str(cmd[2]))


async def scenario(url: str, base: Path, cmds: list[tuple[object, ...]]) -> None:
    async with JournalClient(url) as client:
        log = await new_log(client)
        rec = await take_over(client, rpb.FSMHints(log=log), base / "primary")
        f = Files(rec)
        snapshots: list[tuple[rpb.FSMHints, dict[str, bytes]]] = []
        for cmd in cmds:
            if cmd[0] == "commit":
                await rec.commit()
            elif cmd[0] == "hints":
                await rec.commit()
                snapshots.append((rec.build_hints(), tree(rec.root)))
            else:
                run(f, cmd)
        await rec.commit()
        expect = tree(rec.root)

        full = await play_to_head(client, rpb.FSMHints(log=log), base / "full")
        assert tree(base / "full") == expect
        assert link_groups(base / "full") == link_groups(rec.root)
        assert full.links == rec.fsm.links and full.properties == rec.fsm.properties

        hinted = await play_to_head(client, rec.build_hints(), base / "hinted")
        assert tree(base / "hinted") == expect
        assert link_groups(base / "hinted") == link_groups(rec.root)
        assert (hinted.next_seq_no, hinted.next_checksum) == (
            rec.fsm.next_seq_no,
            rec.fsm.next_checksum,
        )

        # Older hints play forward to the same final state.
        for i, (hints, _then) in enumerate(snapshots[-2:]):
            await play_to_head(client, hints, base / f"older{i}")
            assert tree(base / f"older{i}") == expect


@settings(
    max_examples=int(os.environ.get("RECOVERYLOG_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cmds=st.lists(commands, max_size=40))
def test_recorded_ops_play_back_identically(
    rl_broker: BrokerProcess,
    tmp_path_factory: pytest.TempPathFactory,
    cmds: list[tuple[object, ...]],
) -> None:
    asyncio.run(scenario(rl_broker.url, tmp_path_factory.mktemp("example"), cmds))


# Hand-offs: a new author takes the log over from hints (the latest, or older ones, as a
# primary's stored hints lag), while the deposed one keeps recording: fenced by the broker, or
# (as Gazette's Recorder.DisableRegisterChecks allows) appending a dead branch of the log.
zombie_ops = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(PATHS), data),
    st.tuples(st.just("write"), st.integers(0, 9), st.integers(0, 400), data),
    st.tuples(st.just("rename"), st.integers(0, 9), st.sampled_from(PATHS)),
    st.tuples(st.just("remove"), st.integers(0, 9)),
)
hand_off_commands = st.one_of(
    commands,
    st.tuples(st.just("handoff"), st.integers(0, 3)),
    st.tuples(st.just("zombie"), st.lists(zombie_ops, max_size=4), st.booleans()),
)


async def hand_off_scenario(url: str, base: Path, cmds: list[tuple[object, ...]]) -> None:
    async with JournalClient(url) as client:
        log = await new_log(client)
        authors = 0
        rec = await take_over(client, rpb.FSMHints(log=log), base / "author0")
        f = Files(rec)
        zombie: Files | None = None
        stored: list[rpb.FSMHints] = [rpb.FSMHints(log=log)]  # As a primary stores them.
        for cmd in cmds:
            kind = cmd[0]
            if kind == "commit":
                await rec.commit()
            elif kind == "hints":
                await rec.commit()
                stored.append(rec.build_hints())
            elif kind == "handoff":
                await rec.commit()
                expect = tree(rec.root)
                hints = stored[-1 - int(cmd[1]) % len(stored)]  # type: ignore[call-overload]
                authors += 1
                zombie, rec = f, await take_over(client, hints, base / f"author{authors}")
                assert tree(rec.root) == expect
                f = Files(rec)
                stored.append(rec.build_hints())
            elif kind == "zombie":
                if zombie is None or zombie.rec.failed is not None:
                    continue
                for op in cmd[1]:  # type: ignore[attr-defined]
                    with contextlib.suppress(FSMError):
                        run(zombie, op)
                if cmd[2]:
                    # A dead branch: its ops don't sequence after the hand-off.
                    zombie.rec._check_registers = None
                    with contextlib.suppress(RecorderError):
                        await zombie.rec.commit()
                    zombie.rec._check_registers = zombie.rec.author.fence_selector()
                elif zombie.rec.buffered_bytes:
                    with pytest.raises(RecorderFenced):
                        await zombie.rec.commit()
            else:
                run(f, cmd)
        await rec.commit()
        expect = tree(rec.root)

        await play_to_head(client, rpb.FSMHints(log=log), base / "full")
        assert tree(base / "full") == expect
        assert link_groups(base / "full") == link_groups(rec.root)
        hinted = await play_to_head(client, rec.build_hints(), base / "hinted")
        assert tree(base / "hinted") == expect
        assert link_groups(base / "hinted") == link_groups(rec.root)
        assert (hinted.next_seq_no, hinted.next_checksum) == (
            rec.fsm.next_seq_no,
            rec.fsm.next_checksum,
        )
        for i, hints in enumerate(stored[-3:]):  # Older hints play forward to it too.
            await play_to_head(client, hints, base / f"older{i}")
            assert tree(base / f"older{i}") == expect


@settings(
    max_examples=int(os.environ.get("RECOVERYLOG_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cmds=st.lists(hand_off_commands, max_size=40))
# Found by this test: a file gone before hints were built came back on playback (6b36c0b).
@example(
    cmds=[
        ("create", "d/c", b""),
        ("create", "a", b""),
        ("rename", 1, "b"),
        ("handoff", 0),
        ("create", "d/c", b""),
        ("rename", 0, "d/e"),
        ("write", 0, 0, b""),
        ("remove", 1),
        ("remove", 1),
        ("write", 0, 0, b"committed later"),
    ]
)
def test_hand_offs_and_deposed_writers_play_back_identically(
    rl_broker: BrokerProcess,
    tmp_path_factory: pytest.TempPathFactory,
    cmds: list[tuple[object, ...]],
) -> None:
    asyncio.run(hand_off_scenario(rl_broker.url, tmp_path_factory.mktemp("example"), cmds))
