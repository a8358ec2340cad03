"""`pygazette journals reset-head` (as `gazctl journals reset-head`): after a journal lost
every broker that took part in its last appends, its new broker refuses appends
(INDEX_HAS_GREATER_OFFSET) until reset-head moves its head to the end of its fragments; on a
consistent journal it changes nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cli.test_journals_cli import cli, ok, one_line_error
from tests.support.broker_process import BrokerProcess
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.timeout(180)

JOURNAL = "reset/j"
SPECS = json.dumps(
    {
        "name": JOURNAL,
        "replication": 1,
        "fragment": {
            "length": 1 << 20,
            "compression_codec": "NONE",
            "stores": ["file:///"],
            "refresh_interval": "1s",
        },
    }
).encode()


def _broker(tmp: Path, etcd: EtcdProcess, root: str, name: str) -> BrokerProcess:
    return BrokerProcess(
        tmp / name / "data",
        extra_args=[
            *etcd.client_flags,
            *("--etcd-prefix", root, "--id", name, "--lease-ttl", "2s"),
            *("--file-root", str(tmp / "store")),
        ],
    )


def _until_appended(url: str, data: bytes) -> None:
    """Append `data`, again while the journal has no broker yet (its old one's lease is
    expiring); fail on any other error."""
    deadline = time.monotonic() + 60
    while True:
        proc = cli(url, "journals", "append", "-l", f"name={JOURNAL}", stdin=data)
        err = proc.stderr.decode()
        if proc.returncode == 0:
            return
        assert "INDEX_HAS_GREATER_OFFSET" not in err and time.monotonic() < deadline, err
        time.sleep(0.2)


def test_reset_head_after_losing_every_broker_of_a_journal(
    tmp_path: Path, etcd: EtcdProcess, etcd_root: str
) -> None:
    (tmp_path / "store").mkdir()
    first = _broker(tmp_path, etcd, etcd_root, "broker-a")
    first.data_dir.parent.mkdir(parents=True)
    first.start()
    try:
        ok(cli(first.url, "journals", "apply", "--specs", "-", stdin=SPECS))
        _until_appended(first.url, b"abc\n")
        # The second append rolls the first's spool: [0, 4) is persisted, [4, 8) only spooled.
        _until_appended(first.url, b"def\n")
        store = tmp_path / "store" / JOURNAL
        deadline = time.monotonic() + 30
        while not any(p.name.startswith(f"{0:016x}-{4:016x}-") for p in store.glob("*")):
            assert time.monotonic() < deadline, list(store.glob("*"))
            time.sleep(0.1)
    finally:
        first.kill()  # Its spool, with [4, 8), is lost with it.

    second = _broker(tmp_path, etcd, etcd_root, "broker-b")
    second.data_dir.parent.mkdir(parents=True)
    second.start()
    try:
        refused = cli(second.url, "journals", "append", "-l", f"name={JOURNAL}", stdin=b"x\n")
        deadline = time.monotonic() + 60
        while "INDEX_HAS_GREATER_OFFSET" not in refused.stderr.decode():
            assert time.monotonic() < deadline, refused.stderr.decode()
            time.sleep(0.2)
            refused = cli(second.url, "journals", "append", "-l", f"name={JOURNAL}", stdin=b"x\n")
        one_line_error(refused)

        out = ok(cli(second.url, "journals", "reset-head", "-l", f"name={JOURNAL}"))
        assert out.decode() == f"{JOURNAL}\thead 4\n"
        ok(cli(second.url, "journals", "append", "-l", f"name={JOURNAL}", stdin=b"ghi\n"))
        read = ok(cli(second.url, "journals", "read", "-l", f"name={JOURNAL}"))
        assert read == b"abc\nghi\n"
        # Consistent now: nothing changes.
        out = ok(cli(second.url, "journals", "reset-head", "-l", f"name={JOURNAL}"))
        assert out.decode() == f"{JOURNAL}\thead 8\n"
        ok(cli(second.url, "journals", "append", "-l", f"name={JOURNAL}", stdin=b"jkl\n"))
        read = ok(cli(second.url, "journals", "read", "-l", f"name={JOURNAL}"))
        assert read == b"abc\nghi\njkl\n"
    finally:
        second.stop()
