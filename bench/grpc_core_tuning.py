"""Benchmark: what gRPC core's EventEngine TCP path costs `grpc.aio`, with and without the
experiments `pygazette` turns off (pygazette/cli/grpc_core_tuning.py).

A raw `grpc.aio` server and client (no broker; processes of their own, since gRPC reads its
settings when it loads) run two workloads in each mode, in interleaved rounds:
- echo: a bidirectional stream, one 4 KiB message each way per round trip;
- append: the Journal service's Append shape (header, 4 KiB of content, commit chunk, end of
  stream; one response), one RPC at a time, on bench/raw_grpc_server.py.
It prints JSON: round trips (or RPCs) a second and the server's CPU per one, for gRPC's
defaults (the baseline) and for pygazette's setting, with their ratio.

Run: python bench/grpc_core_tuning.py [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pygazette.cli.grpc_core_tuning import DEFAULTS_ENV, EXPERIMENTS_ENV, tune_grpc_core  # noqa: E402
from tests.support.process_cpu import cpu_seconds  # noqa: E402

MSG = b"x" * 4096


def _free_port() -> int:
    from tests.support.ports import free_port

    return free_port()


def _mode_env(mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (EXPERIMENTS_ENV, DEFAULTS_ENV)}
    env["PYTHONPATH"] = str(ROOT)
    if mode == "pygazette":
        tune_grpc_core(env)
    else:  # bench/raw_grpc_server.py tunes itself as pygazette does, unless told not to.
        env[DEFAULTS_ENV] = "1"
    return env


async def _echo_server(port: int) -> None:
    import grpc

    def ident(b: bytes) -> bytes:
        return b

    async def echo(it, ctx):  # type: ignore[no-untyped-def]
        async for m in it:
            yield m

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(echo, ident, ident)}
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _client(workload: str, port: int, seconds: float) -> dict[str, float]:
    import grpc

    from pygazette.protocol.pb import protocol_pb2 as pb
    from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await asyncio.wait_for(channel.channel_ready(), 30)
    if workload == "echo":
        call = channel.stream_stream(
            "/bench.Echo/Echo", request_serializer=None, response_deserializer=None
        )()

        async def once() -> None:
            await call.write(MSG)
            await call.read()

    else:
        stub = pb_grpc.JournalStub(channel)
        requests = [
            pb.AppendRequest(journal="bench/journal"),
            pb.AppendRequest(content=MSG),
            pb.AppendRequest(),
        ]

        async def once() -> None:
            await stub.Append(iter(requests))

    for _ in range(200):  # Warm up.
        await once()
    n = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(100):
            await once()
        n += 100
    return {"n": n, "seconds": time.perf_counter() - started}


def _run(mode: str, workload: str, seconds: float) -> dict[str, float]:
    env = _mode_env(mode)
    port = _free_port()
    if workload == "echo":
        server_cmd = [sys.executable, __file__, "--serve-echo", str(port)]
    else:
        server_cmd = [sys.executable, str(ROOT / "bench" / "raw_grpc_server.py"), str(port)]
    server = subprocess.Popen(server_cmd, env=env)
    try:
        client_cmd = [sys.executable, __file__, "--client", workload, str(port), str(seconds)]
        # The server's CPU across the client's whole run (warm-up included, and counted).
        before = cpu_seconds(server.pid)
        client = subprocess.Popen(client_cmd, env=env, stdout=subprocess.PIPE, text=True)
        out, _ = client.communicate(timeout=120)
        after = cpu_seconds(server.pid)
        got = json.loads(out)
        total = got["n"] + 200
        return {
            "per_s": round(got["n"] / got["seconds"], 1),
            "server_cpu_us": round(1e6 * (after - before) / total, 1),
        }
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--serve-echo", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        asyncio.run(_echo_server(args.serve_echo))
        return
    if args.client:
        workload, port, seconds = args.client
        print(json.dumps(asyncio.run(_client(workload, int(port), float(seconds)))))
        return

    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for r in range(args.rounds):
        for workload in ("echo", "append"):
            modes = ("grpc_defaults", "pygazette") if r % 2 == 0 else ("pygazette", "grpc_defaults")
            for mode in modes:
                runs.setdefault(workload, {}).setdefault(mode, []).append(
                    _run(mode, workload, args.seconds)
                )

    def summary(workload: str) -> dict[str, object]:
        med = {
            mode: {k: median(x[k] for x in rs) for k in ("per_s", "server_cpu_us")}
            for mode, rs in runs[workload].items()
        }
        base, ours = med["grpc_defaults"], med["pygazette"]
        return {
            "grpc_defaults": base,
            "pygazette": ours,
            "per_s_ratio": round(ours["per_s"] / base["per_s"], 2),
            "server_cpu_ratio": round(ours["server_cpu_us"] / base["server_cpu_us"], 2),
            "rounds": runs[workload],
        }

    print(
        json.dumps(
            {
                "benchmark": "grpc_core_tuning",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "baseline": "the same raw grpc.aio server and client with gRPC's default "
                "experiments, same run",
                "setting": _mode_env("pygazette")[EXPERIMENTS_ENV],
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "echo_4kib_round_trip": summary("echo"),
                "append_4kib_rpc": summary("append"),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
