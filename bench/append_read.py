"""Benchmark: broker append and read throughput and commit latency, against a raw baseline.

Every figure is measured beside the same operation against `raw_grpc_server.py` — the
Journal service shape with nothing behind it, serving with the broker's gRPC options —
started in this run, so figures are ratios to what Python gRPC streaming itself does on this
machine. Append runs alternate between the two servers in rounds (raw, broker, broker, raw,
...), so load from other processes that comes and goes hits both about equally;
`external_load_cpus` says how much CPU other processes used meanwhile (0 on an idle
machine; figures taken under load are noisy), and `server_cpu_ms_per_append` what each
server process spent per append, which load disturbs much less than throughput.

`pygazette serve` tunes the process heap for megabyte messages (pygazette/broker/heap_tuning.py),
which makes grpc.aio itself faster at 1 MiB messages. So the raw server runs twice: stock
(`raw`, the grpc.aio ceiling the targets are set against) and with the broker's heap settings
(`raw_same_heap`); `ratio_same_heap` compares the broker with the latter.

`page_cache_write_mb_per_s` is the machine's rate for writing 1 MiB chunks into a new file
(fresh page-cache pages), which the raw server never does. On a VM whose host takes back
free guest memory (balloon free-page reporting), the first touch of such a page is a host
page fault, and this rate drops to a few hundred MB/s; the broker's spool prefaulter takes
those faults on a background thread, ahead of the appends (pygazette/broker/fragment/spool.py).
Measured last, on a file kept until the end, so it neither warms nor starves the broker's
own page-cache allocations.

Reads: `tail_read` is what followers read, the newest 24 MiB of a journal's open spool
(the median of 5 reads); `spool_catch_up_read` reads that spool from its beginning, mostly
content older than the 32 MiB a spool taking large appends keeps in the page cache, so from
disk; `persisted_read` reads fragments from the file store.

With `--tls` and/or `--auth`, a second broker runs beside the first with the same settings plus
TLS (mutual: the client presents a certificate, `--server-ca-file`) and/or authorization
(`--auth-keys`; the client signs tokens with pygazette's `KeyedAuth`, as the client library
does), and joins the same alternating rounds; `secured` holds its figures and their ratios to
the plaintext broker's.

    python bench/append_read.py [--quick] [--tls] [--auth]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.listening_process import start_listening  # noqa: E402

MiB = 1 << 20
TAIL_MIB = 24  # Within the 32 MiB of a spool's newest content kept in the page cache.
TAIL_TIMES = 5
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


T = TypeVar("T")
_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_cpu() -> float:
    """CPU seconds (user, nice, system) used so far by every process on the machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:4]]
    return sum(v) / _TICK


class CpuMeter:
    """CPU used by the given server processes, and by everything but them and this one."""

    def __init__(self, servers: dict[str, int]) -> None:
        self.servers = servers
        self.spent = dict.fromkeys(servers, 0.0)
        self.external = 0.0
        self.wall = 0.0

    def _mine(self) -> float:
        t = os.times()
        return t.user + t.system + sum(process_cpu(p) for p in self.servers.values())

    async def measure(self, server: str, run: Awaitable[T]) -> T:
        """Await `run` and charge the CPU its server spent to `server`."""
        m0, s0, w0 = machine_cpu(), process_cpu(self.servers[server]), time.monotonic()
        mine0 = self._mine()
        result = await run
        self.spent[server] += process_cpu(self.servers[server]) - s0
        self.external += (machine_cpu() - m0) - (self._mine() - mine0)
        self.wall += time.monotonic() - w0
        return result

    def load(self) -> float:
        return round(max(self.external, 0.0) / self.wall, 2) if self.wall else 0.0


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
    latencies = await append_latencies(stub, journal, data, count)
    return summarize(latencies, size)


async def append_latencies(
    stub: pb_grpc.JournalStub, journal: str, data: bytes, count: int
) -> list[float]:
    latencies = []
    for _ in range(count):
        t = time.perf_counter()
        await append_once(stub, journal, data)
        latencies.append(time.perf_counter() - t)
    return latencies


def summarize(latencies: list[float], size: int) -> dict[str, float]:
    elapsed = sum(latencies)
    latencies = sorted(latencies)
    return {
        "mb_per_s": round(size * len(latencies) / elapsed / 1e6, 1),
        "appends_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1e3, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1e3, 3),
    }


async def append_rounds(
    stubs: dict[str, pb_grpc.JournalStub],
    journal: str,
    size: int,
    count: int,
    rounds: int,
    meter: CpuMeter,
) -> dict[str, dict[str, float]]:
    """`count` appends of `size` bytes to each server, alternating in `rounds` rounds."""
    data = os.urandom(size)
    for stub in stubs.values():  # Warm up.
        for _ in range(min(20, count)):
            await append_once(stub, journal, data)
    latencies: dict[str, list[float]] = {name: [] for name in stubs}
    cpu0 = dict(meter.spent)
    names = list(stubs)
    per_round = [count // rounds + (i < count % rounds) for i in range(rounds)]
    for i, n in enumerate(per_round):
        for name in names if i % 2 == 0 else reversed(names):
            run = append_latencies(stubs[name], journal, data, n)
            latencies[name] += await meter.measure(name, run)
    out = {}
    for name in names:
        out[name] = summarize(latencies[name], size)
        cpu = (meter.spent[name] - cpu0[name]) / count
        out[name]["server_cpu_ms_per_append"] = round(cpu * 1e3, 3)
    return out


def page_cache_write(path: Path, size: int, count: int) -> float:
    """MB/s writing `count` chunks of `size` bytes into a new file (fresh page-cache pages)."""
    data = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for i in range(count):
            os.pwrite(fd, data, i * size)
        return round(size * count / (time.perf_counter() - start) / 1e6, 1)
    finally:
        os.close(fd)


async def read_run(stub: pb_grpc.JournalStub, journal: str, begin: int, end: int) -> float:
    start = time.perf_counter()
    total = 0
    async for resp in stub.Read(pb.ReadRequest(journal=journal, offset=begin, end_offset=end)):
        total += len(resp.content)
    elapsed = time.perf_counter() - start
    if total != end - begin:
        raise RuntimeError(f"read {total} bytes, wanted {end - begin}")
    return round(total / elapsed / 1e6, 1)


async def tail_read_run(
    stub: pb_grpc.JournalStub, journal: str, head: int, length: int, times: int
) -> float:
    """MB/s reading the `length` bytes before `head`, `times` over (as followers do)."""
    rates = [await read_run(stub, journal, head - length, head) for _ in range(times)]
    return round(statistics.median(rates), 1)


async def write_head(stub: pb_grpc.JournalStub, journal: str) -> int:
    req = pb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True)
    async for resp in stub.Read(req):
        return int(resp.write_head)
    raise RuntimeError(f"no write head for {journal}")


def ratio(x: float, base: float) -> float:
    return round(x / base, 3) if base else 0.0


def secured_broker_args(tmp: Path, tls: bool, auth: bool) -> tuple[list[str], dict[str, object]]:
    """`serve` flags of the secured broker, and what a client needs to reach it."""
    from pygazette.auth.keyed_auth import KeyedAuth
    from pygazette.auth.tls import ClientTLS, channel_credentials
    from tests.support.tls_material import generate_tls_material

    args: list[str] = []
    client: dict[str, object] = {}
    if tls:
        m = generate_tls_material(tmp / "tls")
        args += ["--server-cert-file", str(m.server_cert), "--server-cert-key-file"]
        args += [str(m.server_key), "--server-ca-file", str(m.ca)]
        client["credentials"] = channel_credentials(
            ClientTLS(ca_file=m.ca, cert_file=m.client_cert, key_file=m.client_key)
        )
    if auth:
        keys = base64.b64encode(os.urandom(32)).decode()
        args += ["--auth-keys", keys]
        client["auth"] = KeyedAuth(keys)
    return args, client


def secured_channel(port: int, client: dict[str, object]) -> grpc.aio.Channel:
    """A channel to the secured broker, signing every RPC when it authorizes."""
    from pygazette.auth.client_interceptor import auth_interceptors
    from pygazette.auth.keyed_auth import KeyedAuth

    auth = client.get("auth")
    interceptors = auth_interceptors(auth) if isinstance(auth, KeyedAuth) else None
    creds = client.get("credentials")
    if isinstance(creds, grpc.ChannelCredentials):
        return grpc.aio.secure_channel(
            f"127.0.0.1:{port}", creds, options=OPTIONS, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=OPTIONS, interceptors=interceptors
    )


def secured_figures(
    big: dict[str, dict[str, float]],
    small: dict[str, dict[str, float]],
    tail: dict[str, float],
    tls: bool,
    auth: bool,
) -> dict[str, object]:
    """The secured broker's figures beside the plaintext broker's, as ratios."""
    b, s = big["secured"], small["secured"]
    return {
        "tls": "mutual" if tls else False,
        "auth": auth,
        "append_1mib": {**b, "ratio_to_plaintext": ratio(b["mb_per_s"], big["broker"]["mb_per_s"])},
        "append_4kib": {
            **s,
            "ratio_to_plaintext": ratio(s["mb_per_s"], small["broker"]["mb_per_s"]),
        },
        "tail_read_mb_per_s": {
            "secured": tail["secured"],
            "plaintext": tail["broker"],
            "ratio_to_plaintext": ratio(tail["secured"], tail["broker"]),
        },
    }


async def main(quick: bool, tls: bool = False, auth: bool = False) -> dict[str, object]:
    n_big, n_small, read_mib, persist_mib = (50, 500, 64, 32) if quick else (300, 3000, 256, 128)
    rounds = 2 if quick else 6
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-bench-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    servers_started: list[subprocess.Popen[bytes]] = []  # Stopped at the end, whatever happens.

    def serve(
        name: str, command: Callable[[int], list[str]]
    ) -> tuple[subprocess.Popen[bytes], int]:
        """Start a server (before any I/O is measured) on a free port, waited for."""
        proc, port = start_listening(command, tmp / f"{name}.log", env=env, what=name)
        servers_started.append(proc)
        return proc, port

    def broker_command(data: str, *flags: str) -> Callable[[int], list[str]]:
        return lambda port: [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(tmp / data),
            *flags,
        ]

    raw_server = [sys.executable, str(ROOT / "bench/raw_grpc_server.py")]
    secure = tls or auth
    secured: subprocess.Popen[bytes] | None = None
    secured_port = 0
    client: dict[str, object] = {}
    load = {}
    secured_out: dict[str, object] = {}
    try:
        if secure:
            flags, client = secured_broker_args(tmp, tls, auth)
            secured, secured_port = serve("secured", broker_command("secured", *flags))
        raw, raw_port = serve("raw", lambda port: [*raw_server, str(port)])
        tuned, tuned_port = serve(
            "raw_same_heap", lambda port: [*raw_server, str(port), "--heap-tuning"]
        )
        broker, broker_port = serve("broker", broker_command("data"))
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{raw_port}", options=OPTIONS) as rc,
            grpc.aio.insecure_channel(f"127.0.0.1:{tuned_port}", options=OPTIONS) as tc,
            grpc.aio.insecure_channel(f"127.0.0.1:{broker_port}", options=OPTIONS) as bc,
        ):
            raw_stub, stub = pb_grpc.JournalStub(rc), pb_grpc.JournalStub(bc)
            tuned_stub = pb_grpc.JournalStub(tc)
            await stub.Apply(
                pb.ApplyRequest(
                    changes=[
                        pb.ApplyRequest.Change(upsert=spec("bench/tail", 1 << 34, pb.NONE)),
                        pb.ApplyRequest.Change(upsert=spec("bench/small", 1 << 34, pb.NONE)),
                        pb.ApplyRequest.Change(upsert=spec("bench/persisted", 16 * MiB, pb.NONE)),
                    ]
                )
            )
            stubs = {"raw": raw_stub, "raw_same_heap": tuned_stub, "broker": stub}
            servers = {"raw": raw.pid, "raw_same_heap": tuned.pid, "broker": broker.pid}
            sc: grpc.aio.Channel | None = None
            if secured is not None:
                sc = secured_channel(secured_port, client)
                secured_stub = pb_grpc.JournalStub(sc)
                await secured_stub.Apply(
                    pb.ApplyRequest(
                        changes=[
                            pb.ApplyRequest.Change(upsert=spec(j, 1 << 34, pb.NONE))
                            for j in ("bench/tail", "bench/small")
                        ]
                    )
                )
                stubs["secured"] = secured_stub
                servers["secured"] = secured.pid

            meter = CpuMeter(servers)
            big = await append_rounds(stubs, "bench/tail", MiB, n_big, rounds, meter)
            load["append_1mib"] = meter.load()
            meter = CpuMeter(servers)
            small = await append_rounds(stubs, "bench/small", 4096, n_small, rounds, meter)
            load["append_4kib"] = meter.load()

            # Tail: what followers read, the newest content of the open spool (within the
            # page-cache window a spool keeps, see pygazette/broker/fragment/spool.py).
            meter = CpuMeter(servers)
            head = await write_head(stub, "bench/tail")
            recent = TAIL_MIB * MiB
            raw_read = await meter.measure(
                "raw", tail_read_run(raw_stub, "bench/tail", recent, recent, TAIL_TIMES)
            )
            same_read = await meter.measure(
                "raw_same_heap", tail_read_run(tuned_stub, "bench/tail", recent, recent, TAIL_TIMES)
            )
            tail_read = await meter.measure(
                "broker", tail_read_run(stub, "bench/tail", head, recent, TAIL_TIMES)
            )
            tails = {"broker": tail_read}
            if sc is not None:
                tails["secured"] = await meter.measure(
                    "secured",
                    tail_read_run(
                        stubs["secured"],
                        "bench/tail",
                        await write_head(stubs["secured"], "bench/tail"),
                        recent,
                        TAIL_TIMES,
                    ),
                )
                secured_out = secured_figures(big, small, tails, tls, auth)
                await sc.close()
            load["tail_read"] = meter.load()
            # Catching up: the open spool from its beginning, mostly older than that window.
            meter = CpuMeter(servers)
            span = read_mib * MiB
            raw_span = await meter.measure("raw", read_run(raw_stub, "bench/tail", 0, span))
            catch_up = await meter.measure("broker", read_run(stub, "bench/tail", 0, span))
            load["spool_catch_up_read"] = meter.load()

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
            meter = CpuMeter(servers)
            persisted_read = await meter.measure(
                "broker", read_run(stub, "bench/persisted", 0, persisted_end)
            )
            load["persisted_read"] = meter.load()
        page_cache = page_cache_write(tmp / "page-cache-probe", MiB, n_big)
    finally:
        for p in servers_started:
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)

    raw_big, raw_small = big["raw"], small["raw"]
    big_b, small_b = big["broker"], small["broker"]
    same_big, same_small = big["raw_same_heap"], small["raw_same_heap"]
    out: dict[str, object] = {
        "benchmark": "append_read",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "page_cache_write_mb_per_s": page_cache,
        },
        "baseline": "raw grpc.aio Journal-shaped server (bench/raw_grpc_server.py), same run; "
        "raw_same_heap: the same with the broker's heap settings",
        "rounds": rounds,
        "external_load_cpus": load,
        "append_1mib": {
            "broker": big_b,
            "raw": raw_big,
            "raw_same_heap": same_big,
            "ratio": ratio(big_b["mb_per_s"], raw_big["mb_per_s"]),
            "ratio_same_heap": ratio(big_b["mb_per_s"], same_big["mb_per_s"]),
        },
        "append_4kib": {
            "broker": small_b,
            "raw": raw_small,
            "raw_same_heap": same_small,
            "ratio": ratio(small_b["mb_per_s"], raw_small["mb_per_s"]),
            "ratio_same_heap": ratio(small_b["mb_per_s"], same_small["mb_per_s"]),
        },
        "commit_latency_4kib_ms": {
            "p50": small_b["p50_ms"],
            "p99": small_b["p99_ms"],
            "raw_p50": raw_small["p50_ms"],
            "raw_p99": raw_small["p99_ms"],
        },
        "tail_read_mb_per_s": {
            "broker": tail_read,
            "raw": raw_read,
            "raw_same_heap": same_read,
            "ratio": ratio(tail_read, raw_read),
            "ratio_same_heap": ratio(tail_read, same_read),
        },
        "spool_catch_up_read_mb_per_s": {
            "broker": catch_up,
            "raw": raw_span,
            "ratio": ratio(catch_up, raw_span),
        },
        "persisted_read_mb_per_s": {
            "broker": persisted_read,
            "raw": raw_read,
            "raw_same_heap": same_read,
            "ratio": ratio(persisted_read, raw_read),
            "ratio_same_heap": ratio(persisted_read, same_read),
        },
    }
    if secured_out:
        out["secured"] = secured_out
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--tls", action="store_true", help="also a broker serving mutual TLS")
    parser.add_argument("--auth", action="store_true", help="also a broker checking JWTs")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick, args.tls, args.auth)), indent=2))
