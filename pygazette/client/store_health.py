"""The FragmentStoreHealth RPC: ask a broker whether a fragment store is healthy (its response
checked with Gazette's rules, `response_check`)."""

from __future__ import annotations

from pygazette.client.journal_client import JournalClient
from pygazette.client.response_check import check_response
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_fragment_store_health_response

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
    check_response("FragmentStoreHealth", store, validate_fragment_store_health_response, resp)
    return resp
