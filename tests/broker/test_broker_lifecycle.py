"""A broker's lifecycle under failure: draining on SIGTERM while its membership fails."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pygazette.keyspace.layout import decode_broker_spec
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.broker.rpc_helpers import apply_specs, journal_spec
from tests.support.cluster import Cluster
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.slow


async def test_a_draining_broker_that_loses_its_lease_exits_at_once(tmp_path: Path) -> None:
    """SIGTERM starts a drain; etcd then goes away for good. The broker's lease lapses after
    its TTL (3 s here) and, as Gazette's, it must exit then (non-zero: it left the cluster
    without handing its journals over), not serve out the rest of its drain timeout."""
    own = EtcdProcess(tmp_path / "etcd")
    own.start()
    cluster = Cluster(tmp_path, own, "/lifecycle/gazette/cluster")
    draining = cluster.add("zone-a", "broker-a")
    draining.extra_args += ["--drain-timeout", "300s"]
    # No room elsewhere: the journal stays on the draining broker, whose drain goes on.
    cluster.add("zone-b", "broker-b").extra_args += ["--journal-limit", "0"]
    journal = "lifecycle/j"
    try:
        await cluster.start()
        spec = journal_spec(journal, replication=1)
        assert (await apply_specs(cluster.stub(draining), spec)).status == pb.OK
        await cluster.wait_ready([journal], 1)
        assert cluster.primary_of(journal) is draining

        assert draining.proc is not None
        draining.proc.send_signal(signal.SIGTERM)
        key = cluster.layout.member_key(draining.zone, draining.suffix)

        def exiting() -> bool:
            assert cluster.ks is not None
            kv = cluster.ks.get(key)
            return kv is not None and decode_broker_spec(cluster.layout, kv).exiting

        await cluster.wait_for(exiting, "the broker marks itself exiting")
        own.stop()  # etcd is gone: the lease can't be kept alive.
        lost_at = time.monotonic()
        try:
            code = await asyncio.to_thread(draining.wait_exit, 40.0)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still draining {time.monotonic() - lost_at:.0f} s after etcd went away\n"
                f"{draining.log()}"
            ) from None
        assert code != 0, draining.log()
        assert "lease" in draining.log()
    finally:
        await cluster.close()
        own.kill()
