"""`pygazette consumer serve` raises its open-file soft limit to the hard limit, as Go's
runtime does for Gazette's consumers: playing a recovery log holds a file open for every live
file of the store until playback completes (as Gazette's player does), and a store of many
files (RocksDB's tables) passes the usual soft limit of 1,024."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import pytest

from pygazette.client import JournalClient
from pygazette.consumer.recoverylog import Author, Player, Recorder
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.broker.test_fd_limit import open_files_limits
from tests.consumer.test_consumer_cluster import (
    LOGS,
    PREFIX,
    SHARD,
    Group,
    shard_spec,
)
from tests.consumer.test_consumer_cluster import (  # Fixtures: etcd, the Counter group.
    etcd as etcd,
)
from tests.consumer.test_consumer_cluster import group as group
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import etcd_binary

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(120),
]

SOFT_LIMIT = 128
FILES = 300  # Live files in the recovery log: more than SOFT_LIMIT.


class LowLimitConsumer(ConsumerProcess):
    """A consumer process started with a soft open-file limit of SOFT_LIMIT."""

    def command(self, port: int) -> list[str]:
        cmd = super().command(port)
        assert cmd[:3] == [sys.executable, "-m", "pygazette.cli.main"]
        lower = (
            "import os, resource, sys; "
            "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({SOFT_LIMIT}, hard)); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
        )
        return [sys.executable, "-c", lower, *cmd[1:]]


async def record_files(client: JournalClient, log: str, directory: Path, n: int) -> None:
    """Record `n` small files into the recovery log `log`."""
    author = Author.random()
    player = Player(client, rpb.FSMHints(log=log), directory)
    player.inject_handoff(author)
    rec = Recorder(client, await player.play(), author, directory)
    for i in range(n):
        fnode = rec.record_create(f"table-{i:04d}.sst")
        rec.record_write(fnode, 0, f"content of table {i}".encode())
        if i % 50 == 49:
            await rec.commit()
    await rec.commit()


async def test_a_store_of_more_files_than_the_soft_limit_recovers(
    group: Group, tmp_path: Path
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * FILES:
        pytest.skip(f"the hard open-file limit ({hard}) is too low for this test")
    async with JournalClient(group.broker.url) as client:
        await record_files(client, f"{LOGS}/{SHARD}", tmp_path / "recorded", FILES)
    proc = LowLimitConsumer(
        tmp_path / "consumer",
        app="tests.consumer.apps:Counter",
        broker=group.broker.url,
        etcd=group.etcd.url,
        etcd_prefix=PREFIX,
        member_id="member-0",
        extra_args=["--lease-ttl", "3s"],
    )
    group.consumers.append(proc)
    proc.start()
    wanted = str(SOFT_LIMIT) if hard == resource.RLIM_INFINITY else str(hard)
    assert open_files_limits(proc.pid)[0] == wanted
    await group.apply(shard_spec(standbys=0))
    # The shard plays its log (every file held open until playback completes) and serves.
    await group.wait_primary()
    played = proc.data_dir / "shards"
    assert len(list(played.glob("*/table-*.sst"))) == FILES
