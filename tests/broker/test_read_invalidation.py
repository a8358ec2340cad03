"""A blocking read waiting at a journal's head ends when the journal's assignments change.

A broker serving a blocking read from its replica would otherwise wait on that replica
forever once the journal moved away (the allocator rebalanced it, or handed the primary to
another broker): no content would ever reach it again, and the reader would hang. Ending
the stream lets the client resolve the journal again and go on from its offset (the
`RetryReader` restarts a stream that ends). Found by the chaos suite: a chunker waited out
its deadline for a sum its verifier's read never saw.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pygazette.allocator.state import Assignment
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.read_service import serve_local_read
from pygazette.broker.replica import Replica
from pygazette.keyspace.keyspace import KeyValue
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.test_replicated_spool import _replica as clustered_replica

JOURNAL = "a/journal"


@pytest.fixture
def replica(tmp_path: Path, persister: Persister) -> Replica:
    return clustered_replica(tmp_path, persister)


async def _commit(r: Replica, data: bytes) -> None:
    rs = r.rspool
    assert rs is not None
    await rs.apply_content(data, rs.delta)
    proposal = rs.next_fragment()
    await rs.apply_proposal(proposal, pb.LabelSet(), primary=True)
    r.confirm_through(proposal.end)


async def test_blocking_read_at_the_head_ends_when_assignments_change(replica: Replica) -> None:
    invalidated = replica.invalidated
    req = pb.ReadRequest(journal=JOURNAL, offset=0, block=True)
    stream = serve_local_read(req, replica, pb.Header(), replica.stores, invalidated=invalidated)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)  # It reaches the head and waits there.
    assert not waiting.done()

    # Any change of the journal's assignments (here: this broker's own, now at slot 1).
    kv = KeyValue("/brokers/assign/a/journal#zone#broker#1", b"", 7, 7)
    replica.set_assignments(False, [Assignment("a/journal", "zone", "broker", 1, kv)])
    assert invalidated.is_set()
    with pytest.raises(StopAsyncIteration):
        async with asyncio.timeout(5):
            await waiting


async def test_blocking_read_goes_on_while_assignments_hold(replica: Replica) -> None:
    req = pb.ReadRequest(journal=JOURNAL, offset=0, block=True)
    stream = serve_local_read(
        req, replica, pb.Header(), replica.stores, invalidated=replica.invalidated
    )
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    await _commit(replica, b"hello")
    async with asyncio.timeout(5):
        first = await waiting
    assert first.status == pb.OK and first.offset == 0
    assert not replica.invalidated.is_set()
    await stream.aclose()
