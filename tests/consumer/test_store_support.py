"""Helpers shared by the store tests (no tests here): a Shard handle, checkpoints, and
recovery logs on a real broker — a Recorder taking over a log through a Player's hand-off,
and a Player replaying a log into a fresh directory."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pygazette.client import JournalClient, apply_journals
from pygazette.consumer.recoverylog import Author, Player, Recorder
from pygazette.keyspace.keyspace import KeyValue
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb

RECOVERY_LOG_CONTENT_TYPE = "application/x-gazette-recoverylog"


@dataclass
class FakeShard:
    """A Shard handle without a consumer process around it."""

    shard_id: str = "tests/stores/shard-000"
    root: str = "/tests/consumer"
    spec: cpb.ShardSpec = field(default_factory=cpb.ShardSpec)
    client: Any = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    recovery_log: str = ""
    local_dir: str = ""

    @property
    def id(self) -> str:
        return self.shard_id

    @property
    def assignment(self) -> KeyValue:
        key = f"{self.root}/assign/{self.shard_id}#zone#member-1#0"
        return KeyValue(key, b"", 1, 1)

    def progress(self) -> tuple[dict[str, int], dict[str, int]]:
        return {}, {}


def checkpoint(n: int, *, ack: bytes = b"") -> cpb.Checkpoint:
    """A checkpoint that reads source journals through offsets derived from `n`."""
    cp = cpb.Checkpoint()
    cp.sources["a/source"].read_through = n
    cp.sources["b/source"].read_through = 2 * n
    producer = cp.sources["a/source"].producers.add()
    producer.id = bytes([1, 2, 3, 4, 5, n % 256])
    producer.state.last_ack = n
    producer.state.begin = -1
    if ack:
        cp.ack_intents["c/output"] = ack
    return cp


def read_through(cp: cpb.Checkpoint) -> int:
    return cp.sources["a/source"].read_through if "a/source" in cp.sources else 0


def failed_future(exc: BaseException) -> asyncio.Future[None]:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    fut.set_exception(exc)
    return fut


# Recovery logs on a real broker. ----------------------------------------------------------


def log_spec(name: str, fragment_length: int = 1 << 20) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name,
        replication=1,
        labels=label_set({"content-type": RECOVERY_LOG_CONTENT_TYPE}),
    )
    spec.fragment.length = fragment_length
    spec.fragment.compression_codec = pb.NONE  # type: ignore[assignment]
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec


async def create_log(client: JournalClient, name: str, fragment_length: int = 1 << 20) -> None:
    spec = log_spec(name, fragment_length)
    await apply_journals(client, [pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0)])


async def take_over(
    client: JournalClient, log: str, directory: Path, hints: rpb.FSMHints | None = None
) -> Recorder:
    """As a new primary does: play `log` into `directory` and hand it off to a new author;
    returns the new author's Recorder (every earlier recorder of the log is fenced)."""
    author = Author.random()
    player = Player(client, hints or rpb.FSMHints(log=log), directory)
    player.inject_handoff(author)
    fsm = await player.play()
    return Recorder(client, fsm, author, directory)


async def replay(client: JournalClient, log: str, directory: Path) -> None:
    """Play all of `log` into a fresh `directory`, as a new replica would."""
    player = Player(client, rpb.FSMHints(log=log), directory)
    player.finish_at_write_head()
    await player.play()


def files_of(directory: Path) -> dict[str, bytes]:
    """Regular files under `directory` (relative path -> content), without player staging."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and ".fnodes" not in p.relative_to(directory).parts
    }
