"""The `pygazette.PeerJournal` gRPC service: an append a peer broker proxies whole.

A broker that is not a journal's primary proxies each client Append to the primary
(`append_fsm`). Most appends are small, and the proxy has read all of one (its content and
its commit chunk, and the client's end of stream) before it dials the primary. Such an append
travels as one `WholeAppend` message on a unary call, where an Append stream would cost a new
stream with three messages and a half-close: in grpc.aio a unary call costs its client about a
third and its server two thirds as much CPU (`bench/grpc_call_cost.py`).

The primary runs the requests through the same state machine, checks and statuses as an Append
stream carrying them. Only a broker in cluster mode serves it; a Gazette broker does not at
all, and a proxy seeing UNIMPLEMENTED goes back to streaming (`append_fsm`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from pygazette.broker.append_fsm import ClusterAppends
from pygazette.broker.append_service import answer_append
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
