"""Benchmark: what a `grpc.aio` call costs against a message on a stream that is already open.

Brokers talk to each other in calls: a proxied Append is a new call to the primary, and a
journal's first append opens a new `Replicate` stream to each peer. This measures, on a raw
`grpc.aio` server and client (no broker; processes of their own, with pygazette's gRPC core
setting, `pygazette/cli/grpc_core_tuning.py`), the client's and the server's CPU per:

- `message`: one 256-byte message each way on a bidirectional stream kept open (the
  baseline: what a message costs once a stream exists);
- `new_stream`: a new bidirectional stream carrying one round trip, then half-closed and
  ended (a `Replicate` stream's life, in its shortest form);
- `append_call`: the Journal service's Append shape, on a new call each time: three
  requests, the half-close, one response;
- `unary_call`: one request and one response on a new call (a unary RPC: what a call costs
  when it carries everything in one message).

Each figure is the median of `--rounds` interleaved runs, as microseconds of CPU per
operation and as a ratio to `message`. Run: python bench/grpc_call_cost.py [--rounds 3]
[--count 3000]
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

from pygazette.cli.grpc_core_tuning import tune_grpc_core  # noqa: E402
from tests.support.process_cpu import cpu_seconds  # noqa: E402

MSG = b"x" * 256
WARM_UP = 200
SHAPES = ("message", "new_stream", "append_call", "unary_call")


async def _serve(port_file: Path) -> None:
    import grpc

    async def echo(requests, _context):  # type: ignore[no-untyped-def]
        async for m in requests:
            yield m

    async def take(requests, _context):  # type: ignore[no-untyped-def]
        async for _m in requests:
            continue  # Received and dropped: the shape of an Append, not its work.
        return MSG

    async def once(request, _context):  # type: ignore[no-untyped-def]
        return MSG

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Calls",
                {
                    "Echo": grpc.stream_stream_rpc_method_handler(echo),
                    "Take": grpc.stream_unary_rpc_method_handler(take),
                    "Once": grpc.unary_unary_rpc_method_handler(once),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.to_thread(port_file.write_text, str(port))
    await server.wait_for_termination()


async def _client(port: int, shape: str, count: int) -> dict[str, float]:
    import grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await asyncio.wait_for(channel.channel_ready(), 30)
    echo = channel.stream_stream("/bench.Calls/Echo")
    take = channel.stream_unary("/bench.Calls/Take")
    unary = channel.unary_unary("/bench.Calls/Once")
    stream = echo()

    async def message() -> None:
        await stream.write(MSG)
        await stream.read()

    async def new_stream() -> None:
        call = echo()
        await call.write(MSG)
        await call.read()
        await call.done_writing()
        await call.read()  # The end of the stream.

    async def append_call() -> None:
        call = take()
        for _ in range(3):
            await call.write(MSG)
        await call.done_writing()
        await call

    async def unary_call() -> None:
        await unary(MSG)

    once = {
        "message": message,
        "new_stream": new_stream,
        "append_call": append_call,
        "unary_call": unary_call,
    }[shape]
    for _ in range(WARM_UP):
        await once()
    cpu, started = time.process_time(), time.perf_counter()
    for _ in range(count):
        await once()
    return {"client_cpu_s": time.process_time() - cpu, "seconds": time.perf_counter() - started}


def _run(shape: str, count: int, env: dict[str, str], work: Path) -> dict[str, float]:
    """One shape on a fresh server process and client process: CPU per operation."""
    port_file = work / f"port-{shape}-{time.monotonic_ns()}"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the benchmark's server did not start")
            time.sleep(0.05)
        port = int(port_file.read_text())
        before = cpu_seconds(server.pid)
        out = subprocess.run(
            [sys.executable, __file__, "--client", str(port), shape, str(count)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
        after = cpu_seconds(server.pid)  # Warm-up included, and counted below.
        got = json.loads(out)
        return {
            "client_cpu_us": round(1e6 * got["client_cpu_s"] / count, 1),
            "server_cpu_us": round(1e6 * (after - before) / (count + WARM_UP), 1),
            "per_s": round(count / got["seconds"], 1),
        }
    finally:
        server.kill()
        server.wait()


def tuned_env() -> dict[str, str]:
    """The environment of the measured processes: pygazette's gRPC core setting."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    tune_grpc_core(env)
    return env


def call_costs(
    shapes: tuple[str, ...], count: int, rounds: int
) -> dict[str, list[dict[str, float]]]:
    """Each shape `rounds` times (interleaved, alternating the order), `count` operations a
    run: CPU per operation of client and server, and operations a second, per run."""
    env = tuned_env()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"pygazette-grpc-call-cost-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in shapes}
    try:
        for r in range(rounds):
            for shape in shapes if r % 2 == 0 else shapes[::-1]:
                runs[shape].append(_run(shape, count, env, work))
    finally:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    return runs


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        s: {k: median(x[k] for x in rs) for k in ("client_cpu_us", "server_cpu_us", "per_s")}
        for s, rs in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=3000, help="operations a run")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(Path(args.serve)))
        return
    if args.client:
        port, shape, count = args.client
        print(json.dumps(asyncio.run(_client(int(port), shape, int(count)))))
        return

    runs = call_costs(SHAPES, args.count, args.rounds)
    med = medians(runs)
    base = med["message"]
    print(
        json.dumps(
            {
                "benchmark": "grpc_call_cost",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "baseline": "one message each way on a grpc.aio stream already open, same run",
                "grpc_experiments": tuned_env().get("GRPC_EXPERIMENTS", ""),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "figures": {
                    s: {
                        **m,
                        "client_cpu_vs_message": round(
                            m["client_cpu_us"] / base["client_cpu_us"], 2
                        ),
                        "server_cpu_vs_message": round(
                            m["server_cpu_us"] / base["server_cpu_us"], 2
                        ),
                    }
                    for s, m in med.items()
                },
                "rounds": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
