"""Appends to a recovery log that ride out broker restarts and primary hand-offs.

A recorder's commit, a player's write barrier and its hand-off no-op must not fail a shard
because a broker restarted or the log's primary moved: like Gazette's AppendService, they
retry — with backoff, until they succeed or the caller is cancelled — every failure except
terminal ones (a register mismatch, which is how a deposed author learns it was fenced; an
unknown journal; an invalid request). A retried append whose first attempt committed after
all appends its operations twice; the log's FSM sequences each operation once and skips the
duplicate, exactly as for Gazette's retried appends.
"""

from __future__ import annotations

import asyncio
import logging

from pygazette.client.append_service import is_terminal_append_error
from pygazette.client.appender import append
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import backoff
from pygazette.protocol.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["append_to_log"]


async def append_to_log(
    client: JournalClient,
    journal: str,
    data: bytes | bytearray | memoryview,
    *,
    check_registers: pb.LabelSelector | None = None,
    union_registers: pb.LabelSet | None = None,
) -> pb.AppendResponse:
    attempt = 0
    while True:
        try:
            return await append(
                client,
                journal,
                [bytes(data)] if not isinstance(data, bytes) else [data],
                check_registers=check_registers,
                union_registers=union_registers,
            )
        except Exception as exc:
            if is_terminal_append_error(exc):
                raise
            if attempt == 0 or attempt % 10 == 0:
                log.warning(
                    "recovery log append failed (will retry)",
                    extra={"journal": journal, "error": str(exc), "attempt": attempt},
                )
            await asyncio.sleep(backoff(attempt))
            attempt += 1
