"""The final read-back: every acknowledged append is in its journal, byte for byte.

Each journal with acknowledged appends is read from offset 0 through its largest
acknowledged end (through the broker balancer: from spools or, proxied, from the fragment
store), and every acknowledged `[begin, end)` must hash to the SHA-1 its append committed.
An append whose bytes are missing (a gap, or the journal ends short) or differ is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pygazette.protocol.pb import protocol_pb2 as pb
from tests.chaos.clients import Reconnecting
from tests.chaos.record import Ack

log = logging.getLogger("chaos.audit")


@dataclass
class AuditResult:
    journals: int = 0
    appends: int = 0
    bytes_read: int = 0
    lost: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)


async def read_through(
    conn: Reconnecting, journal: str, end: int, within: float = 300.0
) -> tuple[bytearray, list[tuple[int, int]]]:
    """Bytes of `journal` in [0, end), and the ranges the brokers skipped (gaps)."""
    out = bytearray()
    gaps: list[tuple[int, int]] = []
    try:
        async with asyncio.timeout(within):
            await _read_into(conn, journal, end, out, gaps)
    except TimeoutError:
        log.error("read-back timed out", extra={"journal": journal, "at": len(out)})
        gaps.append((len(out), end))
    return out[:end], gaps


async def _read_into(
    conn: Reconnecting, journal: str, end: int, out: bytearray, gaps: list[tuple[int, int]]
) -> None:
    attempt = 0
    while len(out) < end:
        offset = len(out)
        try:
            async for resp in conn.client.rpc_read(
                pb.ReadRequest(journal=journal, offset=offset, block=False, end_offset=end),
                timeout=30,
            ):
                if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                    raise RuntimeError(f"read {journal}@{offset}: {pb.Status.Name(resp.status)}")
                if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                    break
                if resp.content:
                    if resp.offset > len(out):
                        gaps.append((len(out), int(resp.offset)))
                        out += bytes(resp.offset - len(out))
                    elif resp.offset < len(out):
                        raise RuntimeError(
                            f"read {journal}: content at {resp.offset}, expected {len(out)}"
                        )
                    out += resp.content
            if len(out) < end and len(out) == offset:
                raise RuntimeError(f"read {journal}@{offset}: no progress (end {end})")
            attempt = 0
        except Exception as exc:
            attempt += 1
            log.info("read-back retry", extra={"journal": journal, "err": repr(exc)})
            await conn.on_error(exc)
            await asyncio.sleep(min(2.0, 0.1 * attempt))


async def audit(address: str, acks: Iterable[Ack]) -> AuditResult:
    by_journal: dict[str, list[Ack]] = defaultdict(list)
    for ack in acks:
        by_journal[ack.journal].append(ack)
    result = AuditResult(journals=len(by_journal))
    conn = Reconnecting(address)
    try:
        for journal, items in sorted(by_journal.items()):
            end = max(a.end for a in items)
            data, gaps = await read_through(conn, journal, end)
            result.bytes_read += len(data)
            for ack in items:
                result.appends += 1
                piece = bytes(data[ack.begin : ack.end])
                in_gap = any(g0 < ack.end and ack.begin < g1 for g0, g1 in gaps)
                if (
                    in_gap
                    or len(piece) != ack.end - ack.begin
                    or hashlib.sha1(piece).hexdigest() != ack.sha1
                ):
                    result.lost += 1
                    if len(result.problems) < 20:
                        result.problems.append(
                            {"lost": journal, "begin": ack.begin, "end": ack.end, "gap": in_gap}
                        )
    finally:
        await conn.close()
    return result
