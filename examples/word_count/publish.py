"""Publish texts to word-count: each text's N-grams as NGramCount deltas, committed.

    python -m examples.word_count.publish --broker URL (--text TEXT | --file PATH) [--n 1]
        [--offsets FILE]

It returns once every delta is committed, and prints the journal offsets it wrote through
(`{"journals": {partition: end offset}}`). With `--offsets FILE` it also merges them into
FILE (keeping the larger offset of each journal): `query.py --offsets FILE` then reads
your writes — it asks each shard to read through them before answering.

Each text's deltas to one partition go in one append, so a text is counted in each
partition all at once or not at all (Gazette's Publish writes one message per N-gram;
like it, a text spanning partitions may be partly counted if the publisher dies midway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.word_count.wordcount import DELTAS_SELECTOR, FRAMING, deltas_mapping, ngram_counts
from pygazette.client.append_service import AppendService
from pygazette.client.journal_client import JournalClient, broker_address_from_env
from pygazette.client.watched_list import WatchedList
from pygazette.message.framing import CONTENT_TYPE_JSON_LINES
from pygazette.message.publisher import Publisher

__all__ = ["merge_offsets", "publish_text"]


async def publish_text(client: JournalClient, text: str, n: int = 1) -> dict[str, Any]:
    """Publish `text`'s N-gram deltas committed; the offsets written through."""
    msgs = ngram_counts(text, n)
    async with WatchedList(client, DELTAS_SELECTOR) as parts:
        if not parts.snapshot().journals:
            raise RuntimeError(f"no journal matches {DELTAS_SELECTOR} (apply journalspace.yaml)")
        async with AppendService(client) as service:
            publisher = Publisher(service, framings={CONTENT_TYPE_JSON_LINES: FRAMING})
            appends = publisher.publish_committed_many(deltas_mapping(parts), msgs)
            for aa in appends:
                await aa
    offsets = {aa.journal: int(aa.response.commit.end) for aa in appends if aa.response is not None}
    return {
        "ngrams": sum(m["Count"] for m in msgs),
        "messages": len(msgs),
        "journals": offsets,
    }


def merge_offsets(path: Path, offsets: dict[str, int]) -> dict[str, int]:
    """Merge `offsets` into the JSON file at `path` (the larger offset of each journal)."""
    merged: dict[str, int] = {}
    if path.exists():
        merged = {str(k): int(v) for k, v in json.loads(path.read_text() or "{}").items()}
    for journal, offset in offsets.items():
        merged[journal] = max(offset, merged.get(journal, 0))
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return merged


async def _main(args: argparse.Namespace, text: str) -> dict[str, Any]:
    async with JournalClient(args.broker) as client:
        return await publish_text(client, text, args.n)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.word_count.publish", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--broker", default=broker_address_from_env())
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to publish")
    src.add_argument("--file", help="a file of text to publish ('-': stdin)")
    parser.add_argument("--n", type=int, default=1, help="tokens per N-gram (default 1)")
    parser.add_argument("--offsets", type=Path, help="merge the written offsets into this file")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be >= 1")
    if args.text is not None:
        text = args.text
    elif args.file == "-":
        text = sys.stdin.read()
    else:
        text = Path(args.file).read_text()
    try:
        result = asyncio.run(_main(args, text))
    except Exception as exc:
        print(f"publish: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.offsets is not None:
        merge_offsets(args.offsets, result["journals"])
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
