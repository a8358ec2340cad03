"""Pruning expired fragments on demand: the `pygazette.Retention/Prune` RPC of pygazette brokers.

Gazette brokers do not serve it (gazctl prunes from the client); calling it against one fails
with UNIMPLEMENTED.
"""

from __future__ import annotations

from pygazette.client.journal_client import JournalClient
from pygazette.protocol.errors import error_for_status
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import retention_pb2 as rpb

PRUNE_METHOD = "/pygazette.Retention/Prune"


async def prune_journal(
    client: JournalClient, journal: str, *, dry_run: bool = False
) -> rpb.PruneResponse:
    """Remove `journal`'s fragments older than its retention (with `dry_run`, list them)."""
    call = client.channel.unary_unary(
        PRUNE_METHOD,
        request_serializer=rpb.PruneRequest.SerializeToString,
        response_deserializer=rpb.PruneResponse.FromString,
    )
    resp: rpb.PruneResponse = await call(rpb.PruneRequest(journal=journal, dry_run=dry_run))
    if resp.status != pb.OK:
        raise error_for_status(
            resp.status, journal, resp.header if resp.HasField("header") else None
        )
    return resp
