"""The FragmentStoreHealth RPC: ask a broker whether a fragment store is healthy."""

from __future__ import annotations

from pygazette.client.journal_client import JournalClient
from pygazette.protocol.pb import protocol_pb2 as pb

HEALTH_METHOD = "/protocol.Journal/FragmentStoreHealth"


async def fragment_store_health(
    client: JournalClient, store: str
) -> pb.FragmentStoreHealthResponse:
    """The broker's view of `store`: status OK, or FRAGMENT_STORE_UNHEALTHY with the error."""
    call = client.channel.unary_unary(
        HEALTH_METHOD,
        request_serializer=pb.FragmentStoreHealthRequest.SerializeToString,
        response_deserializer=pb.FragmentStoreHealthResponse.FromString,
    )
    resp: pb.FragmentStoreHealthResponse = await call(
        pb.FragmentStoreHealthRequest(fragment_store=store)
    )
    return resp
