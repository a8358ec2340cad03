"""Reads of a cluster-mode replica whose spool holds commits not yet confirmed everywhere.

Such content is neither served nor described: a read gets the spool's fragment only up to
the last confirmed commit (with that commit's SHA-1, and never past the write head); a
blocking read at the frontier waits for the next confirmation, and a non-blocking one waits
briefly for it before answering OFFSET_NOT_YET_AVAILABLE.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from pygazette.broker import read_service
from pygazette.broker.fragment.persister import Persister
from pygazette.broker.read_service import serve_local_read
from pygazette.broker.replica import Replica
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_read_response
from tests.broker.rpc_helpers import journal_spec

JOURNAL = "held/journal"


def _replica(tmp_path: Path, persister: Persister) -> Replica:
    r = Replica(
        journal_spec(JOURNAL),
        1,
        spool_root=tmp_path / "spools",
        stores=persister.stores,
        persister=persister,
        sync=False,
    )
    r.recover_replicated()
    r.readable_end = r.rspool.confirmed
    r.index.first_refresh_done.set()
    return r


async def _commit(r: Replica, content: bytes) -> None:
    """Replicate `content` as one commit (not confirmed yet)."""
    rs = r.rspool
    assert rs is not None
    await rs.apply_content(content, rs.delta)
    resp = await rs.apply_proposal(rs.next_fragment(), pb.LabelSet(), primary=False)
    assert resp.status == pb.OK


def _header() -> pb.Header:
    header = pb.Header(process_id=pb.ProcessSpec.ID(zone="z", suffix="broker-0"))
    header.route.members.add(zone="z", suffix="broker-0")
    header.route.endpoints.append("http://127.0.0.1:1000")
    header.route.primary = 0
    header.etcd.cluster_id = header.etcd.member_id = header.etcd.revision = 1
    header.etcd.raft_term = 1
    return header


async def _read(r: Replica, req: pb.ReadRequest) -> list[pb.ReadResponse]:
    out = []
    async for resp in serve_local_read(req, r, _header(), r.stores):
        validate_read_response(resp)  # The fragment never ends past the write head, too.
        out.append(resp)
    return out


def _sum(content: bytes) -> pb.SHA1Sum:
    return sha1sum_from_digest(hashlib.sha1(content).digest())


async def test_reads_see_confirmed_commits_only(
    tmp_path: Path, persister: Persister, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_service, "CONFIRM_WAIT_SECONDS", 0.2)
    r = _replica(tmp_path, persister)
    await _commit(r, b"first;")
    r.confirm_through(6)
    await _commit(r, b"second;")  # Pipelined: committed here, not confirmed yet.

    resps = await _read(r, pb.ReadRequest(journal=JOURNAL, offset=0, block=False))
    meta = resps[0]
    assert (meta.fragment.begin, meta.fragment.end, meta.write_head) == (0, 6, 6)
    assert meta.fragment.sum == _sum(b"first;")
    assert b"".join(x.content for x in resps) == b"first;"
    assert resps[-1].status == pb.OFFSET_NOT_YET_AVAILABLE and resps[-1].offset == 6

    # A non-blocking read at the frontier waits briefly for the confirmation under way.
    async def confirm_soon() -> None:
        await asyncio.sleep(0.05)
        r.confirm_through(13)

    confirming = asyncio.create_task(confirm_soon())
    resps = await _read(r, pb.ReadRequest(journal=JOURNAL, offset=6, block=False))
    await confirming
    meta = resps[0]
    assert (meta.offset, meta.fragment.end, meta.write_head) == (6, 13, 13)
    assert meta.fragment.sum == _sum(b"first;second;")
    assert b"".join(x.content for x in resps) == b"second;"

    # A blocking read at the frontier waits for the next confirmation, not the commit.
    reader = asyncio.create_task(
        _read(r, pb.ReadRequest(journal=JOURNAL, offset=13, block=True, end_offset=19))
    )
    await _commit(r, b"third;")
    await asyncio.sleep(0.05)
    assert not reader.done()
    r.confirm_through(19)
    async with asyncio.timeout(5):
        resps = await reader
    meta = resps[0]
    assert (meta.fragment.end, meta.write_head) == (19, 19)
    assert meta.fragment.sum == _sum(b"first;second;third;")
    assert b"".join(x.content for x in resps) == b"third;"


async def test_persisted_content_past_the_frontier_counts_in_the_write_head(
    tmp_path: Path, persister: Persister
) -> None:
    """A member lists a fragment another broker persisted before its own frontier caught up
    (a new primary, before its first append): it serves it, under a write head that covers
    it."""
    r = _replica(tmp_path, persister)
    frag = pb.Fragment(
        journal=JOURNAL,
        begin=0,
        end=10,
        sum=_sum(b"0123456789"),
        compression_codec=pb.NONE,
        backing_store="file:///",
    )
    frag.mod_time = 1
    r.index.add_persisted(frag)
    assert r.readable_end == 0 and r.head == 10
    resps = await _read(
        r, pb.ReadRequest(journal=JOURNAL, offset=3, block=False, metadata_only=True)
    )
    assert [(x.offset, x.fragment.end, x.write_head) for x in resps] == [(3, 10, 10)]
