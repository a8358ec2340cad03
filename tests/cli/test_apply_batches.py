"""`pygazette journals apply` of more changes than one etcd transaction holds: by default
in transactions a default etcd accepts (--max-txn-size, as gazctl's), with progress on
stderr; in one transaction (--max-txn-size 0) it fails with one clear line."""

from __future__ import annotations

import json

import pytest

from pygazette.keyspace.keyspace import MAX_TXN_OPS
from tests.cli.test_journals_cli import cli, listed_names, ok, one_line_error
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(180)

COUNT = 2 * MAX_TXN_OPS + 44  # Three default transactions; too many for one.


def journalspace(prefix: str, count: int) -> bytes:
    doc = {
        "name": prefix,
        "replication": 1,
        "fragment": {
            "length": 1 << 20,
            "compression_codec": "NONE",
            "stores": ["file:///"],
            "refresh_interval": "1m",
        },
        "children": [{"name": f"{prefix}j-{i:04d}"} for i in range(count)],
    }
    return json.dumps(doc).encode()  # JSON is YAML.


def test_apply_splits_into_transactions_a_default_etcd_accepts(
    etcd_broker: BrokerProcess,
) -> None:
    specs = journalspace("many/", COUNT)

    whole = cli(
        etcd_broker.url, "journals", "apply", "--specs", "-", "--max-txn-size", "0", stdin=specs
    )
    line = one_line_error(whole)
    assert "too many operations" in line and "--max-txn-size" in line, line
    assert listed_names(etcd_broker, "prefix=many/") == []

    done = cli(etcd_broker.url, "journals", "apply", "--specs", "-", stdin=specs)
    assert ok(done).decode().startswith(f"applied {COUNT} journal change(s) at revision ")
    progress = done.stderr.decode().splitlines()
    assert progress and progress[-1].startswith(
        f"applied {COUNT}/{COUNT} journal changes in 3 transaction(s) "
    ), progress
    names = listed_names(etcd_broker, "prefix=many/")
    assert names == [f"many/j-{i:04d}" for i in range(COUNT)]

    # Batches of a chosen size; one transaction prints no progress.
    more = journalspace("more/", 50)
    assert cli(etcd_broker.url, "journals", "apply", "--specs", "-", stdin=more).stderr == b""
    again = cli(
        etcd_broker.url,
        "journals",
        "apply",
        "--specs",
        "-",
        "--max-txn-size",
        "7",
        stdin=journalspace("again/", 50),
    )
    ok(again)
    assert b"applied 50/50 journal changes in 8 transaction(s)" in again.stderr
    assert len(listed_names(etcd_broker, "prefix=again/")) == 50


def test_a_failed_batch_says_what_stays_applied(etcd_broker: BrokerProcess) -> None:
    def specs(names: list[str]) -> bytes:
        doc = json.loads(journalspace("half/", 0))
        doc["children"] = [{"name": f"half/{name}"} for name in names]
        return json.dumps(doc).encode()

    ok(cli(etcd_broker.url, "journals", "apply", "--specs", "-", stdin=specs(["z"])))
    # The second transaction creates half/z (revision 0) again: it exists.
    failed = cli(
        etcd_broker.url,
        "journals",
        "apply",
        "--specs",
        "-",
        "--max-txn-size",
        "3",
        stdin=specs(["a", "b", "c", "z"]),
    )
    assert failed.returncode != 0
    line = failed.stderr.decode().splitlines()[-1]  # After any progress lines.
    assert (
        line.startswith("error: ")
        and "ETCD_TRANSACTION_FAILED" in line
        and "the 3 change(s) before it stay applied" in line
    )
    assert listed_names(etcd_broker, "prefix=half/") == ["half/a", "half/b", "half/c", "half/z"]


def test_a_batch_failing_in_transport_says_what_stays_applied() -> None:
    """A later batch that fails as an RPC (a broker gone, a bad response) rather than with
    a status still says that the transactions before it are applied."""
    from pygazette.protocol.pb import protocol_pb2 as pb
    from tests.client.fake_broker import FakeBroker, header

    fake = FakeBroker()
    try:
        # The first transaction applies; the second RPC fails (nothing more is scripted).
        fake.journal.apply_responses.append(pb.ApplyResponse(status=pb.OK, header=header()))
        doc = json.loads(journalspace("fake/", 4))
        failed = cli(
            f"http://{fake.address}",
            "journals",
            "apply",
            "--specs",
            "-",
            "--max-txn-size",
            "3",
            stdin=json.dumps(doc).encode(),
        )
    finally:
        fake.stop()
    line = failed.stderr.decode().splitlines()[-1]
    assert failed.returncode != 0 and line.startswith("error: "), failed.stderr
    assert "the 3 change(s) before it stay applied" in line, line
