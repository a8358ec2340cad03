"""Size-bounded retention against a real broker process: `journals prune --dry-run` shows it,
`journals prune` and the broker's retention loop apply it, and Apply rejects a bad label."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.retention_bytes import RETENTION_BYTES_LABEL
from tests.broker.fragment_helpers import wait_persisted
from tests.broker.rpc_helpers import append, apply_specs, journal_spec, read_all
from tests.cli.test_journals_cli import cli, ok, one_line_error
from tests.support.broker_process import BrokerProcess

SIZE = 1025  # Each append overfills a 1 KiB fragment, which rolls and persists.
APPENDS = 8


def _bounded(name: str, bound: str) -> pb.JournalSpec:
    return journal_spec(name, length=1024, labels={RETENTION_BYTES_LABEL: bound})


async def _fill(stub: pb_grpc.JournalStub, name: str) -> None:
    for i in range(APPENDS):
        assert (await append(stub, name, bytes([65 + i]) * SIZE)).status == pb.OK
    await wait_persisted(stub, name, APPENDS * SIZE)


def _stored(root: Path, name: str) -> list[str]:
    return sorted(p.name for p in (root / name).iterdir() if not p.name.startswith("."))


async def test_prune_dry_run_then_prune(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=["--retention-interval", "0s"])
    broker.start()
    try:
        name, unbounded = "bounded/a", "bounded/unbounded"
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            spec = _bounded(name, "3KiB")
            assert (await apply_specs(stub, spec, journal_spec(unbounded, length=1024))).status == 0
            await _fill(stub, name)
            await _fill(stub, unbounded)
        root = broker.file_root
        files = _stored(root, name)
        assert len(files) == APPENDS
        # Head 8200, bound 3072: fragments beginning before 5128 go, 2050 bytes stay.
        out = ok(cli(broker.url, "journals", "prune", "-l", "prefix=bounded/", "--dry-run"))
        text = out.decode()
        assert "would remove 6 fragment(s) (6.0 KiB of journal content) of 2 journal(s)" in text
        for f in files[:6]:
            assert f in text
        assert _stored(root, name) == files

        assert "removed 6 fragment(s)" in ok(
            cli(broker.url, "journals", "prune", "-l", "prefix=bounded/")
        ).decode()
        assert _stored(root, name) == files[6:]
        assert len(_stored(root, unbounded)) == APPENDS

        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            content, meta = await read_all(stub, name)
            assert meta[0].offset == 6 * SIZE  # Readers from 0 jump to the kept history.
            assert content == b"G" * SIZE + b"H" * SIZE
            resp = await append(stub, name, b"I")  # The write head did not move.
            assert resp.commit.begin == APPENDS * SIZE
    finally:
        broker.stop()


async def test_retention_loop_applies_the_bound(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=["--retention-interval", "1s"])
    broker.start()
    try:
        name = "bounded/loop"
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            # The loop may prune while the fills persist: the bound holds at every pass.
            assert (await apply_specs(stub, _bounded(name, "2050"))).status == pb.OK
            for i in range(APPENDS):
                assert (await append(stub, name, bytes([65 + i]) * SIZE)).status == pb.OK
            # Once every fill persisted and a pass ran, the last two fragments are left. The
            # store holds two files on the way too (the first two persisted, the rest still
            # queued, no pass since): wait for those two, not for any two.
            kept_from = f"{6 * SIZE:016x}-"
            deadline = time.monotonic() + 60
            while not (
                len(files := _stored(broker.file_root, name)) == 2
                and files[0].startswith(kept_from)
            ):
                assert time.monotonic() < deadline, files
                await asyncio.sleep(0.1)
            content, _meta = await read_all(stub, name)
            assert content == b"G" * SIZE + b"H" * SIZE
    finally:
        broker.stop()


@pytest.mark.parametrize("bad", ["lots", "0", "1.5GiB", "10mb"])
async def test_apply_rejects_a_bad_bound(tmp_path: Path, bad: str) -> None:
    broker = BrokerProcess(tmp_path / "data", extra_args=["--retention-interval", "0s"])
    broker.start()
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await apply_specs(stub, _bounded("bounded/bad", bad))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert RETENTION_BYTES_LABEL in (raised.value.details() or "")
        specs = tmp_path / "specs.yaml"
        specs.write_text(
            "name: bounded/bad\nreplication: 1\n"
            f"labels:\n- name: {RETENTION_BYTES_LABEL}\n  value: {bad!r}\n"
            "fragment:\n  length: 1024\n  compression_codec: NONE\n  refresh_interval: 60s\n"
            "  stores: [file:///]\n"
        )
        line = one_line_error(cli(broker.url, "journals", "apply", "--specs", str(specs)))
        assert RETENTION_BYTES_LABEL in line and "bounded/bad" in line
    finally:
        broker.stop()


async def test_pruning_a_journal_leaves_a_journal_nested_under_its_name_alone(
    tmp_path: Path,
) -> None:
    """A store lists `nest/a/b`'s fragments under `nest/a/`, where they parse as `nest/a`'s
    with the postfix `b`: neither reads of `nest/a` nor pruning it take them for its own."""
    broker = BrokerProcess(tmp_path / "data", extra_args=["--retention-interval", "0s"])
    broker.start()
    try:
        outer, inner = "nest/a", "nest/a/b"
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            spec = _bounded(outer, "3KiB")
            assert (await apply_specs(stub, spec, journal_spec(inner, length=1024))).status == 0
            for i in range(APPENDS):  # Other bytes than the outer journal's.
                assert (await append(stub, inner, bytes([97 + i]) * SIZE)).status == pb.OK
            await wait_persisted(stub, inner, APPENDS * SIZE)
            await _fill(stub, outer)
        # Restarted, the broker lists `nest/a`'s stores afresh, `nest/a/b`'s files among them.
        broker.stop()
        broker.start()
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            content, _meta = await read_all(stub, outer)
            assert content == b"".join(bytes([65 + i]) * SIZE for i in range(APPENDS))
            frags = await stub.ListFragments(pb.FragmentsRequest(journal=outer))
            assert [f.spec.path_postfix for f in frags.fragments] == [""] * APPENDS
        root = broker.file_root
        inner_files = [p.name for p in (root / inner).iterdir() if p.is_file()]
        assert len(inner_files) == APPENDS
        assert "removed 6 fragment(s)" in ok(
            cli(broker.url, "journals", "prune", "-l", f"name={outer}")
        ).decode()
        assert sorted(p.name for p in (root / inner).iterdir() if p.is_file()) == sorted(
            inner_files
        )
        assert len([p for p in (root / outer).iterdir() if p.is_file()]) == 2
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            content, _meta = await read_all(stub, inner)
            assert len(content) == APPENDS * SIZE
    finally:
        broker.stop()
