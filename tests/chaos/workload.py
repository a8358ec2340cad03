"""The workload: stream-sum chunkers, run in rounds until the chaos ends.

Each of the chunkers is a real `python -m examples.stream_sum.chunker` process reaching the
brokers and summers through their balancers. A round generates, publishes and verifies its
streams (every sum present, right, and once, after the summers settled) and logs every
acknowledged chunk append (`--ack-log`), which the final read-back audits. Rounds repeat,
with new seeds, until `stop` is set; the current round always finishes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.record import Ack

log = logging.getLogger("chaos.workload")
REPO = Path(__file__).resolve().parents[2]


@dataclass(slots=True)
class RoundParams:
    streams: int = 24
    chunks: int = 30
    workers: int = 4
    timeout: float = 180.0  # Seconds a sum may take: longer than any fault lasts.


@dataclass
class ChunkerTotals:
    rounds: int = 0
    failed_rounds: int = 0
    streams: int = 0
    verified: int = 0
    duplicates: int = 0
    mismatches: int = 0
    missing: int = 0
    chunks: int = 0
    late: int = 0  # Sums that missed the chunker's deadline but were there at its audit.
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, summary: dict[str, Any]) -> None:
        self.rounds += 1
        for key in ("streams", "verified", "duplicates", "mismatches", "missing", "chunks"):
            setattr(self, key, getattr(self, key) + int(summary.get(key, 0)))
        self.late += len(summary.get("late_sums", []))
        if not summary.get("ok"):
            self.failed_rounds += 1
            if len(self.failures) < 10:
                self.failures.append(summary)


async def run_chunker_rounds(
    name: str,
    broker: str,
    consumer: str,
    seed: int,
    work: Path,
    params: RoundParams,
    totals: ChunkerTotals,
    stop: asyncio.Event,
) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    n = 0
    while not stop.is_set():
        n += 1
        ack_log = work / f"{name}-acks.jsonl"
        stderr = open(work / f"{name}.log", "ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "examples.stream_sum.chunker",
                "--broker",
                broker,
                "--consumer",
                consumer,
                "--streams",
                str(params.streams),
                "--chunks",
                str(params.chunks),
                "--workers",
                str(params.workers),
                "--timeout",
                str(params.timeout),
                "--seed",
                str(seed * 1000 + n),
                "--ack-log",
                str(ack_log),
                "--log-level",
                "warning",
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=str(REPO),
            )
            try:
                out, _ = await proc.communicate()
            except BaseException:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                raise
        finally:
            stderr.close()
        try:
            summary: dict[str, Any] = json.loads(out)
        except ValueError:
            summary = {"ok": False, "exit": proc.returncode, "stdout": out.decode()[-2000:]}
        summary["chunker"] = f"{name}#{n}"
        totals.add(summary)
        log.warning(
            "chunker round",
            extra={
                "chunker": name,
                "round": n,
                "ok": summary.get("ok"),
                "verified": summary.get("verified"),
                "elapsed": summary.get("elapsed"),
            },
        )


def read_ack_logs(work: Path, names: list[str]) -> Iterator[Ack]:
    for name in names:
        path = work / f"{name}-acks.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if line.strip():
                doc = json.loads(line)
                yield Ack(doc["journal"], int(doc["begin"]), int(doc["end"]), doc["sha1"])
