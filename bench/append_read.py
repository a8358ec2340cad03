"""Benchmark: broker append and read throughput and commit latency, against a raw baseline.

Every figure is measured beside the same operation against `raw_grpc_server.py` — the
Journal service shape with nothing behind it — started in this run, so figures are ratios
to what Python gRPC streaming itself does on this machine.

    python bench/append_read.py [--quick]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc  # noqa: E402

MiB = 1 << 20
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited early")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


def spec(name: str, length: int, codec: int) -> pb.JournalSpec:
    s = pb.JournalSpec(name=name, replication=1)
    s.fragment.length = length
    s.fragment.compression_codec = codec
    s.fragment.stores.append("file:///")
    s.fragment.refresh_interval.seconds = 300
    return s


async def append_once(stub: pb_grpc.JournalStub, journal: str, data: bytes) -> pb.AppendResponse:
    async def reqs() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal)
        yield pb.AppendRequest(content=data)
        yield pb.AppendRequest()

    resp: pb.AppendResponse = await stub.Append(reqs())
    if resp.status != pb.OK:
        raise RuntimeError(pb.Status.Name(resp.status))
    return resp


async def append_run(
    stub: pb_grpc.JournalStub, journal: str, size: int, count: int
) -> dict[str, float]:
    data = os.urandom(size)
    for _ in range(min(20, count)):  # Warm up.
        await append_once(stub, journal, data)
    latencies = []
    start = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        await append_once(stub, journal, data)
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "mb_per_s": round(size * count / elapsed / 1e6, 1),
        "appends_per_s": round(count / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1e3, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1e3, 3),
    }


async def read_run(stub: pb_grpc.JournalStub, journal: str, begin: int, end: int) -> float:
    start = time.perf_counter()
    total = 0
    async for resp in stub.Read(pb.ReadRequest(journal=journal, offset=begin, end_offset=end)):
        total += len(resp.content)
    elapsed = time.perf_counter() - start
    if total != end - begin:
        raise RuntimeError(f"read {total} bytes, wanted {end - begin}")
    return round(total / elapsed / 1e6, 1)


def ratio(x: float, base: float) -> float:
    return round(x / base, 3) if base else 0.0


async def main(quick: bool) -> dict[str, object]:
    n_big, n_small, read_mib, persist_mib = (50, 500, 64, 32) if quick else (300, 3000, 256, 128)
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-bench-"))
    raw_port, broker_port = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    raw = subprocess.Popen(  # noqa: ASYNC220 - before any I/O is measured
        [sys.executable, str(ROOT / "bench/raw_grpc_server.py"), str(raw_port)], env=env
    )
    broker = subprocess.Popen(  # noqa: ASYNC220
        [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "serve",
            "--port",
            str(broker_port),
            "--data-dir",
            str(tmp / "data"),
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(raw_port, raw)
        wait_listening(broker_port, broker)
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{raw_port}", options=OPTIONS) as rc,
            grpc.aio.insecure_channel(f"127.0.0.1:{broker_port}", options=OPTIONS) as bc,
        ):
            raw_stub, stub = pb_grpc.JournalStub(rc), pb_grpc.JournalStub(bc)
            await stub.Apply(
                pb.ApplyRequest(
                    changes=[
                        pb.ApplyRequest.Change(upsert=spec("bench/tail", 1 << 34, pb.NONE)),
                        pb.ApplyRequest.Change(upsert=spec("bench/small", 1 << 34, pb.NONE)),
                        pb.ApplyRequest.Change(upsert=spec("bench/persisted", 16 * MiB, pb.NONE)),
                    ]
                )
            )

            raw_big = await append_run(raw_stub, "bench/tail", MiB, n_big)
            big = await append_run(stub, "bench/tail", MiB, n_big)
            raw_small = await append_run(raw_stub, "bench/small", 4096, n_small)
            small = await append_run(stub, "bench/small", 4096, n_small)

            raw_read = await read_run(raw_stub, "bench/tail", 0, read_mib * MiB)
            tail_read = await read_run(stub, "bench/tail", 0, read_mib * MiB)

            chunk = os.urandom(MiB)
            for _ in range(persist_mib):
                await append_once(stub, "bench/persisted", chunk)
            while True:  # Wait for every full fragment to persist.
                resp = await stub.ListFragments(pb.FragmentsRequest(journal="bench/persisted"))
                stored = [f.spec for f in resp.fragments if f.spec.backing_store]
                if sum(f.end - f.begin for f in stored) >= (persist_mib - 16) * MiB:
                    break
                await asyncio.sleep(0.1)
            persisted_end = max(f.end for f in stored)
            persisted_read = await read_run(stub, "bench/persisted", 0, persisted_end)
    finally:
        for p in (raw, broker):
            p.terminate()
            p.wait(10)

    return {
        "benchmark": "append_read",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "baseline": "raw grpc.aio Journal-shaped server (bench/raw_grpc_server.py), same run",
        "append_1mib": {
            "broker": big,
            "raw": raw_big,
            "ratio": ratio(big["mb_per_s"], raw_big["mb_per_s"]),
        },
        "append_4kib": {
            "broker": small,
            "raw": raw_small,
            "ratio": ratio(small["mb_per_s"], raw_small["mb_per_s"]),
        },
        "commit_latency_4kib_ms": {
            "p50": small["p50_ms"],
            "p99": small["p99_ms"],
            "raw_p50": raw_small["p50_ms"],
            "raw_p99": raw_small["p99_ms"],
        },
        "tail_read_mb_per_s": {
            "broker": tail_read,
            "raw": raw_read,
            "ratio": ratio(tail_read, raw_read),
        },
        "persisted_read_mb_per_s": {
            "broker": persisted_read,
            "raw": raw_read,
            "ratio": ratio(persisted_read, raw_read),
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick)), indent=2))
