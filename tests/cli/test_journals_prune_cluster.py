"""`journals prune` in a cluster: any broker prunes every selected journal, those it holds
no replica of included (their broker does it, the request proxied there)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.retention_bytes import RETENTION_BYTES_LABEL
from tests.broker.fragment_helpers import wait_persisted
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.cli.test_journals_cli import cli, ok
from tests.support.broker_process import BrokerProcess
from tests.support.etcd_process import EtcdProcess, etcd_binary

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="etcd is not installed"),
    pytest.mark.timeout(240),
]

SIZE = 1025  # Each append overfills a 1 KiB fragment, which rolls and persists.
APPENDS = 3  # Persisted fragments [0, 1025) and [1025, 2050), at least.
JOURNALS = [f"pruned/j{i}" for i in range(4)]


async def _primaries(stub: pb_grpc.JournalStub, within: float = 60) -> dict[str, str]:
    """Each journal's primary broker (suffix), once every journal has one."""
    deadline = time.monotonic() + within
    while True:
        primaries = {
            j.spec.name: j.route.members[j.route.primary].suffix
            async for resp in stub.List(pb.ListRequest(selector=pb.LabelSelector()))
            for j in resp.journals
            if j.route.primary >= 0
        }
        if set(JOURNALS) <= set(primaries):
            return primaries
        if time.monotonic() > deadline:
            raise TimeoutError(f"journals without a primary: {primaries}")
        await asyncio.sleep(0.05)


async def test_prune_through_any_broker_prunes_journals_it_does_not_hold(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    brokers = [
        BrokerProcess(
            tmp_path / f"broker-{i}" / "data",
            extra_args=[
                *etcd.client_flags,
                "--etcd-prefix",
                etcd_root,
                "--id",
                f"pruner-{i}",
                "--file-root",
                str(store),
                "--retention-interval",
                "0s",
            ],
        )
        for i in range(2)
    ]
    for b in brokers:
        b.data_dir.parent.mkdir()
        b.start()
    try:
        async with grpc.aio.insecure_channel(brokers[0].address) as channel:
            stub = pb_grpc.JournalStub(channel)
            specs = [
                journal_spec(name, length=1024, labels={RETENTION_BYTES_LABEL: "1KiB"})
                for name in JOURNALS
            ]
            assert (await apply_specs(stub, *specs)).status == pb.OK
            primaries = await _primaries(stub)
            for name in JOURNALS:
                for i in range(APPENDS):
                    assert (await append(stub, name, bytes([65 + i]) * SIZE)).status == pb.OK
                # The last fragment may still be a spool: the first two are persisted.
                await wait_persisted(stub, name, 2 * SIZE)
        # Both brokers hold journals: pruning through one reaches the other's.
        assert set(primaries.values()) == {"pruner-0", "pruner-1"}, primaries

        out = ok(cli(brokers[0].url, "journals", "prune", "-l", "prefix=pruned/", "--dry-run"))
        # Persisted up to 2050 at least, bound 1024: the first fragment of each journal goes.
        text = out.decode()
        assert f"would remove {len(JOURNALS)} fragment(s)" in text, text
        assert all(f"{name}  0      1025" in text for name in JOURNALS), text
        out = ok(cli(brokers[0].url, "journals", "prune", "-l", "prefix=pruned/"))
        assert f"removed {len(JOURNALS)} fragment(s)" in out.decode(), out
        for name in JOURNALS:
            listed = json.loads(
                "["
                + ",".join(
                    ok(
                        cli(
                            brokers[1].url,
                            "journals",
                            "fragments",
                            "-l",
                            f"name={name}",
                            "-o",
                            "json",
                        )
                    )
                    .decode()
                    .split()
                )
                + "]"
            )
            assert listed[0]["spec"]["begin"] == SIZE, (name, listed)
    finally:
        for b in brokers:
            b.stop()
