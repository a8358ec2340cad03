"""Benchmark: unpacking JSON-lines messages from a journal's content as a reader receives it,
beside the least any reader must do with the same bytes, measured in the same run.

    python bench/unpack.py [--rounds R] [--chunk BYTES]

For records of 200 B, 64 KiB and 1 MiB, the content is cut into read-sized chunks (1 MiB by
default, as brokers send it) and fed to an `Unpacker` (JSON framing: each message decoded,
its UUID parsed, its offsets kept), against the floor: `orjson.loads` of every line of the
whole content in place (a memoryview of it, its delimiters found with `bytes.find`: no
copy), the decoded messages kept as the unpacker keeps them. A message longer than a chunk
crosses chunks, so this is where a reader's copies of long messages show. Best of R rounds;
one JSON document.

(The floor was `bytes.split` of the whole content and `orjson.loads` of each line: that
copies all of the content into new memory first, which the unpacker never does and which,
on a VM whose fresh pages cost a host fault, took most of its time. The unpacker read as
2.4x that "floor" for 1 MiB records. Every message the unpacker returns is now checked, not
only the first, so a decoding error cannot pass for a message.)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pygazette.message.json_framing import JSONFraming
from pygazette.message.unpacker import Unpacker

# Record size and count: ~100 MiB of content each.
SIZES = {"200B": (150, 400_000), "64KiB": (64 << 10, 1_600), "1MiB": (1 << 20, 100)}


def _content(data_bytes: int, count: int) -> bytes:
    text = str(uuid.uuid1())
    return b"".join(
        orjson.dumps({"uuid": text, "n": i, "data": "x" * data_bytes}) + b"\n"
        for i in range(count)
    )


def _unpack(chunks: list[bytes], count: int) -> float:
    unpacker = Unpacker(JSONFraming(), "bench/unpack")
    out: list[Any] = []
    started = time.perf_counter()
    for chunk in chunks:
        unpacker.feed(chunk, out)
    seconds = time.perf_counter() - started
    failed = next((e for e in out if isinstance(e, BaseException)), None)
    if len(out) != count or failed is not None:
        raise RuntimeError(f"unpacked {len(out)} of {count} messages: {failed!r}")
    return seconds


def _floor(content: bytes, count: int) -> float:
    """Seconds to decode every line of `content` in place, keeping the messages."""
    loads, find, view = orjson.loads, content.find, memoryview(content)
    decoded = []
    append = decoded.append
    start = 0
    started = time.perf_counter()
    end = find(b"\n")
    while end >= 0:
        append(loads(view[start:end]))
        start = end + 1
        end = find(b"\n", start)
    seconds = time.perf_counter() - started
    if len(decoded) != count:
        raise RuntimeError(f"decoded {len(decoded)} of {count} lines")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=1 << 20, help="bytes per read chunk")
    args = parser.parse_args()
    if args.rounds < 1 or args.chunk < 1:
        parser.error("--rounds and --chunk must be positive")
    figures: dict[str, Any] = {}
    for name, (data_bytes, count) in SIZES.items():
        content = _content(data_bytes, count)
        chunks = [content[i : i + args.chunk] for i in range(0, len(content), args.chunk)]
        mb = len(content) / 1e6
        unpack = [mb / _unpack(chunks, count) for _ in range(args.rounds)]
        floor = [mb / _floor(content, count) for _ in range(args.rounds)]
        figures[name] = {
            "messages": count,
            "mb": round(mb, 1),
            "unpacker_mb_per_s": round(max(unpack), 1),
            "floor_mb_per_s": round(max(floor), 1),
            "ratio": round(max(unpack) / max(floor), 3),
            "rounds": {
                "unpacker": [round(x, 1) for x in unpack],
                "floor": [round(x, 1) for x in floor],
            },
        }
    print(
        json.dumps(
            {
                "benchmark": "unpack",
                "machine": {"python": platform.python_version()},
                "chunk_bytes": args.chunk,
                "baseline": "orjson.loads of each line of the whole content in place (memoryview "
                "slices, no copy), messages kept",
                "figures": figures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
