"""The `pygazette.PeerJournal` gRPC service: an append a peer broker proxies whole, and a
replication a primary sends whole.

A broker that is not a journal's primary proxies each client Append to the primary
(`append_fsm`). Most appends are small, and the proxy has read all of one (its content and
its commit chunk, and the client's end of stream) before it dials the primary. Such an append
travels as one `WholeAppend` message on a unary call, where an Append stream would cost a new
stream with three messages and a half-close: in grpc.aio a unary call costs its client about a
third and its server two thirds as much CPU (`bench/grpc_call_cost.py`).

The primary runs the requests through the same state machine, checks and statuses as an Append
stream carrying them.

`ReplicateWhole` is the same idea one hop further: a small append to a journal with no
replication pipeline open (its first, or the first after a quiet spell) replicates to the one
peer of a route of two as one `WholeReplicate` message (`whole_replication`), not as a new
Replicate stream with a synchronising round and a commit round. The peer applies the requests
as a Replicate stream carrying them (`replicate_service.serve_replicate_whole`).

Only a broker in cluster mode serves this service; a Gazette broker does not at all, and a
broker seeing UNIMPLEMENTED goes back to streaming (`append_fsm`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from pygazette.broker.append_fsm import ClusterAppends
from pygazette.broker.append_service import answer_append
from pygazette.broker.fragment.spool import InsufficientStorage
from pygazette.broker.replicate_service import ReplicateAborted, serve_replicate_whole
from pygazette.protocol.pb import peer_pb2 as ppb
from pygazette.protocol.pb import peer_pb2_grpc as ppb_grpc
from pygazette.protocol.pb import protocol_pb2 as pb

Context = grpc.aio.ServicerContext[Any, Any]


async def _stream(requests: Iterable[pb.AppendRequest]) -> AsyncIterator[pb.AppendRequest]:
    for req in requests:
        yield req


class PeerJournalService(ppb_grpc.PeerJournalServicer):
    def __init__(self, appends: ClusterAppends) -> None:
        self.appends = appends

    async def AppendWhole(  # type: ignore[override]
        self, request: ppb.WholeAppend, context: Context
    ) -> pb.AppendResponse:
        return await answer_append(self.appends.serve(_stream(request.requests)), context)

    async def ReplicateWhole(  # type: ignore[override]
        self, request: ppb.WholeReplicate, context: Context
    ) -> ppb.WholeReplicateResponse:
        try:
            responses = await serve_replicate_whole(request.requests, self.appends.resolver)
        except ReplicateAborted as exc:
            # Refusals are answered, not raised: a call that fails is in doubt to the primary
            # (the peer may have committed before its answer was lost); one refused is not.
            return ppb.WholeReplicateResponse(refused=f"{exc.code.name}: {exc}")
        except InsufficientStorage as exc:
            return ppb.WholeReplicateResponse(refused=f"RESOURCE_EXHAUSTED: {exc}")
        return ppb.WholeReplicateResponse(responses=responses)
