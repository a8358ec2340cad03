"""Resetting a journal's write head to its fragments' end, as `gazctl journals reset-head`.

Brokers refuse appends to a journal whose store holds content past what its brokers hold
(INDEX_HAS_GREATER_OFFSET): after as many broker failures as the journal has replicas, none
of them took part in its last appends, and appending at their offset could write an offset
twice. Once every fragment the failed brokers wrote is surely persisted (they have all
exited), an operator moves the journal on to the end of its fragments: an empty append at
that explicit offset, which the primary rolls to. On a consistent journal it changes nothing.
"""

from __future__ import annotations

import contextlib

from pygazette.client.appender import append
from pygazette.client.journal_client import JournalClient
from pygazette.client.reader import Reader
from pygazette.protocol.errors import OffsetNotYetAvailable, WrongAppendOffset


async def indexed_head(client: JournalClient, journal: str) -> int:
    """The end of `journal`'s fragments, as its broker indexes them (a read at -1)."""
    reader = Reader(client, journal, offset=-1, block=False, metadata_only=True)
    try:
        with contextlib.suppress(OffsetNotYetAvailable):  # Its answer at the head.
            await reader.read()
    finally:
        await reader.aclose()
    return reader.offset


async def reset_head(client: JournalClient, journal: str) -> int | None:
    """Move `journal`'s write head to the end of its fragments: the offset it appends at
    now, or None if appends moved it on meanwhile (it was consistent: nothing to reset)."""
    head = await indexed_head(client, journal)
    try:
        await append(client, journal, offset=head)
    except WrongAppendOffset:
        return None
    return head
