"""A transactional producer process for fault tests (run with `python -m`).

It publishes `--txns` transactions of `--per-txn` messages, each spread over the journals
of `--selector` by key, and commits each transaction the way an exactly-once producer must:

1. publish the messages uncommitted, and wait until they are appended;
2. build the ACK intents and store them, with the next transaction number, in the
   checkpoint file (atomically);
3. append the intents; then clear them from the checkpoint.

On start it first re-appends intents left in its checkpoint by a crash (step 3 again).
`--crash-before-ack T` kills the process with SIGKILL after step 1 of transaction T;
`--crash-mid-ack T` kills it in step 3 of transaction T, after appending only the first
intent. Messages are `{"txn": t, "i": i}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

from pygazette.client import AppendService, JournalClient, WatchedList
from pygazette.message import AckIntent, Publisher, append_ack_intents, modulo_mapping


def load(path: Path) -> dict[str, object]:
    if not path.exists():
        return {"next_txn": 0, "intents": []}
    data: dict[str, object] = json.loads(path.read_text())
    return data


def store(path: Path, next_txn: int, intents: list[AckIntent]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(
            {"next_txn": next_txn, "intents": [[i.journal, i.intent.hex()] for i in intents]}, f
        )
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def run(args: argparse.Namespace) -> None:
    path = Path(args.checkpoint)
    async with JournalClient(args.broker) as client:
        partitions = WatchedList(client, args.selector)
        await partitions.start()
        service = AppendService(client)
        publisher = Publisher(service)
        mapping = modulo_mapping(lambda m: str(m["i"]), partitions)

        state = load(path)
        next_txn = int(state["next_txn"])  # type: ignore[call-overload]
        leftover = [AckIntent(j, bytes.fromhex(h)) for j, h in state["intents"]]  # type: ignore[attr-defined]
        if leftover:
            for op in append_ack_intents(service, leftover):
                await op
            store(path, next_txn, [])

        for txn in range(next_txn, args.txns):
            publisher.publish_uncommitted_many(
                mapping, [{"txn": txn, "i": i} for i in range(args.per_txn)]
            )
            await service.wait_all()
            if txn == args.crash_before_ack:
                crash()
            intents = publisher.build_ack_intents()
            store(path, txn + 1, intents)
            if txn == args.crash_mid_ack:
                await service.append(intents[0].journal, intents[0].intent)
                crash()
            for op in append_ack_intents(service, intents):
                await op
            store(path, txn + 1, [])
        await service.close()
        await partitions.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--selector", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--txns", type=int, default=4)
    parser.add_argument("--per-txn", type=int, default=50)
    parser.add_argument("--crash-before-ack", type=int, default=-1)
    parser.add_argument("--crash-mid-ack", type=int, default=-1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
