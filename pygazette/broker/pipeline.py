"""A primary's replication pipeline: one Replicate stream to each peer of a route.

The pipeline sends each ReplicateRequest to every peer (the first carries the pipeline's
Header, addressed to that peer) and gathers one response per peer for requests that ask
for an acknowledgement. It is driven by one append at a time (the journal's append lock),
so a proposal is only ever sent after every peer acknowledged the previous round; replicas
rely on that to confirm content (see `replicated_spool`).

Any send or receive error breaks the pipeline: it is closed, and the next append builds
a new one (and re-synchronises the route).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from pygazette.broker.peers import Peers, PeerUnavailable
from pygazette.protocol.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)

_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]

# A peer must answer a proposal within this long, or the pipeline is broken.
ACK_TIMEOUT_SECONDS = 30.0


class PipelineBroken(Exception):
    """A peer's stream failed; the pipeline can't be used any more."""


@dataclass(slots=True)
class PeerStream:
    index: int  # In the route's members.
    member: pb.ProcessSpec.ID
    call: Any  # grpc.aio.StreamStreamCall[ReplicateRequest, ReplicateResponse]


class Pipeline:
    def __init__(self, header: pb.Header, peers: Peers) -> None:
        self.header = header
        self.route = header.route
        self.peers = peers
        self.streams: list[PeerStream] = []
        self.broken: str = ""
        self.rounds = 0  # Acknowledged rounds (the first synchronises the route).
        self.last_round_first = True  # The last round was the streams' first proposal.
        self._first = True

    @property
    def ok(self) -> bool:
        return not self.broken

    async def open(self) -> None:
        route = self.route
        for i, member in enumerate(route.members):
            if i == route.primary:
                continue
            endpoint = route.endpoints[i] if i < len(route.endpoints) else ""
            try:
                stub = self.peers.stub(endpoint)
            except PeerUnavailable as exc:
                self.broken = str(exc)
                raise PipelineBroken(self.broken) from exc
            call = stub.Replicate(wait_for_ready=False)
            self.streams.append(PeerStream(i, member, call))

    def _request_for(self, req: pb.ReplicateRequest, peer: PeerStream) -> pb.ReplicateRequest:
        if not req.HasField("header"):
            return req
        out = pb.ReplicateRequest()
        out.CopyFrom(req)
        out.header.process_id.CopyFrom(peer.member)
        return out

    async def send(self, req: pb.ReplicateRequest) -> None:
        """Send to every peer; the first request of the pipeline gets its Header."""
        if self.broken:
            raise PipelineBroken(self.broken)
        if self._first and req.HasField("proposal"):
            req.header.CopyFrom(self.header)
            req.deprecated_journal = req.proposal.journal
            self._first = False
        if not self.streams:
            return
        results = await asyncio.gather(
            *(s.call.write(self._request_for(req, s)) for s in self.streams),
            return_exceptions=True,
        )
        for stream, result in zip(self.streams, results, strict=True):
            if isinstance(result, BaseException):
                self._break(stream, result)
        if self.broken:
            raise PipelineBroken(self.broken)

    async def gather(self) -> list[pb.ReplicateResponse]:
        """One response from each peer (in route order, peers only)."""
        if self.broken:
            raise PipelineBroken(self.broken)
        if not self.streams:
            return []

        async def read(stream: PeerStream) -> pb.ReplicateResponse:
            async with asyncio.timeout(ACK_TIMEOUT_SECONDS):
                resp = await stream.call.read()
            if resp is _EOF:
                raise PipelineBroken(f"peer {_pid(stream.member)} closed its stream")
            assert isinstance(resp, pb.ReplicateResponse)
            return resp

        results = await asyncio.gather(*(read(s) for s in self.streams), return_exceptions=True)
        out: list[pb.ReplicateResponse] = []
        for stream, result in zip(self.streams, results, strict=True):
            if isinstance(result, BaseException):
                self._break(stream, result)
            else:
                out.append(result)
        if self.broken:
            raise PipelineBroken(self.broken)
        return out

    async def round(self, req: pb.ReplicateRequest) -> list[pb.ReplicateResponse]:
        """Send a proposal and gather every peer's answer.

        A proposal after the first tells each peer that the previous round was acknowledged
        by all (replicas confirm their content on it), so a caller must not run another round
        on this pipeline after one that any peer refused.
        """
        req.acknowledge = True
        first = self._first
        await self.send(req)
        self.last_round_first = first
        resps = await self.gather()
        self.rounds += 1
        return resps

    def _break(self, stream: PeerStream, exc: BaseException) -> None:
        if isinstance(exc, grpc.aio.AioRpcError):
            why = f"{exc.code().name}: {exc.details()}"
        else:
            why = str(exc) or type(exc).__name__
        if not self.broken:
            self.broken = f"replication to {_pid(stream.member)} failed: {why}"
            log.warning(
                "replication pipeline broken",
                extra={"peer": _pid(stream.member), "error": self.broken},
            )

    async def close(self) -> None:
        """Half-close every stream and wait (briefly) for the peers to end theirs."""
        streams, self.streams = self.streams, []
        if not self.broken:
            self.broken = "pipeline closed"
        for s in streams:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await s.call.done_writing()
        for s in streams:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    while await s.call.read() is not _EOF:
                        pass
            s.call.cancel()

    def abort(self) -> None:
        """Drop every stream at once (no goodbyes)."""
        streams, self.streams = self.streams, []
        if not self.broken:
            self.broken = "pipeline aborted"
        for s in streams:
            s.call.cancel()


def _pid(member: pb.ProcessSpec.ID) -> str:
    return f"{member.zone}#{member.suffix}"
