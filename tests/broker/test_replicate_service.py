"""The replica side of Replicate: how each request moves a replica's spool and frontier.

A proposal commits or rolls back (Gazette's rules, `test_replicated_spool`) but confirms
nothing by itself: appends pipeline, so a proposal may follow one not yet acknowledged by
every peer. Only the primary's explicit confirmation (a later proposal carrying the
Header again) moves the confirmed frontier, and it leaves content in flight alone. On a
route of two, a commit carrying the Header confirms itself (the primary committed first).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pygazette.broker.fragment.persister import Persister
from pygazette.broker.replicate_service import _apply
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_replicate_response
from tests.broker.test_replicated_spool import _content, _frag, _replica
from tests.support.cluster import Cluster
from tests.support.etcd_process import EtcdProcess


def _proposal(
    frag: pb.Fragment, registers: pb.LabelSet, *, header: bool = False
) -> pb.ReplicateRequest:
    req = pb.ReplicateRequest(proposal=frag, registers=registers, acknowledge=True)
    if header:
        req.header.CopyFrom(pb.Header(process_id=pb.ProcessSpec.ID(zone="z", suffix="s")))
    return req


async def test_only_confirmations_move_the_frontier(tmp_path: Path, persister: Persister) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    regs = label_set({"k": "v"})

    await _content(rs, b"abc")
    resp = await _apply(r, _proposal(_frag(0, 3, b"abc"), regs), is_first=False)
    assert resp is not None and resp.status == pb.OK
    assert (rs.end, rs.confirmed, r.readable_end) == (3, 0, 0)  # Committed, not confirmed.

    # The next append streams in; the first one's confirmation arrives meanwhile.
    await _content(rs, b"def")
    resp = await _apply(r, _proposal(_frag(0, 3, b"abc"), regs, header=True), is_first=False)
    assert resp is not None and resp.status == pb.OK
    assert (rs.end, rs.delta, rs.confirmed, r.readable_end) == (3, 3, 3, 3)

    # Its content was kept: it commits.
    resp = await _apply(r, _proposal(_frag(0, 6, b"abcdef"), regs), is_first=False)
    assert resp is not None and resp.status == pb.OK
    assert (rs.end, rs.confirmed, r.readable_end) == (6, 3, 3)

    # A confirmation of what this replica doesn't hold is refused, and changes nothing.
    resp = await _apply(r, _proposal(_frag(0, 9, b"abcdefghi"), regs, header=True), is_first=False)
    assert resp is not None and resp.status == pb.PROPOSAL_MISMATCH
    assert (rs.end, rs.confirmed) == (6, 3)
    # An older confirmation doesn't move the frontier back.
    resp = await _apply(r, _proposal(_frag(0, 2, b"ab"), regs, header=True), is_first=False)
    assert resp is not None and resp.status == pb.OK
    assert rs.confirmed == 3

    resp = await _apply(r, _proposal(_frag(0, 6, b"abcdef"), regs, header=True), is_first=False)
    assert resp is not None and resp.status == pb.OK
    assert (rs.confirmed, r.readable_end) == (6, 6)
    rs.close()


async def test_a_commit_with_header_confirms_itself_on_a_route_of_two(
    tmp_path: Path, persister: Persister
) -> None:
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None
    regs = label_set({"k": "v"})

    # On a route of two the primary committed first: committed here, every member holds it.
    await _content(rs, b"abc")
    resp = await _apply(r, _proposal(_frag(0, 3, b"abc"), regs, header=True), False, pair=True)
    assert resp is not None and resp.status == pb.OK
    assert (rs.end, rs.delta, rs.confirmed, r.readable_end) == (3, 0, 3, 3)

    # A commit that doesn't match what was streamed is refused and confirms nothing.
    await _content(rs, b"def")
    resp = await _apply(r, _proposal(_frag(0, 6, b"abcxyz"), regs, header=True), False, pair=True)
    assert resp is not None and resp.status == pb.PROPOSAL_MISMATCH
    assert (rs.end, rs.confirmed) == (3, 3)

    # On a wider route the same request is no commit: a confirmation of what isn't held.
    resp = await _apply(r, _proposal(_frag(0, 6, b"abcdef"), regs, header=True), False)
    assert resp is not None and resp.status == pb.PROPOSAL_MISMATCH
    assert (rs.end, rs.delta, rs.confirmed) == (3, 3, 3)
    resp = await _apply(r, _proposal(_frag(0, 6, b"abcdef"), regs, header=True), False, pair=True)
    assert resp is not None and resp.status == pb.OK
    assert (rs.end, rs.confirmed, r.readable_end) == (6, 6, 6)
    rs.close()


async def test_a_new_journals_unconfirmed_first_commit_is_cut_after_a_restart(
    tmp_path: Path, persister: Persister
) -> None:
    """A replica of a new journal (no frontier recorded: nothing to confirm but offset 0)
    commits the journal's first append and is killed before the confirmation of it. Its
    primary fails the append (UNAVAILABLE: confirmed nowhere). Restarted, the replica must
    not take that commit for confirmed: a frontier-less replica used to trust its spools
    whole (as a single-node data directory's), show the append to readers, and answer the
    next pipeline with it, which rolled the journal forward past the failed append."""
    r = _replica(tmp_path, persister)
    rs = r.rspool
    assert rs is not None and rs.confirmed == 0
    regs = pb.LabelSet()
    # A pipeline opens (its synchronising round, then its confirmation), as `_start_pipeline`.
    resp = await _apply(r, _proposal(_frag(0, 0), regs, header=True), is_first=True)
    assert resp is not None and resp.status == pb.OK
    resp = await _apply(r, _proposal(_frag(0, 0), regs, header=True), is_first=False)
    assert resp is not None and resp.status == pb.OK
    # The first append commits here; no confirmation follows (the replica is killed).
    await _content(rs, b"failed append")
    resp = await _apply(r, _proposal(_frag(0, 13, b"failed append"), regs), is_first=False)
    assert resp is not None and resp.status == pb.OK
    assert (rs.end, rs.confirmed, r.readable_end) == (13, 0, 0)

    r2 = _replica(tmp_path, persister)
    rs2 = r2.rspool
    assert rs2 is not None
    assert (rs2.confirmed, r2.readable_end, r2.head) == (0, 0, 0)
    assert rs2.unconfirmed
    # The next pipeline (here, its primary proposes the empty journal) cuts it.
    resp = await _apply(r2, _proposal(_frag(0, 0), regs, header=True), is_first=True)
    assert resp is not None and resp.status == pb.OK
    assert (rs2.begin, rs2.end) == (0, 0)


@pytest.mark.slow
async def test_a_replicate_stream_of_a_journal_not_served_here_is_answered_validly(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    """A Replicate stream this broker can't serve (the journal doesn't exist here, or its
    route, as this broker sees it, leaves it out) is answered with the resolution's status,
    as Gazette's replica answers it, but without a Header: Gazette's ReplicateResponse
    carries one only with WRONG_ROUTE, and its Validate (pygazette's primaries check every
    response) refuses any other."""
    cluster = Cluster(tmp_path, etcd, etcd_root)
    broker = cluster.add("zone-a", "broker-1")
    try:
        await cluster.start()
        stub = cluster.stub(broker)
        me = pb.ProcessSpec.ID(zone=broker.zone, suffix=broker.suffix)
        listed = await stub.ListFragments(pb.FragmentsRequest(journal="no/such"), timeout=10)
        header = pb.Header(
            process_id=me,
            route=pb.Route(members=[me], primary=0, endpoints=[broker.url]),
            etcd=listed.header.etcd,
        )
        proposal = pb.Fragment(journal="no/such", begin=0, end=0, compression_codec=pb.NONE)

        async def requests() -> AsyncIterator[pb.ReplicateRequest]:
            yield pb.ReplicateRequest(
                header=header,
                proposal=proposal,
                registers=pb.LabelSet(),
                acknowledge=True,
                deprecated_journal=proposal.journal,
            )

        resps = [r async for r in stub.Replicate(requests(), timeout=10)]
        assert [r.status for r in resps] == [pb.JOURNAL_NOT_FOUND]
        validate_replicate_response(resps[0])
    finally:
        await cluster.close()
