"""Listing a journal's fragments (all pages of the ListFragments RPC), optionally with signed
URLs from which batch tools read the fragment files directly (see `fragment_reader`). Each page
is checked with Gazette's rules (`response_check`).
"""

from __future__ import annotations

from google.protobuf import duration_pb2

from pygazette.client.journal_client import JournalClient
from pygazette.client.response_check import check_response, invalid_response
from pygazette.protocol.errors import error_for_status
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_fragments_response


def duration_proto(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    whole = int(seconds)
    d.seconds = whole
    d.nanos = round((seconds - whole) * 1e9)
    return d


async def list_all_fragments(
    client: JournalClient,
    journal: str,
    *,
    begin_mod_time: int = 0,
    end_mod_time: int = 0,
    signature_ttl: float | None = None,
    page_limit: int = 0,
) -> list[pb.FragmentsResponse._Fragment]:
    """Every fragment of `journal`, in offset order.

    `begin_mod_time` / `end_mod_time` (Unix seconds; 0 is unbounded) restrict the listing to
    fragments persisted in [begin, end). With `signature_ttl` (seconds) each fragment carries a
    signed GET URL valid that long.
    """
    resp = await list_all_fragments_response(
        client,
        journal,
        begin_mod_time=begin_mod_time,
        end_mod_time=end_mod_time,
        signature_ttl=signature_ttl,
        page_limit=page_limit,
    )
    return list(resp.fragments)


async def list_all_fragments_response(
    client: JournalClient,
    journal: str,
    *,
    begin_mod_time: int = 0,
    end_mod_time: int = 0,
    signature_ttl: float | None = None,
    page_limit: int = 0,
) -> pb.FragmentsResponse:
    """One FragmentsResponse joining every page (header of the first page)."""
    request = pb.FragmentsRequest(
        journal=journal,
        begin_mod_time=begin_mod_time,
        end_mod_time=end_mod_time,
        page_limit=page_limit,
    )
    if signature_ttl is not None and signature_ttl > 0:
        request.signatureTTL.CopyFrom(duration_proto(signature_ttl))
    joined: pb.FragmentsResponse | None = None
    while True:
        resp = await client.rpc_list_fragments(request)
        check_response("ListFragments", journal, validate_fragments_response, resp)
        if resp.status != pb.OK:
            raise error_for_status(
                resp.status, journal, resp.header if resp.HasField("header") else None
            )
        if joined is None:
            joined = resp
        else:
            joined.fragments.extend(resp.fragments)
        token = resp.next_page_token
        if not token:
            joined.next_page_token = 0
            return joined
        if token <= request.next_page_token:
            # A token is the begin offset of the next page's first fragment: it only grows.
            # One that doesn't would page for ever, or list fragments again.
            raise invalid_response(
                "ListFragments",
                journal,
                f"NextPageToken {token} not past the previous one ({request.next_page_token})",
            )
        request.next_page_token = token
