"""pygazette's side of the recovery-log interop test (recoverylog_test.go drives it).

    python driver.py <broker-url>

Reads one JSON command per line on stdin and answers each with one JSON line on stdout:
`{"ok": true, ...}`, `{"ok": false, "fenced": true, "error": ...}` when a commit finds the
log handed off to another author, or `{"ok": false, "error": ...}` for anything else.
Hints travel as Gazette's FSMHints JSON (what Go's json.Marshal writes); file data as base64
(what Go's json.Marshal writes for []byte).

Commands (`rec` names a recorder of this process, so several can be alive at once):

- `take_over` {rec, hints, dir, author}: play `hints` into `dir` with pygazette's Player,
  hand the log off to `author`, and record from there with pygazette's Recorder.
- `create` {rec, path, data?}, `write` {rec, path, offset, data}, `link` {rec, src, dst},
  `remove` {rec, path}, `rename` {rec, src, dst}, `property` {rec, path, content}: do the
  file operation in the recorder's directory, and record it.
- `commit` {rec}: append what the recorder recorded since its last commit.
- `hints` {rec}: the recorder's hints, `{"hints": ...}`.
- `play` {hints, dir}: play `hints` into `dir` up to the log's write head with pygazette's
  Player; answers the resolved hints, `{"hints": ...}`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import traceback
from typing import Any

from pygazette.client import JournalClient
from pygazette.consumer.hints import decode_hints, encode_hints
from pygazette.consumer.recoverylog import Author, Player, Recorder, RecorderFenced
from pygazette.protocol.pb import recoverylog_pb2 as rpb


def _hints(doc: Any) -> rpb.FSMHints:
    return decode_hints(json.dumps(doc).encode())


def _hints_doc(hints: rpb.FSMHints) -> Any:
    return json.loads(encode_hints(hints))


def _data(cmd: dict[str, Any]) -> bytes:
    return base64.b64decode(cmd.get("data") or "")


class Driver:
    def __init__(self, client: JournalClient) -> None:
        self.client = client
        self.recorders: dict[str, Recorder] = {}

    async def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["cmd"]
        if op == "play":
            hints = _hints(cmd["hints"])
            player = Player(self.client, hints, cmd["dir"])
            player.finish_at_write_head()
            fsm = await player.play()
            return {"hints": _hints_doc(fsm.build_hints(hints.log))}
        if op == "take_over":
            player = Player(self.client, _hints(cmd["hints"]), cmd["dir"])
            player.inject_handoff(Author(cmd["author"]))
            fsm = await player.play()
            self.recorders[cmd["rec"]] = Recorder(self.client, fsm, cmd["author"], cmd["dir"])
            return {}

        rec = self.recorders[cmd["rec"]]
        root = rec.root
        if op == "create":
            # As a recorded create (O_TRUNC) of an existing path: a new file replaces it.
            path = root / cmd["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            path.write_bytes(b"")
            rec.record_create(path)
            if data := _data(cmd):
                self._write(rec, cmd["path"], 0, data)
        elif op == "write":
            self._write(rec, cmd["path"], cmd.get("offset", 0), _data(cmd))
        elif op == "link":
            (root / cmd["dst"]).parent.mkdir(parents=True, exist_ok=True)
            os.link(root / cmd["src"], root / cmd["dst"])
            fnode = rec.fnode_of(cmd["src"])
            assert fnode is not None, cmd
            rec.record_link(fnode, root / cmd["dst"])
        elif op == "remove":
            (root / cmd["path"]).unlink()
            rec.record_remove(root / cmd["path"])
        elif op == "rename":
            (root / cmd["dst"]).parent.mkdir(parents=True, exist_ok=True)
            os.replace(root / cmd["src"], root / cmd["dst"])
            rec.record_rename(root / cmd["src"], root / cmd["dst"])
        elif op == "property":
            (root / cmd["path"]).write_text(cmd["content"])
            rec.record_property(root / cmd["path"], cmd["content"])
        elif op == "commit":
            return {"end": await rec.commit()}
        elif op == "hints":
            return {"hints": _hints_doc(rec.build_hints())}
        else:
            raise ValueError(f"unknown command {op!r}")
        return {}

    @staticmethod
    def _write(rec: Recorder, rel: str, offset: int, data: bytes) -> None:
        fd = os.open(rec.root / rel, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        fnode = rec.fnode_of(rel)
        assert fnode is not None, rel
        rec.record_write(fnode, offset, data)


async def main(url: str, replies: Any) -> None:
    loop = asyncio.get_running_loop()
    async with JournalClient(url) as client:
        driver = Driver(client)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if not line.strip():
                continue
            try:
                reply = {"ok": True, **await driver.handle(json.loads(line))}
            except RecorderFenced as exc:
                reply = {"ok": False, "fenced": True, "error": str(exc)}
            except Exception as exc:  # Reported to the Go test, which fails.
                traceback.print_exc()
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


if __name__ == "__main__":
    # Replies own the stdout pipe; anything else written to fd 1 (by Python or C code)
    # goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    asyncio.run(main(sys.argv[1], replies))
