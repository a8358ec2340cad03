"""Suspending an idle journal, as `gazctl journals suspend` does.

A journal is suspended by an empty append that asks for it (`AppendRequest.suspend`):
SUSPEND_IF_FLUSHED suspends it only if it is idle (its content all persisted, the newest
fragment longer ago than the journal's flush interval, or a day), SUSPEND_NOW regardless.
Its primary then records the suspension in the journal's spec: PARTIAL, served by one broker
instead of `replication` (its open spool is rolled and persisted), or FULL, served by none,
once no fragment holds any of its content. The next ordinary append resumes it, at the offset
it was suspended at.
"""

from __future__ import annotations

import asyncio

from pygazette.client.appender import Appender
from pygazette.client.journal_client import JournalClient, is_unavailable
from pygazette.client.retry_reader import backoff
from pygazette.protocol.errors import (
    NoJournalPrimaryBroker,
    NotJournalPrimaryBroker,
    Suspended,
)
from pygazette.protocol.pb import protocol_pb2 as pb

# Attempts at a suspension while brokers are unreachable or a primary is being chosen.
MAX_ATTEMPTS = 8


async def suspend_journal(client: JournalClient, journal: str, *, force: bool = False) -> bool:
    """Ask `journal`'s primary to suspend it (`force`: even if it is not idle); whether it is
    suspended now. False means it is in use (written recently, or content not persisted yet)
    and was left as it is. A suspension asks for nothing but itself, so it is retried while
    no broker answers or the journal has no primary."""
    request = pb.AppendRequest(
        journal=journal,
        suspend=pb.AppendRequest.SUSPEND_NOW if force else pb.AppendRequest.SUSPEND_IF_FLUSHED,
    )
    attempt = 0
    while True:
        appender = Appender(client, request)
        try:
            await appender.start()
            await appender.commit()
            return False
        except Suspended:
            return True
        except (NoJournalPrimaryBroker, NotJournalPrimaryBroker) as exc:
            failure: BaseException = exc
        except Exception as exc:
            await appender.abort()
            if not is_unavailable(exc):
                raise
            failure = exc
        attempt += 1
        if attempt >= MAX_ATTEMPTS:
            raise failure
        await asyncio.sleep(backoff(attempt - 1))
