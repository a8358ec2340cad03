"""Baseline server for benchmarks: the Journal service shape with no broker behind it.

Append consumes the client stream and answers; Read streams pre-built chunks. It measures
what Python `grpc.aio` streaming itself costs, so broker figures can be read as ratios.
Run: python bench/raw_grpc_server.py PORT [--heap-tuning]

With --heap-tuning it applies the process heap settings `pygazette serve` applies
(pygazette/broker/heap_tuning.py), so the broker can also be compared with a baseline that
shares them.

It runs gRPC's core as every `pygazette` process does (pygazette/cli/grpc_core_tuning.py:
the EventEngine TCP listener and client experiments off, set before gRPC loads), so that a
broker and this baseline differ only in what serves the RPCs; `PYGAZETTE_GRPC_DEFAULTS=1`
keeps gRPC's defaults (bench/grpc_core_tuning.py's baseline).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

from pygazette.cli.grpc_core_tuning import tune_grpc_core

tune_grpc_core()  # Before grpc loads, as pygazette's entry point does.

import grpc  # noqa: E402

from pygazette.broker.heap_tuning import tune_heap_for_large_messages  # noqa: E402
from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc  # noqa: E402

CHUNK = b"\0" * (1 << 20)


class RawJournal(pb_grpc.JournalServicer):
    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendRequest], context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:  # type: ignore[override]
        total = 0
        async for req in request_iterator:
            total += len(req.content)
        return pb.AppendResponse(status=pb.OK, commit=pb.Fragment(end=total))

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:  # type: ignore[override]
        remaining = request.end_offset - request.offset
        yield pb.ReadResponse(status=pb.OK, offset=request.offset)
        while remaining > 0:
            n = min(remaining, len(CHUNK))
            yield pb.ReadResponse(offset=request.offset, content=CHUNK[:n])
            remaining -= n


# The broker's server options (pygazette/broker/server.py), so the two differ only in what
# serves the RPCs.
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.so_reuseport", 0),
]


async def main(port: int) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_JournalServicer_to_server(RawJournal(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    if "--heap-tuning" in sys.argv[2:] and not tune_heap_for_large_messages():
        sys.exit("heap tuning is not available here")
    asyncio.run(main(int(sys.argv[1])))
