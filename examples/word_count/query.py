"""Query word-count with read-your-writes: the count of an N-gram (or of every N-gram with
a prefix), as of at least everything published before.

    python -m examples.word_count.query WORD --broker URL --consumer URL
        [--offsets FILE] [--prefix]

1. The N-gram's partition: the deltas journal it maps to (as the publisher maps it), and
   the shard reading that journal (Shard service List).
2. Read-your-writes: the shard's Stat with `read_through` = the offsets your publishes
   wrote through (`--offsets`, written by publish.py), or else the partition's write head
   right now (an empty append, Gazette's write barrier). Stat answers once the shard's
   primary has *committed* a transaction that read through them: its store, and so its
   recovery log, holds every one of those deltas.
3. The count, from the shard's store: a private copy recovered from the shard's recovery
   log, exactly as a hot standby builds one — the shard's FSM hints (GetHints), a Player
   playing the log into a temporary directory up to the log's write head, then a
   read-only SQL query of the played SQLite file.

Prints `{"ngram", "count", "shard", "journal", "read_through", "recovered": {...}}`
(`count` 0 if the N-gram was never counted; with `--prefix`, `"grams"` lists every
N-gram of the prefix).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import apsw

from examples.word_count.counter import read_count
from examples.word_count.wordcount import DELTAS_SELECTOR, deltas_mapping
from pygazette.client.appender import append
from pygazette.client.journal_client import JournalClient, broker_address_from_env
from pygazette.client.list_apply import list_all
from pygazette.consumer.recoverylog import Player
from pygazette.consumer.shard_client import ShardClient
from pygazette.consumer.sqlite_store import DEFAULT_FILENAME
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.shard_validation import recovery_log

__all__ = ["query"]


def _hints(resp: Any, log_name: str) -> rpb.FSMHints:
    """The primary hints, else the most recent backup, else empty hints of the log."""
    if resp.primary_hints.HasField("hints"):
        return resp.primary_hints.hints  # type: ignore[no-any-return]
    for backup in resp.backup_hints:
        if backup.HasField("hints"):
            return backup.hints  # type: ignore[no-any-return]
    return rpb.FSMHints(log=log_name)


async def query(
    client: JournalClient,
    shards: ShardClient,
    ngram: str,
    *,
    offsets: Mapping[str, int] | None = None,
    prefix: bool = False,
    within: float = 60.0,
) -> dict[str, Any]:
    """The count of `ngram` (see the module docstring)."""
    journal, _ = deltas_mapping(await list_all(client, DELTAS_SELECTOR))(ngram)
    readers = [
        s.spec
        for s in await shards.list_shards()
        if any(src.journal == journal for src in s.spec.sources)
    ]
    if not readers:
        raise LookupError(f"no shard reads {journal}")
    spec = readers[0]
    log_name = recovery_log(spec)
    if not log_name:
        raise LookupError(f"shard {spec.id} has no recovery log to recover its store from")

    offset = (offsets or {}).get(journal)
    if offset is None:
        offset = int((await append(client, journal, b"")).commit.end)
    stat = await shards.stat(spec.id, {journal: offset}, within=within)

    began = time.monotonic()
    hints = _hints(await shards.get_hints(spec.id, within=within), log_name)
    directory = Path(tempfile.mkdtemp(prefix="word-count-query-"))
    try:
        player = Player(client, hints, directory / "store")
        player.finish_at_write_head()
        fsm = await asyncio.wait_for(player.play(), within)
        conn = apsw.Connection(
            str(directory / "store" / DEFAULT_FILENAME), flags=apsw.SQLITE_OPEN_READONLY
        )
        try:
            rows = read_count(conn, ngram, prefix=prefix)
        finally:
            conn.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out: dict[str, Any] = {
        "ngram": ngram,
        "count": sum(c for g, c in rows if g == ngram),
        "shard": spec.id,
        "journal": journal,
        "read_through": {journal: offset},
        "stat_read_through": dict(stat.read_through),
        "recovered": {
            "log": log_name,
            "log_offset": int(getattr(fsm, "read_through", 0) or 0),
            "seconds": round(time.monotonic() - began, 3),
        },
    }
    if prefix:
        out["grams"] = dict(rows)
    return out


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    offsets: dict[str, int] | None = None
    if args.offsets is not None and args.offsets.exists():
        offsets = {str(k): int(v) for k, v in json.loads(args.offsets.read_text()).items()}
    ngram = " ".join(args.ngram.lower().split())
    async with JournalClient(args.broker) as client, ShardClient(args.consumer) as shards:
        return await query(
            client, shards, ngram, offsets=offsets, prefix=args.prefix, within=args.timeout
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.word_count.query", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("ngram", metavar="WORD", help="the N-gram (words separated by spaces)")
    parser.add_argument("--broker", default=broker_address_from_env())
    parser.add_argument(
        "--consumer", default="http://localhost:8080", help="counter's Shard service"
    )
    parser.add_argument("--offsets", type=Path, help="offsets file written by publish.py")
    parser.add_argument("--prefix", action="store_true", help="every N-gram with this prefix")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    try:
        result = asyncio.run(_main(args))
    except Exception as exc:
        print(f"query: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
