"""Benchmark: a cluster of K brokers with N journals at replication R, pygazette beside
Gazette's own broker (interop/bin/gazette) on the same workload, in the same run.

For each system: a fresh etcd (interop/bin/etcd, default --max-txn-ops 128) and K broker
processes in two zones, sharing one `file://` store root. Then:

- **apply**: N journal specs applied through broker 1 in transactions of at most 100
  changes (the client's `apply_journals_in_batches`, as `journals apply --max-txn-size`);
- **converge**: time from the end of the apply until List (through broker 1) shows every
  journal with R members and a primary; and until etcd is still (2 s without a write): the
  primaries have pulsed every journal and written its route into its assignments;
- **broker CPU** (user + system, from /proc) and etcd revisions from the start of the
  apply until etcd is still;
- **list**: once etcd is still, a List of every journal through broker 1, three times:
  the median seconds as pygazette's client takes it (every response checked with
  Gazette's rules) and of the bare RPC, and broker 1's CPU per List. The converge figure
  above is polled with such Lists, so it is never finer than one of them;
- **first append** to each journal: one small append to every journal, 64 at a time,
  through broker 1; rate, errors (by status or gRPC code), broker CPU per append;
- **RSS per journal replica**: the brokers' summed RSS growth over the empty cluster,
  after convergence and after the first appends, divided by N x R;
- **idle**: each broker's CPU (% of one core) and etcd's revision delta (its writes)
  over `--idle` seconds right after the second appends. That window is not a steady idle:
  it holds the work the second appends left (the primaries' and, 5 s later, the replicas'
  persisting of the spools they rolled; replication pipelines closing 60 s after their last
  append). `--steady-idle S` measures a second window of S seconds that starts
  `--steady-after` seconds (default 80: past the pipelines' closing) after the second
  appends ended, once that work is done (`idle_steady_*`);
- **restart**: one broker is killed (SIGKILL) and started again at once with the same ID;
  the time until it serves (answers List) and until appends through it to the journals it
  is a member of all succeed (a sample of up to 200);
- **moves**: the assignments added and removed (etcd keys under `assign/`) when a
  broker is added, and when one leaves (SIGTERM: it drains), each until the cluster is
  converged and the assignments have been still for 3 s.

With `--shards M` (pygazette only: Gazette's consumer needs a Go application): 4 consumer
processes (`pygazette consumer serve`, the test Counter app on MemoryStore) and M shards
reading the N journals, applied in transactions of 100; the time from the end of the
apply until every shard has a primary (target: 10 s).

    python bench/scale.py [-K 6] [-N 1000] [-R 2] [--shards 5000 [--shards-only]] [--quick]
                          [--systems pygazette gazette] [--smoke]

Prints one JSON document: every figure per system, and pygazette's as ratios to Gazette's
beside the issue's targets. `--smoke` is a correctness run (no targets, no Gazette unless
asked): it exits non-zero if any journal or shard did not converge or any append failed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import grpc_call_cost  # noqa: E402
from pygazette.client.journal_client import JournalClient  # noqa: E402
from pygazette.client.list_apply import apply_journals_in_batches, list_all  # noqa: E402
from pygazette.consumer.shard_client import ShardClient  # noqa: E402
from pygazette.protocol.pb import consumer_pb2 as cpb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2 as pb  # noqa: E402
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402
from tests.support.consumer_process import ConsumerProcess  # noqa: E402
from tests.support.gazette_process import (  # noqa: E402
    EtcdServer,
    GazetteBroker,
    gazette_binaries,
)

TXN_SIZE = 100
FLOOR_COUNT, FLOOR_ROUNDS = 1500, 3  # bench/grpc_call_cost.py's runs for the first-append floor.
APPEND_CONCURRENCY = 64
LEASE_TTL_S = 20  # Both systems' default.
SETTLE_S = 3.0  # Assignments still this long: the allocator is done moving.
PAYLOAD = b'{"key":"scale"}\n'  # What the shards' Counter app counts.
SHARD_OUTPUT = "scale/out"  # Where it publishes counts.
GAZETTE_VERSION = "v0.103.0"
TARGETS = {
    "apply_s": "<= 2x Gazette's",
    "converged_after_apply_s": "<= 5 s",
    "first_append_per_s": ">= 0.5x Gazette's, 0 errors",
    "rss_kib_per_replica": "<= 2x Gazette's",
    "idle_cpu_pct_per_broker": "< 1% each",
    "idle_etcd_writes": "0",
    "shards_converged_after_apply_s": "<= 10 s",
}


# Processes -------------------------------------------------------------------------------


class Broker(Protocol):
    port: int

    @property
    def address(self) -> str: ...

    def start(self, timeout: float = ...) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...

    def kill(self) -> None: ...


def pid_of(broker: Broker) -> int | None:
    proc = getattr(broker, "proc", None)
    if proc is None or proc.poll() is not None:
        return None
    return int(proc.pid)


def cpu_seconds(pid: int | None) -> float:
    """The process's CPU time so far (user + system), 0 if it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Cluster:
    system: str
    etcd: EtcdServer
    prefix: str
    brokers: list[Broker]
    make_broker: Callable[[int], Broker]

    def pids(self) -> list[int | None]:
        return [pid_of(b) for b in self.brokers]

    def cpu(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids())

    def rss(self) -> int:
        return sum(rss_kib(p) for p in self.pids())

    def stop(self) -> None:
        for b in self.brokers:
            b.kill()
        self.etcd.stop()


def start_cluster(
    system: str, k: int, tmp: Path, journal_limit: int, etcd_binary: Path, gazette: Path | None
) -> Cluster:
    (tmp / "etcd").mkdir(parents=True)
    etcd = EtcdServer(etcd_binary, tmp / "etcd" / "data")
    etcd.start()
    store = tmp / "store"
    store.mkdir()
    prefix = f"/scale-{uuid.uuid4().hex[:8]}/gazette/cluster"

    def make(i: int) -> Broker:
        zone = "zone-a" if i % 2 == 0 else "zone-b"
        suffix = f"broker-{i:02d}"
        if system == "pygazette":
            data = tmp / suffix / "data"
            data.parent.mkdir(parents=True, exist_ok=True)
            return BrokerProcess(
                data,
                extra_args=[
                    "--etcd",
                    etcd.url,
                    "--etcd-prefix",
                    prefix,
                    "--zone",
                    zone,
                    "--id",
                    suffix,
                    "--lease-ttl",
                    f"{LEASE_TTL_S}s",
                    "--journal-limit",
                    str(journal_limit),
                    "--file-root",
                    str(store),
                    "--drain-timeout",
                    "60s",
                ],
                env={"PYGAZETTE_LOG_LEVEL": "warning"},
            )
        assert gazette is not None
        return GazetteBroker(
            gazette,
            etcd,
            tmp / suffix,
            file_root=store,
            prefix=prefix,
            broker_id=suffix,
            extra_args=[
                f"--broker.zone={zone}",
                f"--broker.limit={journal_limit}",
                f"--etcd.lease={LEASE_TTL_S}s",
            ],
        )

    cluster = Cluster(system, etcd, prefix, [], make)
    try:
        for i in range(k):
            broker = make(i)
            broker.start(timeout=120)
            cluster.brokers.append(broker)
    except BaseException:
        cluster.stop()
        raise
    return cluster


# etcd, through its JSON gateway ----------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def etcd_range(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/v3/kv/range", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def etcd_revision(url: str) -> int:
    return int(etcd_range(url, {"key": _b64("\0"), "count_only": True})["header"]["revision"])


def assignment_pairs(url: str, prefix: str) -> set[tuple[str, str]]:
    """(journal, member) of every assignment key: `<prefix>/assign/<j>#<zone>#<id>#<slot>`."""
    root = prefix + "/assign/"
    resp = etcd_range(
        url, {"key": _b64(root), "range_end": _b64(_prefix_end(root)), "keys_only": True}
    )
    pairs = set()
    for kv in resp.get("kvs", []):
        key = base64.b64decode(kv["key"]).decode()[len(root) :]
        journal, zone, suffix, _slot = key.rsplit("#", 3)
        pairs.add((journal, f"{zone}#{suffix}"))
    return pairs


# Journals --------------------------------------------------------------------------------


def journal_names(n: int) -> list[str]:
    return [f"scale/j-{i:05d}" for i in range(n)]


def journal_spec(name: str, replication: int) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=replication)
    spec.labels.labels.add(name="content-type", value="application/x-ndjson")
    spec.fragment.length = 64 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 300
    return spec


def converged(listing: pb.ListResponse, names: set[str], r: int) -> int:
    """How many of `names` have R members and a primary in the listing."""
    return sum(
        1
        for j in listing.journals
        if j.spec.name in names and len(j.route.members) == r and j.route.primary >= 0
    )


async def wait_converged(
    client: JournalClient, names: set[str], r: int, within: float
) -> tuple[float | None, int]:
    """Seconds until every journal has R members and a primary (None: not within within),
    and how many had at the end."""
    started = time.monotonic()
    done = 0
    while time.monotonic() - started < within:
        try:
            done = converged(await list_all(client), names, r)
        except grpc.aio.AioRpcError:
            done = 0
        if done == len(names):
            return time.monotonic() - started, done
        await asyncio.sleep(0.25)
    return None, done


async def time_lists(client: JournalClient, cluster: Cluster, times: int = 3) -> dict[str, Any]:
    """Median seconds of a full List as the client takes it (checked) and of the bare RPC,
    broker 1's CPU per checked List, and how many journals each listed."""
    checked, bare, cpu = [], [], []
    listed: set[int] = set()
    pid = pid_of(cluster.brokers[0])
    for _ in range(times):
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        listed.add(len((await list_all(client)).journals))
        checked.append(time.monotonic() - t0)
        cpu.append(cpu_seconds(pid) - cpu0)
        t0 = time.monotonic()
        call = client.rpc_list(pb.ListRequest())
        listed.add(sum([len(resp.journals) async for resp in call]))
        bare.append(time.monotonic() - t0)
    return {
        "checked_s": round(sorted(checked)[times // 2], 3),
        "bare_rpc_s": round(sorted(bare)[times // 2], 3),
        "broker_cpu_s": round(sorted(cpu)[times // 2], 3),
        "journals_listed": sorted(listed),  # One count, unless the listings disagreed.
    }


async def wait_etcd_quiet(url: str, still: float, within: float) -> float | None:
    """Seconds until etcd's revision stays the same for `still` seconds (None: never)."""
    started = time.monotonic()
    last, since = etcd_revision(url), time.monotonic()
    while time.monotonic() - started < within:
        await asyncio.sleep(0.25)
        rev = etcd_revision(url)
        if rev != last:
            last, since = rev, time.monotonic()
        elif time.monotonic() - since >= still:
            return time.monotonic() - started
    return None


async def append_once(
    stub: pb_grpc.JournalStub, journal: str, within: float = 30.0
) -> pb.AppendResponse:
    async def reqs() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal)
        yield pb.AppendRequest(content=PAYLOAD)
        yield pb.AppendRequest()

    resp: pb.AppendResponse = await stub.Append(reqs(), timeout=within)
    return resp


async def append_each(address: str, names: list[str]) -> dict[str, Any]:
    """One append to each journal, APPEND_CONCURRENCY at a time; rate and errors."""
    errors: Counter[str] = Counter()
    queue = iter(names)
    latencies: list[float] = []
    own0 = time.process_time()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]

        async def worker() -> None:
            for name in queue:
                t0 = time.perf_counter()
                try:
                    resp = await append_once(stub, name)
                    if resp.status != pb.OK:
                        errors[pb.Status.Name(resp.status)] += 1
                        continue
                except grpc.aio.AioRpcError as exc:
                    errors[f"{exc.code().name}: {(exc.details() or '')[:120]}"] += 1
                    continue
                latencies.append(time.perf_counter() - t0)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(APPEND_CONCURRENCY)))
        elapsed = time.monotonic() - started
    return append_figures(len(names), latencies, errors, elapsed, time.process_time() - own0)


def append_figures(
    attempted: int, latencies: list[float], errors: Counter[str], elapsed: float, own_cpu: float
) -> dict[str, Any]:
    """`append_each`'s figures: the rate is of acknowledged appends (`latencies`, one each),
    so that appends answered with an error, which fail fast, do not raise it."""
    ok = len(latencies)
    latencies = sorted(latencies)
    return {
        "appends": attempted,
        "acknowledged": ok,
        "seconds": round(elapsed, 2),
        "per_s": round(ok / elapsed, 1),
        # This process's CPU (the appending client; the same code against both systems).
        "client_cpu_ms_per_append": round(own_cpu * 1000 / max(1, attempted), 3),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors.most_common(5)),
        "p50_ms": round(latencies[ok // 2] * 1000, 1) if latencies else None,
        "p99_ms": round(latencies[min(ok - 1, int(ok * 0.99))] * 1000, 1) if latencies else None,
    }


async def wait_settled(
    cluster: Cluster, client: JournalClient, names: set[str], r: int, within: float
) -> tuple[float | None, set[tuple[str, str]]]:
    """Seconds until converged with assignments unchanged for SETTLE_S; the assignments."""
    started = time.monotonic()
    last = assignment_pairs(cluster.etcd.url, cluster.prefix)
    still_since = time.monotonic()
    while time.monotonic() - started < within:
        await asyncio.sleep(0.5)
        now = assignment_pairs(cluster.etcd.url, cluster.prefix)
        if now != last:
            last, still_since = now, time.monotonic()
            continue
        if time.monotonic() - still_since < SETTLE_S:
            continue
        try:
            listing = await list_all(client)
        except grpc.aio.AioRpcError:
            continue
        if converged(listing, names, r) == len(names):
            return still_since - started, now
    return None, last


# The workload ----------------------------------------------------------------------------


async def run_system(
    system: str, args: argparse.Namespace, tmp: Path, etcd_binary: Path, gazette: Path | None
) -> dict[str, Any]:
    k, n, r = args.brokers, args.journals, args.replication
    names = journal_names(n)
    name_set = set(names)
    limit = max(1024, 2 * n * r // max(1, k - 1) + 64)
    cluster = start_cluster(system, k, tmp, limit, etcd_binary, gazette)
    out: dict[str, Any] = {"brokers": k, "journals": n, "replication": r}
    try:
        first = cluster.brokers[0].address
        await asyncio.sleep(1.0)  # Let the brokers' startup settle before the baseline.
        rss_empty = cluster.rss()
        async with JournalClient(first) as client:
            # Apply.
            cpu0, rev0 = cluster.cpu(), etcd_revision(cluster.etcd.url)
            started = time.monotonic()
            with py_spy(cluster, args.py_spy, "apply"):
                await apply_journals_in_batches(
                    client,
                    [pb.ApplyRequest.Change(upsert=journal_spec(j, r)) for j in names],
                    TXN_SIZE,
                )
                out["apply_s"] = round(time.monotonic() - started, 2)
                applied = time.monotonic()
                after, done = await wait_converged(client, name_set, r, args.timeout)
            out["converged_after_apply_s"] = None if after is None else round(after, 2)
            out["converged_journals"] = done
            # Then until etcd is still for 2 s: the primaries' pulses have advertised
            # every route (one etcd write per journal, in both systems).
            quiet = await wait_etcd_quiet(cluster.etcd.url, 2.0, args.timeout)
            out["etcd_quiet_after_apply_s"] = (
                None if quiet is None else round(time.monotonic() - applied - 2.0, 2)
            )
            out["broker_cpu_s_apply_to_quiet"] = round(cluster.cpu() - cpu0, 2)
            out["etcd_revisions_apply_to_quiet"] = etcd_revision(cluster.etcd.url) - rev0
            out["list"] = await time_lists(client, cluster)
            out["rss_mib_converged"] = round(cluster.rss() / 1024, 1)
            out["rss_kib_per_replica_converged"] = round((cluster.rss() - rss_empty) / (n * r), 1)
            if args.shards_only:
                out["shards"] = await shards_bench(cluster, tmp, names, args)
                return out

            # First append to each journal.
            cpu0 = cluster.cpu()
            with py_spy(cluster, args.py_spy, "first-append"):
                appends = await append_each(first, names)
            appends["broker_cpu_ms_per_append"] = round(
                (cluster.cpu() - cpu0) * 1000 / max(1, appends["acknowledged"]), 2
            )
            out["first_append"] = appends
            # A second append to each journal: the same path once the journal is open
            # (pipeline, spools, metrics), which tells the first append's own cost apart.
            cpu0 = cluster.cpu()
            with py_spy(cluster, args.py_spy, "second-append"):
                again = await append_each(first, names)
            again["broker_cpu_ms_per_append"] = round(
                (cluster.cpu() - cpu0) * 1000 / max(1, again["acknowledged"]), 2
            )
            out["second_append"] = again
            out["rss_mib_after_appends"] = round(cluster.rss() / 1024, 1)
            out["rss_kib_per_replica"] = round((cluster.rss() - rss_empty) / (n * r), 1)
            out["rss_mib_empty_cluster"] = round(rss_empty / 1024, 1)

            # Idle.
            t0 = time.monotonic()
            cpu_pct, writes = await idle_window(cluster, args.idle, args.py_spy, "idle")
            out["idle_seconds"] = args.idle
            out["idle_cpu_pct_per_broker"] = cpu_pct
            out["idle_etcd_writes"] = writes
            out["rss_kib_per_replica_after_idle"] = round((cluster.rss() - rss_empty) / (n * r), 1)
            if args.steady_idle > 0:
                # Past the work the second appends left (see the module docstring).
                await asyncio.sleep(max(0.0, args.steady_after - (time.monotonic() - t0)))
                out["idle_steady_after_s"] = round(time.monotonic() - t0, 1)
                cpu_pct, writes = await idle_window(
                    cluster, args.steady_idle, args.py_spy, "idle-steady"
                )
                out["idle_steady_seconds"] = args.steady_idle
                out["idle_steady_cpu_pct_per_broker"] = cpu_pct
                out["idle_steady_etcd_writes"] = writes

            if args.quiet_append:
                # An append to each journal after a quiet spell: pygazette's brokers closed
                # the journals' replication pipelines (`pulser.PIPELINE_IDLE_SECONDS`), and
                # replicate each such append whole (`whole_replication`); Gazette's keep
                # their pipelines open.
                await asyncio.sleep(max(0.0, args.quiet_after - (time.monotonic() - t0)))
                cpu0 = cluster.cpu()
                with py_spy(cluster, args.py_spy, "quiet-append"):
                    quiet_appends = await append_each(first, names)
                quiet_appends["broker_cpu_ms_per_append"] = round(
                    (cluster.cpu() - cpu0) * 1000 / max(1, quiet_appends["acknowledged"]), 2
                )
                quiet_appends["after_s"] = args.quiet_after
                out["quiet_append"] = quiet_appends

            if args.restart:
                out["restart"] = await restart_one(cluster, client, name_set, r, args.timeout)
            if args.moves:
                out["moves"] = await moves(cluster, client, name_set, r, args.timeout)
            if args.shards and system == "pygazette":
                out["shards"] = await shards_bench(cluster, tmp, names, args)
    finally:
        cluster.stop()
    return out


async def idle_window(
    cluster: Cluster, seconds: float, py_spy_dir: Path | None, phase: str
) -> tuple[list[float], int]:
    """Each broker's CPU (% of one core) and etcd's writes over `seconds` of doing nothing."""
    cpus0 = [cpu_seconds(p) for p in cluster.pids()]
    rev0, t0 = etcd_revision(cluster.etcd.url), time.monotonic()
    with py_spy(cluster, py_spy_dir, phase):
        await asyncio.sleep(seconds)
    spent = time.monotonic() - t0
    cpus = [cpu_seconds(p) - c for p, c in zip(cluster.pids(), cpus0, strict=True)]
    return [round(c * 100 / spent, 2) for c in cpus], etcd_revision(cluster.etcd.url) - rev0


async def restart_one(
    cluster: Cluster, client: JournalClient, names: set[str], r: int, within: float
) -> dict[str, Any]:
    """SIGKILL the last broker and start it again at once (as a supervisor would)."""
    victim = cluster.brokers[-1]
    listing = await list_all(client)
    port = victim.port
    mine = [
        j.spec.name
        for j in listing.journals
        if any(ep.endswith(f":{port}") for ep in j.route.endpoints)
    ][:200]
    victim.kill()
    started = time.monotonic()
    victim.start(timeout=within)
    serving = time.monotonic() - started
    out: dict[str, Any] = {"member_of_sampled": len(mine), "listening_s": round(serving, 2)}
    deadline = started + within
    pending = list(mine)
    async with grpc.aio.insecure_channel(victim.address) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        while pending and time.monotonic() < deadline:
            failed = []
            for name in pending:
                try:
                    resp = await append_once(stub, name, within=10)
                    if resp.status == pb.OK:
                        continue
                except grpc.aio.AioRpcError:
                    pass
                failed.append(name)
            pending = failed
            if pending:
                await asyncio.sleep(0.25)
    out["appends_through_it_s"] = None if pending else round(time.monotonic() - started, 2)
    after, _ = await wait_converged(client, names, r, max(1.0, deadline - time.monotonic()))
    out["cluster_converged_s"] = None if after is None else round(time.monotonic() - started, 2)
    return out


async def moves(
    cluster: Cluster, client: JournalClient, names: set[str], r: int, within: float
) -> dict[str, Any]:
    """Assignments added and removed as a broker joins, then as one leaves."""
    out: dict[str, Any] = {}
    _, before = await wait_settled(cluster, client, names, r, within)
    added = cluster.make_broker(len(cluster.brokers))
    started = time.monotonic()
    added.start(timeout=120)
    cluster.brokers.append(added)
    took, after = await wait_settled(cluster, client, names, r, within)
    out["broker_added"] = {
        "assignments_added": len(after - before),
        "assignments_removed": len(before - after),
        "settled_s": None if took is None else round(time.monotonic() - started - SETTLE_S, 2),
    }
    leaving = cluster.brokers.pop(1)
    started = time.monotonic()
    leaving.stop(timeout=within)  # SIGTERM: it drains.
    took, final = await wait_settled(cluster, client, names, r, within)
    out["broker_removed"] = {
        "assignments_added": len(final - after),
        "assignments_removed": len(after - final),
        "exit_s": round(time.monotonic() - started, 2),
        "settled": took is not None,
    }
    return out


# Shards ----------------------------------------------------------------------------------


async def shards_bench(
    cluster: Cluster, tmp: Path, journals: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    m = args.shards
    consumers: list[ConsumerProcess] = []
    prefix = f"/scale-{uuid.uuid4().hex[:8]}/consumers/counter"
    out: dict[str, Any] = {"shards": m, "consumers": args.consumers}
    async with JournalClient(cluster.brokers[0].address) as client:
        output = journal_spec(SHARD_OUTPUT, 1)
        await apply_journals_in_batches(client, [pb.ApplyRequest.Change(upsert=output)])
    try:
        for i in range(args.consumers):
            data = tmp / f"consumer-{i}" / "data"
            data.parent.mkdir(parents=True)
            proc = ConsumerProcess(
                data,
                app="tests.consumer.apps:Counter",
                broker=f"http://{cluster.brokers[i % len(cluster.brokers)].address}",
                etcd=cluster.etcd.url,
                etcd_prefix=prefix,
                zone="zone-a" if i % 2 == 0 else "zone-b",
                extra_args=[
                    "--shard-limit",
                    str(m),
                    "--lease-ttl",
                    f"{LEASE_TTL_S}s",
                    "--log-level",
                    "warning",
                ],
                env={"COUNTER_OUTPUT": "scale/out"},
            )
            proc.start(timeout=120)
            consumers.append(proc)
        ids = [f"shard-{i:05d}" for i in range(m)]
        changes = []
        for i, sid in enumerate(ids):
            spec = cpb.ShardSpec(id=sid)
            spec.sources.add(journal=journals[i % len(journals)])
            spec.max_txn_duration.FromMilliseconds(1000)
            spec.labels.labels.add(name="app", value="scale")
            changes.append(cpb.ApplyRequest.Change(upsert=spec))
        pids = [c.pid for c in consumers]
        rss0 = sum(rss_kib(p) for p in pids)
        cpu0 = [cpu_seconds(p) for p in pids]
        etcd_pid = cluster.etcd.proc.pid if cluster.etcd.proc is not None else None
        brokers0, etcd0, own0 = cluster.cpu(), cpu_seconds(etcd_pid), time.process_time()
        async with ShardClient(consumers[0].url) as shards:
            with (
                sampled(pids, args.py_spy, "shards", "consumer"),
                py_spy(cluster, args.py_spy, "shards"),
            ):
                started = time.monotonic()
                await shards.apply_in_batches(changes, TXN_SIZE, within=60)
                out["apply_s"] = round(time.monotonic() - started, 2)
                applied = time.monotonic()
                primaries = 0
                while time.monotonic() - applied < args.timeout:
                    listing = await shards.list_all(pb.LabelSelector(), within=60)
                    primaries = sum(
                        1
                        for s in listing.shards
                        if s.status and s.status[0].code == cpb.ReplicaStatus.PRIMARY
                    )
                    if primaries == m:
                        break
                    # Each List of M shards costs the consumer serving it: not too often.
                    await asyncio.sleep(0.5)
                ok = primaries == m
                took = round(time.monotonic() - applied, 2)
                out["converged_after_apply_s"] = took if ok else None
                out["converged_after_apply_start_s"] = (
                    round(time.monotonic() - started, 2) if ok else None
                )
                out["primaries"] = primaries
        # CPU from the apply's start until converged: where the machine's time went.
        each = [round(cpu_seconds(p) - c0, 2) for p, c0 in zip(pids, cpu0, strict=True)]
        out["consumer_cpu_s"] = round(sum(each), 2)
        out["consumer_cpu_s_each"] = each
        out["broker_cpu_s"] = round(cluster.cpu() - brokers0, 2)
        out["etcd_cpu_s"] = round(cpu_seconds(etcd_pid) - etcd0, 2)
        out["bench_client_cpu_s"] = round(time.process_time() - own0, 2)
        out["rss_kib_per_shard"] = round((sum(rss_kib(p) for p in pids) - rss0) / m, 1)
    finally:
        for c in consumers:
            c.kill()
    return out


# Report ----------------------------------------------------------------------------------


def ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(a / b, 2)


def compare(py: dict[str, Any], go: dict[str, Any]) -> dict[str, Any]:
    def both(p: Any, g: Any) -> dict[str, Any]:
        return {"pygazette": p, "gazette": g, "ratio": ratio(p, g)}

    return {
        "apply_s": both(py.get("apply_s"), go.get("apply_s")),
        "converged_after_apply_s": both(
            py.get("converged_after_apply_s"), go.get("converged_after_apply_s")
        ),
        "etcd_quiet_after_apply_s": both(
            py.get("etcd_quiet_after_apply_s"), go.get("etcd_quiet_after_apply_s")
        ),
        "broker_cpu_s_apply_to_quiet": both(
            py.get("broker_cpu_s_apply_to_quiet"), go.get("broker_cpu_s_apply_to_quiet")
        ),
        "list_bare_rpc_s": both(
            py.get("list", {}).get("bare_rpc_s"), go.get("list", {}).get("bare_rpc_s")
        ),
        "list_broker_cpu_s": both(
            py.get("list", {}).get("broker_cpu_s"), go.get("list", {}).get("broker_cpu_s")
        ),
        "first_append_per_s": both(py["first_append"]["per_s"], go["first_append"]["per_s"]),
        "first_append_errors": both(py["first_append"]["errors"], go["first_append"]["errors"]),
        "first_append_broker_cpu_ms": both(
            py["first_append"]["broker_cpu_ms_per_append"],
            go["first_append"]["broker_cpu_ms_per_append"],
        ),
        "second_append_per_s": both(py["second_append"]["per_s"], go["second_append"]["per_s"]),
        "second_append_broker_cpu_ms": both(
            py["second_append"]["broker_cpu_ms_per_append"],
            go["second_append"]["broker_cpu_ms_per_append"],
        ),
        **(
            {
                "quiet_append_per_s": both(
                    py["quiet_append"]["per_s"], go["quiet_append"]["per_s"]
                ),
                "quiet_append_broker_cpu_ms": both(
                    py["quiet_append"]["broker_cpu_ms_per_append"],
                    go["quiet_append"]["broker_cpu_ms_per_append"],
                ),
            }
            if "quiet_append" in py and "quiet_append" in go
            else {}
        ),
        "rss_kib_per_replica": both(py.get("rss_kib_per_replica"), go.get("rss_kib_per_replica")),
        "idle_cpu_pct_max_broker": both(
            max(py["idle_cpu_pct_per_broker"]), max(go["idle_cpu_pct_per_broker"])
        ),
        "idle_etcd_writes": both(py.get("idle_etcd_writes"), go.get("idle_etcd_writes")),
    }


FLOOR_SHAPES = ("append_call", "unary_call")


def first_append_floor(
    costs: dict[str, dict[str, float]],
    k: int,
    r: int,
    py: dict[str, Any],
    go: dict[str, Any],
    cpus: int,
) -> dict[str, Any]:
    """What the gRPC calls of a first append cost on bare `grpc.aio` (no broker code at all),
    and the rate that allows at best beside Gazette's.

    A first append through broker 1 makes, at the least: the client's Append call, served by
    broker 1; for the journals broker 1 is not primary of (1 - 1/K), a call from broker 1 to
    the primary; and a call from the primary to each of its R - 1 peers. Each call is priced
    at its cheapest shape in grpc.aio, measured by `bench/grpc_call_cost.py` in this run:
    `append_call` (the served Append: server side) and `unary_call` (both sides) for the
    others, which pygazette makes as such on a route of two (`AppendWhole`,
    `ReplicateWhole`); Gazette's protocol opens a Replicate stream instead, dearer. Their sum
    is a floor no broker on Python's grpc.aio goes under. With the appending client's own
    CPU (measured in this run), it bounds the rate the machine's cores can carry (a kind
    bound: etcd, the disk and the kernel's share of loopback traffic are left out).
    `pygazette_above_floor_ms` is then what pygazette's own code costs a first append.
    """

    def us(shape: str, side: str) -> float:
        return costs[shape][f"{side}_cpu_us"]

    def both(shape: str) -> float:
        return us(shape, "client") + us(shape, "server")

    parts = {
        "client_append_call_served_us": us("append_call", "server"),
        "proxy_unary_call_us": round((1 - 1 / k) * both("unary_call"), 1),
        "replicate_calls_us": round((r - 1) * both("unary_call"), 1),
    }
    floor_ms = sum(parts.values()) / 1000
    py_first, go_first = py["first_append"], go["first_append"]
    # The same client code in both runs; the lower of its two costs (the kinder ceiling).
    client_ms = min(py_first["client_cpu_ms_per_append"], go_first["client_cpu_ms_per_append"])
    ceiling = cpus * 1000 / (floor_ms + client_ms)
    return {
        "grpc_call_costs_us": costs,
        "floor_parts_us": parts,
        "broker_cpu_floor_ms_per_append": round(floor_ms, 3),
        "broker_cpu_ms_per_append": {
            "pygazette": py_first["broker_cpu_ms_per_append"],
            "gazette": go_first["broker_cpu_ms_per_append"],
        },
        "pygazette_above_floor_ms": round(py_first["broker_cpu_ms_per_append"] - floor_ms, 3),
        "floor_vs_gazette_broker_cpu": ratio(floor_ms, go_first["broker_cpu_ms_per_append"]),
        "client_cpu_ms_per_append": client_ms,
        "rate_ceiling_per_s": round(ceiling, 1),
        "rate_ceiling_vs_gazette": ratio(ceiling, go_first["per_s"]),
        "reads": "rate_ceiling_vs_gazette is the best first_append_per_s ratio a broker whose "
        "only cost were grpc.aio's calls could reach on this machine's cores; "
        "pygazette_above_floor_ms is what pygazette's own code adds to each first append",
    }


def failures(result: dict[str, Any]) -> list[str]:
    """What a correctness run must not see."""
    bad = []
    if result.get("converged_after_apply_s") is None:
        bad.append(f"{result['converged_journals']}/{result['journals']} journals converged")
    listed = result.get("list", {}).get("journals_listed")
    if listed is not None and listed != [result["journals"]]:
        bad.append(f"full Lists showed {listed} journals of {result['journals']}")
    if "first_append" in result and result["first_append"]["errors"]:
        bad.append(f"first appends failed: {result['first_append']['error_kinds']}")
    if "second_append" in result and result["second_append"]["errors"]:
        bad.append(f"second appends failed: {result['second_append']['error_kinds']}")
    if "quiet_append" in result and result["quiet_append"]["errors"]:
        bad.append(f"appends after a quiet spell failed: {result['quiet_append']['error_kinds']}")
    shards = result.get("shards")
    if shards and shards.get("converged_after_apply_s") is None:
        bad.append(f"{shards['primaries']}/{shards['shards']} shards have a primary")
    restart = result.get("restart")
    if restart and restart.get("appends_through_it_s") is None:
        bad.append("appends through the restarted broker kept failing")
    return bad


@contextmanager
def py_spy(cluster: Cluster, into: Path | None, phase: str) -> Iterator[None]:
    """With `--py-spy DIR`: sample each pygazette broker through the phase
    DIR/<phase>-<broker>.txt (collapsed stacks) (py-spy must be installed, with ptrace allowed)."""
    if into is None or cluster.system != "pygazette":
        yield
        return
    with sampled([p for p in cluster.pids() if p is not None], into, phase, "broker"):
        yield


@contextmanager
def sampled(pids: list[int], into: Path | None, phase: str, kind: str) -> Iterator[None]:
    """py-spy samples of `pids` through the block: DIR/<phase>-<kind>-<i>.txt."""
    if into is None:
        yield
        return
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    into.mkdir(parents=True, exist_ok=True)
    native = os.environ.get("PYGAZETTE_PY_SPY_NATIVE") == "1"
    recorders = [
        subprocess.Popen(
            [
                binary,
                "record",
                # PYGAZETTE_PY_SPY_NATIVE=1: C frames too (the garbage collector's among
                # them); py-spy then pauses the process for each sample.
                *(["--native"] if native else ["--nonblocking"]),
                "-r",
                "50",
                "-p",
                str(pid),
                "-f",
                "raw",
                "-o",
                str(into / f"{phase}-{kind}-{i:02d}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, pid in enumerate(pids)
    ]
    try:
        yield
    finally:
        for rec in recorders:
            rec.send_signal(signal.SIGINT)
        for rec in recorders:
            try:
                rec.wait(60)
            except subprocess.TimeoutExpired:
                rec.kill()


@contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="pygazette-scale-"))
    try:
        yield tmp
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    binaries = gazette_binaries()
    results: dict[str, Any] = {}
    with workdir(args.keep) as tmp:
        for system in args.systems:
            results[system] = await run_system(
                system,
                args,
                tmp / system,
                binaries.etcd,
                binaries.gazette if system == "gazette" else None,
            )
            # As each system finishes (a long run's figures survive its interruption).
            print(json.dumps({system: results[system]}), file=sys.stderr, flush=True)
    report: dict[str, Any] = {
        "benchmark": "scale",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "baseline": f"Gazette broker ({GAZETTE_VERSION}) on etcd 3.6, same run, same workload",
        "workload": {
            "brokers": args.brokers,
            "journals": args.journals,
            "replication": args.replication,
            "apply_txn_size": TXN_SIZE,
            "append_concurrency": APPEND_CONCURRENCY,
        },
        "targets": TARGETS,
        "systems": results,
    }
    if "pygazette" in results and "gazette" in results:
        py, go = results["pygazette"], results["gazette"]
        report["pygazette_vs_gazette"] = compare(py, go)
        if args.floor and "first_append" in py and "first_append" in go:
            costs = grpc_call_cost.medians(
                grpc_call_cost.call_costs(FLOOR_SHAPES, FLOOR_COUNT, FLOOR_ROUNDS)
            )
            report["first_append_floor"] = first_append_floor(
                costs, args.brokers, args.replication, py, go, os.cpu_count() or 1
            )
    report["failures"] = {s: failures(r) for s, r in results.items()}
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-K", "--brokers", type=int, default=6)
    parser.add_argument("-N", "--journals", type=int, default=1000)
    parser.add_argument("-R", "--replication", type=int, default=2)
    parser.add_argument("--shards", type=int, default=0, help="shards across 4 consumers")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument(
        "--shards-only",
        action="store_true",
        help="pygazette only: apply the journals, then straight to the shards phase",
    )
    parser.add_argument("--idle", type=float, default=30.0, help="idle window, seconds")
    parser.add_argument(
        "--steady-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="a second idle window of S seconds, once the second appends' work is done",
    )
    parser.add_argument(
        "--steady-after",
        type=float,
        default=80.0,
        metavar="S",
        help="the steady idle window starts S seconds after the second appends ended",
    )
    parser.add_argument(
        "--quiet-append",
        action="store_true",
        help="a third append to each journal, --quiet-after seconds after the second appends",
    )
    parser.add_argument(
        "--quiet-after",
        type=float,
        default=75.0,
        metavar="S",
        help="past pygazette's idle pipelines closing (60 s idle, found by a 10 s sweep)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per wait, seconds")
    parser.add_argument(
        "--systems", nargs="+", default=["pygazette", "gazette"], choices=["pygazette", "gazette"]
    )
    parser.add_argument("--no-restart", dest="restart", action="store_false")
    parser.add_argument("--no-moves", dest="moves", action="store_false")
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip pricing a first append's gRPC calls on bare grpc.aio (about a minute)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="K=3, N=300, 5 s idle: a run of a minute or two"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="correctness only: exit 1 on any failure"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="collapsed stacks of pygazette's brokers through apply, the first and second "
        "appends and the idle window, and of its consumers through the shards phase",
    )
    args = parser.parse_args(argv)
    if args.shards_only:
        if not args.shards:
            parser.error("--shards-only needs --shards M")
        args.systems = ["pygazette"]
    if args.quick:
        args.brokers, args.journals, args.idle = 3, 300, 5.0
    if args.brokers < args.replication or args.brokers < 2:
        parser.error("need at least 2 brokers, and at least R")
    if args.journals < 1:
        parser.error("-N must be at least 1")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = asyncio.run(main(arguments))
    print(json.dumps(report, indent=2))
    if arguments.smoke and any(report["failures"].values()):
        sys.exit(1)
