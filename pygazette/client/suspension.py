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

from pygazette.client.appender import append
from pygazette.client.journal_client import JournalClient
from pygazette.protocol.errors import Suspended
from pygazette.protocol.pb import protocol_pb2 as pb


async def suspend_journal(client: JournalClient, journal: str, *, force: bool = False) -> bool:
    """Ask `journal`'s primary to suspend it (`force`: even if it is not idle); whether it is
    suspended now. False means it is in use (written recently, or content not persisted yet)
    and was left as it is. Retried as any append is (`appender.append`): while no broker
    answers before the request is complete, or the journal has no primary."""
    mode = pb.AppendRequest.SUSPEND_NOW if force else pb.AppendRequest.SUSPEND_IF_FLUSHED
    try:
        await append(client, journal, suspend=mode)
    except Suspended:
        return True
    return False
