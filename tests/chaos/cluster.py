"""The chaos suite's cluster: etcd, an S3 server behind a proxy, 4 brokers, 3 summers.

Every process is real and runs under one work directory:

- etcd (`tests.support.etcd_process`), restartable on its data directory and ports;
- moto_server (`tests.support.s3_server`) holding the fragment store, reached only through a
  `TcpProxy` that can cut it off (a store outage);
- 4 brokers (`tests.support.cluster`), each behind its own `PartitionProxy`, which it
  advertises: peers reach each other only through these proxies, so a broker can be cut off
  from its peers one way or both ways while clients still reach it;
- 3 stream-sum summer processes (`hot_standbys: 1`);
- two `TcpBalancer`s: the one address clients (consumers, chunkers, the driver) know for
  the brokers, and the one the chunkers know for the summers.

Journals are stream-sum's (examples/stream_sum/journalspace.yaml) at replication 3 on the S3
store, plus `chaos/ledger/part-NNN`, which the driver appends to and audits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from examples.stream_sum.messages import FINAL_SUMS_JOURNAL
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.layout import KeyLayout
from pygazette.protocol.pb import consumer_pb2 as cpb
from tests.support.balancer import TcpBalancer
from tests.support.cluster import Cluster, ClusterBroker
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess
from tests.support.partition_proxy import PartitionProxy
from tests.support.s3_server import S3Server, export_credentials, restore_environment
from tests.support.tcp_proxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]
STREAM_SUM = REPO / "examples" / "stream_sum"
SUMMER_APP = "examples.stream_sum.summer:Summer"
BROKER_ROOT = "/chaos/cluster"
CONSUMER_ROOT = "/chaos/stream-sum"
LEDGER_PREFIX = "chaos/ledger/"
LEDGER_JOURNALS = [f"{LEDGER_PREFIX}part-{i:03d}" for i in range(4)]
# Written once in SPARSE_PAUSE seconds, at replication 2: each append finds the journal's
# pipeline closed (idle a minute, found by a 10 s sweep) and replicates whole.
SPARSE_LEDGER_JOURNALS = [f"{LEDGER_PREFIX}sparse-{i:03d}" for i in range(2)]
SPARSE_PAUSE = 72.0
CHUNK_JOURNALS = [f"examples/stream-sum/chunks/part-{i:03d}" for i in range(4)]
RECOVERY_LOGS = [f"examples/stream-sum/recovery-logs/chunks-part-{i:03d}" for i in range(4)]
SHARDS = [f"chunks-part-{i:03d}" for i in range(4)]
ALL_JOURNALS = [
    *CHUNK_JOURNALS,
    FINAL_SUMS_JOURNAL,
    *RECOVERY_LOGS,
    *LEDGER_JOURNALS,
    *SPARSE_LEDGER_JOURNALS,
]
REPLICATION = 3

PRIMARY = cpb.ReplicaStatus.PRIMARY
STANDBY = cpb.ReplicaStatus.STANDBY


def journalspace(store: str) -> str:
    """stream-sum's journals at replication 3 on `store`."""
    text = (STREAM_SUM / "journalspace.yaml").read_text()
    for old, new in (
        ("replication: 1", f"replication: {REPLICATION}"),
        ("  - file:///", f"  - {store}"),
        ("length: 268435456", "length: 1048576"),
        ("flush_interval: 10m0s", "flush_interval: 1m0s"),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def ledger_journalspace(store: str) -> str:
    """The chaos driver's own journals, whose acknowledged appends it audits."""
    children = "".join(f"- name: {j}\n" for j in LEDGER_JOURNALS) + "".join(
        f"- name: {j}\n  replication: 2\n" for j in SPARSE_LEDGER_JOURNALS
    )
    return f"""name: {LEDGER_PREFIX}
replication: {REPLICATION}
labels:
- name: content-type
  value: application/octet-stream
fragment:
  length: 1048576
  compression_codec: SNAPPY
  stores:
  - {store}
  refresh_interval: 5s
  flush_interval: 1m0s
children:
{children}"""


class ChaosCluster:
    def __init__(self, work: Path, *, lease_ttl: float) -> None:
        self.work = work
        self.lease_ttl = lease_ttl
        ttl = f"{lease_ttl:g}s"
        self.etcd = EtcdProcess(work / "etcd")
        self.s3 = S3Server(work)
        self._saved_env: dict[str, str | None] = {}
        self.store_proxy: TcpProxy | None = None
        self.store = ""
        self.cluster = Cluster(
            work,
            self.etcd,
            BROKER_ROOT,
            lease_ttl=ttl,
            shared_store=False,
            broker_args=["--retention-interval", "0s"],
        )
        self.brokers: list[ClusterBroker] = [
            self.cluster.add(f"zone-{'ab'[i % 2]}", f"broker-{i}") for i in range(4)
        ]
        # Each broker's advertised proxy, which recognizes its peers by process. The proxies
        # and balancers learn their targets' ports once those started: a first start that
        # finds its port taken moves to another (tests/support/ports.py).
        self.proxies: dict[str, PartitionProxy] = {
            b.suffix: PartitionProxy(0, self.broker_pids) for b in self.brokers
        }
        for b in self.brokers:
            b.extra_args += ["--advertise", self.proxies[b.suffix].url]
        self.broker_lb = TcpBalancer([])
        self.consumers: list[ConsumerProcess] = []
        for i in range(3):
            self.consumers.append(
                ConsumerProcess(
                    work / f"summer-{i}",
                    app=SUMMER_APP,
                    broker=self.broker_lb.url,
                    etcd="",  # Set in start(), once etcd has started (and its port is known).
                    etcd_prefix=CONSUMER_ROOT,
                    member_id=f"summer-{i}",
                    extra_args=["--lease-ttl", ttl],
                    env={"PYGAZETTE_LOG_LEVEL": "info"},
                )
            )
        self.consumer_lb = TcpBalancer([])
        self._shard_ks: EtcdKeyspace | None = None

    def broker_pids(self) -> dict[str, int]:
        return {b.suffix: b.pid for b in self.brokers if b.running()}

    # Lifecycle.

    async def start(self) -> None:
        self._saved_env = export_credentials()
        self.etcd.start()
        await asyncio.to_thread(self.s3.start)
        bucket = self.s3.create_bucket()
        self.store_proxy = TcpProxy(self.s3.port)
        self.store = self.s3.store_url(bucket, "chaos", endpoint=self.store_proxy.endpoint)
        await asyncio.gather(*(asyncio.to_thread(b.start, 90.0) for b in self.brokers))
        for b in self.brokers:
            self.proxies[b.suffix].target_port = b.port
        self.broker_lb.targets = [b.port for b in self.brokers]
        for b in self.brokers:  # Wait until every broker has joined.
            await self.cluster.wait_for(lambda b=b: self.cluster.is_member(b), "joined", 90)
        for name, text in (
            ("journalspace.yaml", journalspace(self.store)),
            ("ledger.yaml", ledger_journalspace(self.store)),
        ):
            specs = self.work / name
            specs.write_text(text)
            await self.cli("journals", "apply", "--specs", str(specs))
        await self.wait_ready(within=120)
        for c in self.consumers:
            c.etcd = self.etcd.url
        await asyncio.gather(*(asyncio.to_thread(c.start, 90.0) for c in self.consumers))
        self.consumer_lb.targets = [c.port for c in self.consumers]
        await self.cli(
            "shards",
            "apply",
            "--specs",
            str(STREAM_SUM / "shards.yaml"),
            "--consumer",
            self.consumer_lb.url,
        )
        await self.wait_shards_ready(within=180)

    async def stop(self) -> None:
        if self._shard_ks is not None:
            with contextlib.suppress(Exception):
                await self._shard_ks.close()
        for c in self.consumers:
            with contextlib.suppress(Exception):
                c.thaw()
            with contextlib.suppress(Exception):
                c.kill()
        with contextlib.suppress(Exception):
            await self.cluster.close()  # Thaws and kills the brokers.
        for closable in (*self.proxies.values(), self.broker_lb, self.consumer_lb):
            with contextlib.suppress(Exception):
                closable.close()
        if self.store_proxy is not None:
            with contextlib.suppress(Exception):
                self.store_proxy.close()
        with contextlib.suppress(Exception):
            self.s3.stop()
        with contextlib.suppress(Exception):
            self.etcd.stop()
        restore_environment(self._saved_env)

    async def cli(self, *args: str) -> str:
        """`pygazette ARGS` against the broker balancer; its stdout."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            # The message framings register themselves on import; `shards apply` checks the
            # sources' content types against them (see the report: the lazy imports of
            # pygazette.message may leave JSON lines unregistered in the CLI).
            "import sys, pygazette.message.json_framing, pygazette.cli.main as m; "
            "sys.argv[0] = 'pygazette'; m.main()",
            "--broker",
            self.broker_lb.url,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=str(REPO),
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"pygazette {' '.join(args)}: {err.decode().strip()}")
        return out.decode()

    # Shards.

    async def shard_keyspace(self) -> EtcdKeyspace:
        if self._shard_ks is None:
            self._shard_ks = EtcdKeyspace(self.etcd.url, CONSUMER_ROOT)
            await self._shard_ks.open()
        return self._shard_ks

    async def shard_replicas(self) -> dict[str, list[tuple[int, str, int]]]:
        """shard -> [(slot, member id, status code)], as the keyspace holds them now."""
        ks = await self.shard_keyspace()
        layout = KeyLayout(CONSUMER_ROOT)
        out: dict[str, list[tuple[int, str, int]]] = {}
        for kv in ks.range(layout.assign_prefix):
            key = layout.parse_assignment_key(kv.key)
            status = cpb.ReplicaStatus()
            status.ParseFromString(kv.value)
            out.setdefault(key.item, []).append((key.slot, key.suffix, status.code))
        return out

    async def shards_ready(self, standbys: int = 1) -> bool:
        replicas = await self.shard_replicas()
        for shard in SHARDS:
            codes = [code for _, _, code in replicas.get(shard, [])]
            if codes.count(PRIMARY) != 1 or codes.count(STANDBY) < standbys:
                return False
        return True

    async def wait_shards_ready(self, within: float, standbys: int = 1) -> None:
        ks = await self.shard_keyspace()
        async with asyncio.timeout(within):
            while not await self.shards_ready(standbys):
                with contextlib.suppress(TimeoutError):
                    await ks.wait_for_change(ks.revision, 1.0)

    async def primary_of(self, shard: str) -> ConsumerProcess | None:
        for slot, member, code in (await self.shard_replicas()).get(shard, []):
            if slot == 0 and code == PRIMARY:
                for c in self.consumers:
                    if c.member_id == member and c.running():
                        return c
        return None

    def consumer(self, member_id: str) -> ConsumerProcess:
        return next(c for c in self.consumers if c.member_id == member_id)

    def logs(self, tail: int = 3000) -> str:
        parts = [f"--- broker {b.suffix}\n{b.log()[-tail:]}" for b in self.brokers]
        parts += [f"--- {c.member_id}\n{c.log()[-tail:]}" for c in self.consumers]
        return "\n".join(parts)

    def peers_of(self, suffix: str) -> frozenset[str]:
        return frozenset(b.suffix for b in self.brokers if b.suffix != suffix)

    def journals(self) -> Sequence[str]:
        return ALL_JOURNALS

    async def wait_ready(self, within: float) -> None:
        """Until every journal has its replication in consistent replicas."""
        dense = [j for j in ALL_JOURNALS if j not in SPARSE_LEDGER_JOURNALS]
        await self.cluster.wait_ready(dense, REPLICATION, within=within)
        await self.cluster.wait_ready(SPARSE_LEDGER_JOURNALS, 2, within=within)
