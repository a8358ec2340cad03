"""Fixtures of the recovery-log tests: one real broker process per test module (every test
works in recovery logs of its own), and helpers to create logs and compare directories."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pygazette.client import JournalClient, apply_journals, read_journal
from pygazette.consumer.recoverylog import FSM, Author, Player, Recorder
from pygazette.message.fixed_framing import FIXED_FRAME_HEADER, FIXED_FRAME_HEADER_LENGTH
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.support.broker_process import BrokerProcess

RECOVERY_LOG_CONTENT_TYPE = "application/x-gazette-recoverylog"


@pytest.fixture(scope="module")
def rl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("recoverylog-broker") / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def client(rl_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(rl_broker.url) as c:
        yield c


def log_spec(name: str) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name,
        replication=1,
        labels=label_set({"content-type": RECOVERY_LOG_CONTENT_TYPE, "suite": "recoverylog"}),
    )
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec


async def new_log(client: JournalClient) -> str:
    name = f"tests/recoverylog/{uuid.uuid4().hex[:12]}"
    await apply_journals(
        client, [pb.ApplyRequest.Change(upsert=log_spec(name), expect_mod_revision=0)]
    )
    return name


async def take_over(
    client: JournalClient, hints: rpb.FSMHints, directory: Path, author: int | None = None
) -> Recorder:
    """Play `hints` into `directory`, hand the log off to `author`, and record from there."""
    author = author if author is not None else Author.random()
    player = Player(client, hints, directory)
    player.inject_handoff(author)
    fsm = await player.play()
    return Recorder(client, fsm, author, directory)


async def play_to_head(client: JournalClient, hints: rpb.FSMHints, directory: Path) -> FSM:
    player = Player(client, hints, directory)
    player.finish_at_write_head()
    return await player.play()


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (relative path → content)."""
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(dirpath) / name
            out[path.relative_to(directory).as_posix()] = path.read_bytes()
    return out


def link_groups(directory: Path) -> set[frozenset[str]]:
    """Paths grouped by the file (inode) they name."""
    by_inode: dict[int, set[str]] = {}
    for rel in tree(directory):
        by_inode.setdefault((directory / rel).stat().st_ino, set()).add(rel)
    return {frozenset(paths) for paths in by_inode.values()}


async def read_ops(
    client: JournalClient, journal: str, offset: int = 0
) -> list[tuple[int, rpb.RecordedOp]]:
    """Every RecordedOp of the log from `offset`, with its offset (skipping Write data)."""
    data = b"".join([chunk async for chunk in read_journal(client, journal, offset=offset)])
    out: list[tuple[int, rpb.RecordedOp]] = []
    pos = 0
    while pos < len(data):
        word, size = FIXED_FRAME_HEADER.unpack_from(data, pos)
        assert word == b"\x66\x33\x93\x36", f"not a frame at {pos}"
        start = pos + FIXED_FRAME_HEADER_LENGTH
        op = rpb.RecordedOp.FromString(data[start : start + size])
        out.append((offset + pos, op))
        pos = start + size + (op.write.length if op.HasField("write") else 0)
    return out
