"""Benchmark: a three-broker cluster on etcd, replication 3 beside replication 1.

Starts etcd and three `pygazette serve --etcd` brokers on loopback (two zones, one shared
`file://` store root), creates a replication-3 and a replication-1 journal, and measures on
each, through its primary:

- commit latency (p50, p99) of sequential small appends;
- append throughput (MB/s) of concurrent writers of large appends;
- appends/s of many concurrent writers of small appends (which pipeline);

so replication 3 reads as a ratio to replication 1 measured in the same run. Each figure
also carries `broker_cpu_ms_per_append`: the CPU time (user and system) all three brokers
spent on the measurement, per append (steadier than rates on a shared machine). With
`--rounds N` the two journals are measured alternately N times (a shared machine is noisy)
and each figure is the median over the rounds, beside every round's. Then, with a
writer appending continuously, it kill -9s the replication-3 journal's primary (restarting
it at once, as a supervisor would) and reports the time from the kill to the first
acknowledged append after it, beside the lease TTL that bounds it.

    python bench/cluster.py [--quick] [--rounds N]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.ports import (  # noqa: E402
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)

MiB = 1 << 20
LEASE_TTL = 3.0
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


class Proc:
    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd, self.log = cmd, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.offset = 0  # Where the latest start's output begins in the log.

    def start(self) -> None:
        self.offset = log_size(self.log)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def check_running(self, what: str) -> None:
        """Raise if it exited: PortInUse if its output says a port was taken."""
        assert self.proc is not None
        if self.proc.poll() is None:
            return
        output = output_since(self.log, self.offset)
        if says_port_taken(output):
            raise PortInUse(f"{what}: a port was taken:\n{output[-2000:]}")
        raise RuntimeError(f"{what} exited early; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_listening(port: int, proc: Proc, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        proc.check_running(what)
        assert proc.proc is not None
        if listens_on(proc.proc.pid, port):  # Itself, not another process on the port.
            return
        time.sleep(0.05)
    proc.kill()
    if says_port_taken(output_since(proc.log, proc.offset)):
        raise PortInUse(f"{what}: port {port} was taken")
    raise TimeoutError(f"{what} did not listen on {port}")


def start_etcd(tmp: Path) -> tuple[Proc, str]:
    """etcd on free ports (others if one was taken), healthy."""
    binary = shutil.which("etcd")
    if binary is None:
        raise SystemExit("etcd is not installed (.ci/install-system-deps installs it)")
    client, peer = ServerPort(), ServerPort()
    return start_retrying(
        lambda: _start_etcd_on(binary, tmp, client.peek(), peer.peek()), [client, peer]
    )


def _start_etcd_on(binary: str, tmp: Path, client: int, peer: int) -> tuple[Proc, str]:
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = Proc(
        [
            binary,
            "--name=bench",
            f"--data-dir={tmp / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=bench={peer_url}",
            "--log-level=warn",
        ],
        tmp / "etcd.log",
    )
    proc.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            proc.check_running("etcd")
        except PortInUse:
            shutil.rmtree(tmp / "etcd", ignore_errors=True)  # Fresh for the next try.
            raise
        assert proc.proc is not None
        if not listens_on(proc.proc.pid, client):  # Not another etcd on the port.
            time.sleep(0.05)
            continue
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if b'"true"' in resp.read():
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError("etcd did not become healthy")


class Broker:
    def __init__(self, tmp: Path, etcd_url: str, zone: str, suffix: str) -> None:
        self._port = ServerPort()  # Moves if taken at the first start; restarts keep it.
        self.zone, self.suffix = zone, suffix
        self.tmp, self.etcd_url = tmp, etcd_url
        self.proc = Proc([], tmp / f"{suffix}.log")

    def command(self, port: int) -> list[str]:
        tmp, etcd_url, zone, suffix = self.tmp, self.etcd_url, self.zone, self.suffix
        return [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "serve",
            "--etcd",
            etcd_url,
            "--zone",
            zone,
            "--id",
            suffix,
            "--port",
            str(port),
            "--data-dir",
            str(tmp / f"data-{suffix}"),
            "--file-root",
            str(tmp / "store"),
            "--lease-ttl",
            f"{LEASE_TTL}s",
        ]

    @property
    def port(self) -> int:
        return self._port.number

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        start_retrying(self._start_once, [self._port])

    def _start_once(self) -> None:
        port = self._port.peek()
        self.proc.cmd = self.command(port)
        self.proc.start()
        wait_listening(port, self.proc, self.suffix)


def spec(name: str, replication: int) -> pb.JournalSpec:
    s = pb.JournalSpec(name=name, replication=replication)
    s.fragment.length = 64 * MiB
    s.fragment.compression_codec = pb.NONE
    s.fragment.stores.append("file:///")
    s.fragment.refresh_interval.seconds = 300
    return s


async def append_once(
    stub: pb_grpc.JournalStub, journal: str, data: bytes, within: float = 30.0
) -> pb.AppendResponse:
    async def reqs() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal)
        for i in range(0, len(data), MiB):
            yield pb.AppendRequest(content=data[i : i + MiB])
        yield pb.AppendRequest()

    resp: pb.AppendResponse = await stub.Append(reqs(), timeout=within)
    return resp


async def routes(stub: pb_grpc.JournalStub) -> dict[str, pb.Route]:
    out: dict[str, pb.Route] = {}
    async for resp in stub.List(pb.ListRequest(selector=pb.LabelSelector()), timeout=10):
        for j in resp.journals:
            out[j.spec.name] = j.route
    return out


async def wait_ready(stub: pb_grpc.JournalStub, wanted: dict[str, int]) -> dict[str, pb.Route]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current = await routes(stub)
        if all(
            name in current and len(current[name].members) == r and current[name].primary >= 0
            for name, r in wanted.items()
        ):
            ok = True
            for name in wanted:
                try:
                    resp = await append_once(stub, name, b"", within=10)
                    ok = ok and resp.status == pb.OK
                except grpc.aio.AioRpcError:
                    ok = False
            if ok:
                return current
        await asyncio.sleep(0.2)
    raise TimeoutError(f"journals not ready: {wanted}")


def primary_address(route: pb.Route) -> str:
    return route.endpoints[route.primary].removeprefix("http://")


async def latency(
    stub: pb_grpc.JournalStub, journal: str, size: int, seconds: float
) -> dict[str, float]:
    data = b"x" * size
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        resp = await append_once(stub, journal, data)
        samples.append(time.perf_counter() - t0)
        if resp.status != pb.OK:
            raise RuntimeError(pb.Status.Name(resp.status))
    samples.sort()
    return {
        "append_bytes": size,
        "appends": len(samples),
        "commit_p50_ms": round(statistics.median(samples) * 1000, 3),
        "commit_p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000, 3),
        "appends_per_s": round(len(samples) / sum(samples), 1),
    }


def brokers_cpu_seconds(brokers: list[Broker]) -> float:
    """CPU time (user and system) the broker processes have spent so far."""
    total = 0.0
    for b in brokers:
        proc = b.proc.proc
        if proc is None or proc.poll() is not None:
            continue
        try:
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def metered(
    brokers: list[Broker], measurement: Awaitable[dict[str, float]]
) -> dict[str, float]:
    """`measurement`'s figures, with the brokers' CPU time per append it made."""
    before = brokers_cpu_seconds(brokers)
    result = await measurement
    spent = brokers_cpu_seconds(brokers) - before
    result["broker_cpu_ms_per_append"] = round(spent * 1000 / max(1.0, result["appends"]), 3)
    return result


async def throughput(
    stub: pb_grpc.JournalStub, journal: str, size: int, writers: int, seconds: float
) -> dict[str, float]:
    data = os.urandom(size)
    total = 0
    deadline = time.monotonic() + seconds

    async def writer() -> None:
        nonlocal total
        while time.monotonic() < deadline:
            resp = await append_once(stub, journal, data)
            if resp.status != pb.OK:
                raise RuntimeError(pb.Status.Name(resp.status))
            total += size

    t0 = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - t0
    return {
        "append_bytes": size,
        "writers": writers,
        "appends": total // size,
        "mb_per_s": round(total / MiB / elapsed, 2),
    }


async def concurrent_small(
    stub: pb_grpc.JournalStub, journal: str, size: int, writers: int, seconds: float
) -> dict[str, float]:
    """Appends/s of many writers of small appends to one journal (they pipeline)."""
    data = b"z" * size
    done = 0
    deadline = time.monotonic() + seconds

    async def writer() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            resp = await append_once(stub, journal, data)
            if resp.status != pb.OK:
                raise RuntimeError(pb.Status.Name(resp.status))
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - t0
    return {
        "append_bytes": size,
        "writers": writers,
        "appends": done,
        "appends_per_s": round(done / elapsed, 1),
    }


async def failover(brokers: list[Broker], journal: str) -> dict[str, float]:
    """Kill -9 the primary under a continuous writer; seconds to the first ack after."""
    channels = {b.suffix: grpc.aio.insecure_channel(b.address, options=OPTIONS) for b in brokers}
    stubs = {k: pb_grpc.JournalStub(ch) for k, ch in channels.items()}  # type: ignore[no-untyped-call]
    route = (await routes(stubs[brokers[0].suffix]))[journal]
    primary_id = route.members[route.primary].suffix
    victim = next(b for b in brokers if b.suffix == primary_id)
    others = [b for b in brokers if b is not victim]
    acks: list[tuple[float, float]] = []  # (sent, acknowledged)
    stop = asyncio.Event()

    async def writer() -> None:
        i = 0
        while not stop.is_set():
            b = others[i % len(others)]
            i += 1
            started = time.monotonic()
            try:
                resp = await append_once(stubs[b.suffix], journal, b"y" * 4096, within=5)
                if resp.status == pb.OK:
                    acks.append((started, time.monotonic()))
                    continue
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.02)

    task = asyncio.create_task(writer())
    while len(acks) < 20:  # noqa: ASYNC110 (polling a plain list the writer appends to)
        await asyncio.sleep(0.05)
    killed = time.monotonic()
    victim.proc.kill()
    await asyncio.to_thread(victim.start)
    deadline = killed + 120
    while not any(t > killed for t, _ in acks) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    stop.set()
    await task
    for ch in channels.values():
        await ch.close(None)
    after = [(t, a) for t, a in acks if t > killed]
    first_ack = min((a for _, a in after), default=float("nan"))
    return {
        # From the kill to the acknowledgement of the first append sent after it.
        "seconds_to_first_ack_after_kill": round(first_ack - killed, 2),
        "lease_ttl_seconds": LEASE_TTL,
    }


def _median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}


async def main(quick: bool, rounds: int = 1) -> dict[str, object]:
    seconds = 2.0 if quick else 6.0
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-bench-cluster-"))
    etcd, etcd_url = start_etcd(tmp)
    brokers = [
        Broker(tmp, etcd_url, "zone-a", "broker-1"),
        Broker(tmp, etcd_url, "zone-b", "broker-2"),
        Broker(tmp, etcd_url, "zone-a", "broker-3"),
    ]
    try:
        for b in brokers:
            b.start()
        async with grpc.aio.insecure_channel(brokers[0].address, options=OPTIONS) as ch:
            stub = pb_grpc.JournalStub(ch)  # type: ignore[no-untyped-call]
            resp = await stub.Apply(
                pb.ApplyRequest(
                    changes=[
                        pb.ApplyRequest.Change(upsert=spec("bench/r3", 3), expect_mod_revision=-1),
                        pb.ApplyRequest.Change(upsert=spec("bench/r1", 1), expect_mod_revision=-1),
                    ]
                )
            )
            assert resp.status == pb.OK, resp
            current = await wait_ready(stub, {"bench/r3": 3, "bench/r1": 1})
        results: dict[str, object] = {}
        measured: dict[str, dict[str, list[dict[str, float]]]] = {}
        for _ in range(rounds):
            for name, key in (("bench/r1", "replication_1"), ("bench/r3", "replication_3")):
                async with grpc.aio.insecure_channel(
                    primary_address(current[name]), options=OPTIONS
                ) as ch:
                    stub = pb_grpc.JournalStub(ch)  # type: ignore[no-untyped-call]
                    m = measured.setdefault(
                        key, {"latency": [], "throughput": [], "concurrent_small": []}
                    )
                    m["latency"].append(await metered(brokers, latency(stub, name, 4096, seconds)))
                    m["throughput"].append(
                        await metered(brokers, throughput(stub, name, 4 * MiB, 4, seconds))
                    )
                    m["concurrent_small"].append(
                        await metered(brokers, concurrent_small(stub, name, 4096, 16, seconds))
                    )
        for key, m in measured.items():
            results[key] = {what: _median_of(runs) for what, runs in m.items()}
            if rounds > 1:
                results[key]["rounds"] = m  # type: ignore[index]
        r1, r3 = results["replication_1"], results["replication_3"]
        assert isinstance(r1, dict) and isinstance(r3, dict)
        results["r3_vs_r1"] = {
            "throughput_ratio": round(
                r3["throughput"]["mb_per_s"] / r1["throughput"]["mb_per_s"], 3
            ),
            "commit_p50_ratio": round(
                r3["latency"]["commit_p50_ms"] / r1["latency"]["commit_p50_ms"], 3
            ),
            "r3_commit_p99_ms": r3["latency"]["commit_p99_ms"],
            "concurrent_small_ratio": round(
                r3["concurrent_small"]["appends_per_s"] / r1["concurrent_small"]["appends_per_s"],
                3,
            ),
            # All brokers' CPU per small append (sequential ones), r=3 over r=1.
            "small_append_cpu_ratio": round(
                r3["latency"]["broker_cpu_ms_per_append"]
                / r1["latency"]["broker_cpu_ms_per_append"],
                3,
            ),
        }
        results["failover"] = await failover(brokers, "bench/r3")
        results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
        return results
    finally:
        for b in brokers:
            b.proc.kill()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter measurements")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure r=1 and r=3 alternately this many times"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick, max(1, args.rounds))), indent=2))
