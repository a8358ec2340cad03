"""A primary's replication of one small append in one call (`pygazette.PeerJournal/ReplicateWhole`).

A journal with no pipeline open (its first append, or the first after its pipeline closed
for idleness: `pulser.PIPELINE_IDLE_SECONDS`) would need a new Replicate stream to its peer, a
synchronising round, a confirming round and the append's commit round: in grpc.aio a new stream
costs several times a message (`bench/grpc_call_cost.py`). On a route of two, an append the
client sent whole instead travels as one message carrying what that stream would carry: the
synchronising proposal with the Header, the content, and the commit that confirms itself with
the Header again (`append_fsm.ClusterAppends._append_whole` builds them). The peer applies them
as such a stream, under its spool lock throughout (`replicate_service.serve_replicate_whole`).

What the call's end says about the peer's copy decides what the primary may answer:

- answers (`replicate_whole` returns them): the peer applied the requests, up to the first
  answer that is not OK, where it stopped;
- `WholeRefused`: the peer refused a request (a Replicate stream would have ended): it applied
  no commit, and rolled back content it took;
- `WholeUnserved`: the peer does not serve the method (UNIMPLEMENTED: a Gazette broker, or
  PERMISSION_DENIED: an older pygazette that authorizes): nothing was applied;
- `WholeInDoubt`: the call failed otherwise (the connection dropped, its deadline passed, a
  malformed answer): the peer may have committed, and confirmed, the append before its answer
  was lost, as when a pipeline breaks after a self-confirming commit went out.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio

from pygazette.auth.capability import Capability
from pygazette.auth.client_interceptor import journal_claims_scope
from pygazette.broker.metrics import INVALID_RESPONSES
from pygazette.broker.peers import Peers
from pygazette.broker.pipeline import ACK_TIMEOUT_SECONDS
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import peer_pb2 as ppb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.validation import validate_whole_replicate_response

# Codes a call ends with before the peer applies anything (it never reached the handler, or
# its request was malformed): the append is not in doubt.
_NOT_APPLIED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


class WholeRefused(Exception):
    """The peer applied no commit (see the module docstring)."""


class WholeUnserved(Exception):
    """The peer does not serve `ReplicateWhole`: nothing was applied."""


class WholeInDoubt(Exception):
    """The peer may have applied the requests, commit included."""


async def replicate_whole(
    peers: Peers, endpoint: str, journal: str, requests: Sequence[pb.ReplicateRequest]
) -> list[pb.ReplicateResponse]:
    """Send `requests` to the peer at `endpoint` in one call: its answers, or one of the
    exceptions above."""
    with journal_claims_scope(Capability.REPLICATE, journal):
        call = peers.peer_stub(endpoint).ReplicateWhole(
            ppb.WholeReplicate(requests=requests), timeout=ACK_TIMEOUT_SECONDS
        )
    try:
        resp: ppb.WholeReplicateResponse = await call
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED):
            # A broker without the method: a Gazette broker, or an older pygazette (which,
            # authorizing, requires every capability of a method it does not know).
            raise WholeUnserved(f"{code.name}: {exc.details() or ''}") from exc
        why = f"{code.name}: {exc.details() or ''}"
        if code in _NOT_APPLIED:
            raise WholeRefused(why) from exc
        raise WholeInDoubt(why) from exc
    except BaseException:
        call.cancel()
        raise
    try:
        validate_whole_replicate_response(resp)
    except ValidationError as exc:
        INVALID_RESPONSES.labels("ReplicateWhole").inc()
        raise WholeInDoubt(f"invalid WholeReplicateResponse: {exc}") from exc
    if resp.refused:
        raise WholeRefused(resp.refused)
    return list(resp.responses)
