"""A test worker forks children (PySpark's Java gateway, servers run as another user) while
gRPC calls are in flight on its threads: those children must exec, not crash in gRPC."""

from __future__ import annotations

import asyncio
import subprocess

import grpc
from grpc import aio


def _run_forked() -> int:
    # preexec_fn makes CPython fork (not vfork), as PySpark's launch_gateway does.
    return subprocess.run(["true"], preexec_fn=lambda: None, capture_output=True).returncode


async def test_forked_children_exec_while_grpc_calls_are_in_flight() -> None:
    server = aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t", {"E": echo}),))
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/t/E")
    stop = asyncio.Event()

    async def pound() -> None:
        while not stop.is_set():
            await call(b"x")

    callers = [asyncio.create_task(pound()) for _ in range(8)]
    try:
        # With gRPC's fork support on, 1-3% of these children died of SIGSEGV.
        codes = [await asyncio.to_thread(_run_forked) for _ in range(500)]
    finally:
        stop.set()
        await asyncio.gather(*callers)
        await channel.close()
        await server.stop(None)
    assert [c for c in codes if c != 0] == []
