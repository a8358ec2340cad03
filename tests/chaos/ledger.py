"""The chaos driver's ledger writers: appends it makes, acknowledges and later audits.

One writer per ledger journal appends records of random size (each unique: journal, sequence
number, random bytes) through the broker balancer, one at a time, as fast as they commit (with
a short pause). Each acknowledged append is recorded with the SHA-1 the broker committed,
which must equal the SHA-1 of what was sent. An append that fails or stalls past its deadline
is not recorded (it may or may not have committed), and the writer tries again.

`probe` makes empty appends (write barriers) to journals others write (chunks, sums), so
that their availability is measured too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import Sequence

from pygazette.client.appender import append
from pygazette.protocol.fragment_name import sha1sum_to_hex
from tests.chaos.clients import Reconnecting
from tests.chaos.record import Ack, Record

log = logging.getLogger("chaos.ledger")

APPEND_DEADLINE = 15.0


async def write_ledger(
    address: str,
    journal: str,
    record: Record,
    stop: asyncio.Event,
    rng: random.Random,
    pause: float = 0.2,
) -> int:
    """Append to `journal` until `stop`; the number of acknowledged appends."""
    conn = Reconnecting(address)
    seq = 0
    acked = 0
    try:
        while not stop.is_set():
            seq += 1
            size = rng.randrange(64, 8192)
            head = f"{journal} {seq:08d} ".encode()
            data = head + rng.randbytes(max(0, size - len(head) - 1)).hex().encode()[:size] + b"\n"
            try:
                async with asyncio.timeout(APPEND_DEADLINE):
                    resp = await append(conn.client, journal, data)
            except Exception as exc:
                log.info("ledger append failed", extra={"journal": journal, "err": repr(exc)})
                await conn.on_error(exc)
                await asyncio.sleep(0.2)
                continue
            commit = resp.commit
            sha1 = sha1sum_to_hex(commit.sum)
            if sha1 != hashlib.sha1(data).hexdigest() or commit.end - commit.begin != len(data):
                record.anomaly(
                    "acknowledged commit does not match the content sent",
                    journal=journal,
                    begin=commit.begin,
                    end=commit.end,
                )
            record.acknowledged(Ack(journal, int(commit.begin), int(commit.end), sha1))
            acked += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)  # Or until told to stop.
    finally:
        await conn.close()
    return acked


async def probe(
    address: str, journals: Sequence[str], record: Record, stop: asyncio.Event, every: float = 1.0
) -> None:
    """Empty appends (write barriers) to `journals`, each every `every` seconds, marking them
    available when they succeed."""

    async def one(journal: str) -> None:
        conn = Reconnecting(address)
        try:
            while not stop.is_set():
                try:
                    async with asyncio.timeout(APPEND_DEADLINE):
                        resp = await append(conn.client, journal, b"")
                    record.available(journal, int(resp.commit.end))
                except Exception as exc:
                    await conn.on_error(exc)
                    await asyncio.sleep(0.2)
                    continue
                await asyncio.sleep(every)
        finally:
            await conn.close()

    await asyncio.gather(*(one(j) for j in journals))
