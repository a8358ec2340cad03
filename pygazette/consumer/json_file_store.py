"""`JSONFileStore`: a shard's state as one JSON document, rewritten at every commit.

Like Gazette's JSONFileStore. The state is any JSON-serializable Python object (a dict by
default) that the application reads and mutates through `store.state`:

    def new_store(self, shard, recorder):
        return JSONFileStore(recorder, {"counts": {}})

    def consume_message(self, shard, store, envelope, publisher):
        counts = store.state["counts"]
        counts[key] = counts.get(key, 0) + 1

Each commit serializes the state and the checkpoint together, at once (so the next
transaction may mutate `state` while this one commits), as one JSON document
``{"checkpoint": <Checkpoint in protobuf JSON>, "state": <state>}``, and once every
`wait_for` has resolved writes it as a new file `state.json`:

- With a recovery log `Recorder`, the commit is recorded as Gazette's JSONFileStore does
  through its recorded file system: create `next.json`, write the document into it,
  rename it onto `state.json` (unlink the old `state.json`, link the new file there,
  unlink `next.json`), and append those ops to the log as ONE recorder commit (atomic,
  fenced by the recorder's author). Only once the log holds them is the local file
  replaced, so the local directory always equals what a Player replays from the log.
  A store opened on a played directory (the recorder's `root`) starts from its state.json.
- Without a recorder (`directory=`), it is a plain local file store: write `next.json`,
  fsync, rename onto `state.json`, fsync the directory.

Either way a commit is all or nothing: a failed `wait_for`, a fenced recorder or a failed
write leave `state.json` as it was. `restore_checkpoint` returns the checkpoint of
state.json and resets `store.state` to its state (always use `store.state`; don't keep a
reference to the object across a restore). The whole state is rewritten at each commit:
this store suits small states.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format

from pygazette.consumer.memory_store import CommitPipeline, copy_checkpoint
from pygazette.consumer.recoverylog import RecorderFenced
from pygazette.consumer.store import CommitFuture, Store, StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb

if TYPE_CHECKING:
    from pygazette.consumer.recoverylog.recorder import Recorder
    from pygazette.consumer.shard_api import Shard

__all__ = ["JSONFileStore"]

STATE_FILE = "state.json"
NEXT_FILE = "next.json"


class JSONFileStore(Store):
    """A store whose state is one JSON document (see the module docstring).

    `recorder`: the shard's recovery-log Recorder; files live in `recorder.root`.
    `state`: the initial state, used when no state file exists yet (default: `{}`).
    `directory`: without a recorder, the local directory to keep state.json in.
    """

    def __init__(
        self,
        recorder: Recorder | None = None,
        state: Any = None,
        *,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if recorder is not None:
            if directory is not None and Path(directory) != Path(recorder.root):
                raise ValueError("JSONFileStore: `directory` must be the recorder's root")
            self.directory = Path(recorder.root)
        elif directory is not None:
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)
        else:
            raise ValueError("JSONFileStore needs a recorder or a directory")
        self.recorder = recorder
        self._initial_state: Any = copy.deepcopy({} if state is None else state)
        self._pipeline = CommitPipeline()
        self._destroyed = False
        self.state: Any
        self._checkpoint: cpb.Checkpoint
        self.state, self._checkpoint = self._load()

    @property
    def path(self) -> Path:
        """The state file."""
        return self.directory / STATE_FILE

    # Store ---------------------------------------------------------------------------------

    async def restore_checkpoint(self, shard: Shard) -> cpb.Checkpoint:
        self._check_usable()
        await self._pipeline.drain()
        self._pipeline.reset()
        self.state, self._checkpoint = await asyncio.to_thread(self._load)
        return copy_checkpoint(self._checkpoint)

    def start_commit(
        self, shard: Shard, checkpoint: cpb.Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> CommitFuture:
        self._check_usable()
        if self._pipeline.failure is not None:
            return self._pipeline.failed_commit()
        cp = copy_checkpoint(checkpoint)
        try:
            doc = encode_document(self.state, cp)
        except Exception as exc:  # Not JSON-serializable: this commit fails.
            error = exc

            async def fail() -> None:
                raise error

            return self._pipeline.start(wait_for, fail)

        async def apply() -> None:
            if self.recorder is not None:
                await self._record(self.recorder, doc)
                await asyncio.to_thread(self._write_local, doc, False)
            else:
                await asyncio.to_thread(self._write_local, doc, True)
            self._checkpoint = cp

        return self._pipeline.start(wait_for, apply)

    def destroy(self) -> None:
        """Stop committing. Local files are left to whoever owns the directory (a shard's
        local directory is removed by its replica)."""
        self._destroyed = True
        self._pipeline.cancel()

    # Internals -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._destroyed:
            raise RuntimeError("JSONFileStore was destroyed")

    def _load(self) -> tuple[Any, cpb.Checkpoint]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return copy.deepcopy(self._initial_state), cpb.Checkpoint()
        return decode_document(raw)

    async def _record(self, rec: Recorder, doc: bytes) -> None:
        """Record the rename of a new next.json onto state.json, as one log append."""
        # record_create replaces a next.json left by a crashed writer (as O_TRUNC would).
        fnode = rec.record_create(NEXT_FILE)
        rec.record_write(fnode, 0, doc)
        # Unlinks the old state.json, links the new file there, unlinks next.json.
        rec.record_rename(NEXT_FILE, STATE_FILE)
        try:
            await rec.commit()
        except RecorderFenced as exc:
            raise StoreFenced(f"recovery log is fenced by a newer primary: {exc}") from exc

    def _write_local(self, doc: bytes, durable: bool) -> None:
        """Atomically replace state.json with `doc` (fsync'd when `durable`)."""
        next_path = self.directory / NEXT_FILE
        fd = os.open(next_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(doc)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(next_path, self.path)
        if durable:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def encode_document(state: Any, cp: cpb.Checkpoint) -> bytes:
    """The state file's content: one JSON document of the checkpoint and the state."""
    doc = {"checkpoint": json_format.MessageToDict(cp), "state": state}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode_document(raw: bytes) -> tuple[Any, cpb.Checkpoint]:
    doc = json.loads(raw)
    if not isinstance(doc, dict) or "state" not in doc or "checkpoint" not in doc:
        raise ValueError("state file is not a JSONFileStore document")
    cp = cpb.Checkpoint()
    json_format.ParseDict(doc["checkpoint"], cp)
    return doc["state"], cp
