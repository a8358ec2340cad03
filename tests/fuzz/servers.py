"""The processes the fuzz tests aim at: a `pygazette serve` cluster member (so Replicate is
served) on the session's etcd, and a `pygazette consumer serve` process, each with a journal
(and the consumer a shard) for hostile values to reach; plus their RSS and liveness."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import journal_spec
from tests.support.broker_process import BrokerProcess
from tests.support.cluster import Cluster
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess

JOURNAL = "fuzz/journal"


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Target:
    """A process under fuzz: its address and the RSS it had once warmed up."""

    proc: BrokerProcess
    baseline_rss: int = 0

    def check_alive(self) -> None:
        assert self.proc.running(), f"process died:\n{self.proc.log()}"


def start_broker(tmp: Path, etcd: EtcdProcess) -> tuple[Cluster, Target]:
    cluster = Cluster(
        tmp,
        etcd,
        f"/fuzz-{uuid.uuid4().hex[:12]}/gazette/cluster",
        broker_args=["--log-level", "warning", "--retention-interval", "0s"],
    )
    broker = cluster.add("zone-a", "fuzz-broker")
    broker.start(60.0)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.JournalStub(channel)
        spec = journal_spec(JOURNAL)
        assert (
            stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)])).status == 0
        )
        deadline = time.monotonic() + 60
        while True:  # Until the broker is the journal's primary: appends commit.
            resp = stub.Append(
                iter(
                    [
                        pb.AppendRequest(journal=JOURNAL),
                        pb.AppendRequest(content=b"warm\n"),
                        pb.AppendRequest(),
                    ]
                ),
                timeout=10,
            )
            if resp.status == pb.OK:
                break
            assert time.monotonic() < deadline, resp
            time.sleep(0.1)
    return cluster, Target(broker)


def start_consumer(tmp: Path, broker: BrokerProcess) -> Target:
    consumer = ConsumerProcess(
        tmp / "consumer",
        app="tests.consumer.apps:Counter",
        broker=broker.url,
        extra_args=["--log-level", "warning"],
    )
    consumer.start()
    return Target(consumer)
