"""`pygazette journals suspend` (as `gazctl journals suspend`) against a broker on etcd:
idle journals are suspended, journals in use only with --force, and those fully suspended
already are left out; an append resumes a journal."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_journals_cli import cli, ok, one_line_error
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(180)

SPECS = json.dumps(
    {
        "name": "susp/",
        "replication": 1,
        "fragment": {
            "length": 1 << 20,
            "compression_codec": "NONE",
            "stores": ["file:///"],
            "refresh_interval": "1m",
        },
        "children": [{"name": "susp/busy"}, {"name": "susp/empty"}],
    }
).encode()


def suspension(broker: BrokerProcess) -> dict[str, tuple[str, int]]:
    out = ok(cli(broker.url, "journals", "list", "-l", "prefix=susp/", "--format", "json"))
    found = {}
    for j in json.loads(out)["journals"]:
        s = j["spec"].get("suspend") or {}  # null when unset, as gazctl writes it
        found[j["spec"]["name"]] = (s.get("level", "NONE"), int(s.get("offset", 0)))
    return found


def test_suspend_idle_journals_then_forced_then_resumed(etcd_broker: BrokerProcess) -> None:
    ok(cli(etcd_broker.url, "journals", "apply", "--specs", "-", stdin=SPECS))
    ok(cli(etcd_broker.url, "journals", "append", "-l", "name=susp/busy", stdin=b"busy\n"))

    out = ok(cli(etcd_broker.url, "journals", "suspend", "-l", "prefix=susp/")).decode()
    assert sorted(out.splitlines()) == [
        "susp/busy\tin use: not suspended",
        "susp/empty\tsuspended",
    ]
    assert suspension(etcd_broker) == {"susp/busy": ("NONE", 0), "susp/empty": ("FULL", 0)}

    # --force suspends the journal in use; the one fully suspended is left out.
    out = ok(cli(etcd_broker.url, "journals", "suspend", "-l", "prefix=susp/", "-f")).decode()
    assert out.splitlines() == ["susp/busy\tsuspended"]
    assert suspension(etcd_broker) == {"susp/busy": ("PARTIAL", 5), "susp/empty": ("FULL", 0)}

    # An append resumes it where it was; what it held is still read.
    ok(cli(etcd_broker.url, "journals", "append", "-l", "name=susp/busy", stdin=b"more\n"))
    assert suspension(etcd_broker)["susp/busy"] == ("NONE", 5)
    read = ok(cli(etcd_broker.url, "journals", "read", "-l", "name=susp/busy"))
    assert read == b"busy\nmore\n"


def test_suspend_of_no_journal_named(etcd_broker: BrokerProcess) -> None:
    line = one_line_error(cli(etcd_broker.url, "journals", "suspend", "-l", "name=susp/none"))
    assert "susp/none" in line


def test_suspend_on_a_single_broker_leaves_every_journal_in_use(broker: BrokerProcess) -> None:
    # Without etcd there is nothing to give up: every journal is left in use, a read-only one
    # too (an empty append to it is a barrier, as Gazette's, not refused).
    specs = json.loads(SPECS)
    specs["children"].append({"name": "susp/readonly", "flags": 1})  # O_RDONLY
    ok(cli(broker.url, "journals", "apply", "--specs", "-", stdin=json.dumps(specs).encode()))
    out = ok(cli(broker.url, "journals", "suspend", "-l", "prefix=susp/")).decode()
    assert sorted(out.splitlines()) == [
        "susp/busy\tin use: not suspended",
        "susp/empty\tin use: not suspended",
        "susp/readonly\tin use: not suspended",
    ]


def test_an_unframed_append_resumes_a_fully_suspended_journal(
    etcd_broker: BrokerProcess,
) -> None:
    """A fully suspended journal has no broker: its first append is refused
    (NO_JOURNAL_PRIMARY_BROKER) while the broker resumes it, before any content commits. The
    append (stdin, --framing none) is sent again once a primary serves it, as a framed one's
    already is; it failed with that status (gazctl's too)."""
    ok(cli(etcd_broker.url, "journals", "apply", "--specs", "-", stdin=SPECS))
    ok(cli(etcd_broker.url, "journals", "suspend", "-l", "name=susp/empty"))
    assert suspension(etcd_broker)["susp/empty"] == ("FULL", 0)

    content = b"".join(b"line %06d\n" % i for i in range(20_000))  # 220 KB: several chunks.
    ok(cli(etcd_broker.url, "journals", "append", "-l", "name=susp/empty", stdin=content))
    assert suspension(etcd_broker)["susp/empty"] == ("NONE", 0)
    assert ok(cli(etcd_broker.url, "journals", "read", "-l", "name=susp/empty")) == content


def test_prune_leaves_fully_suspended_journals_out(etcd_broker: BrokerProcess) -> None:
    """No broker serves a fully suspended journal: prune notes it (one line for all) on
    stderr and prunes the others, instead of failing the whole command (SUSPENDED;
    JOURNAL_NOT_FOUND before, as gazctl's prune fails 'failed to fetch fragments'
    SUSPENDED)."""
    ok(cli(etcd_broker.url, "journals", "apply", "--specs", "-", stdin=SPECS))
    ok(cli(etcd_broker.url, "journals", "append", "-l", "name=susp/busy", stdin=b"busy\n"))
    ok(cli(etcd_broker.url, "journals", "suspend", "-l", "name=susp/empty"))
    for args in (["--dry-run"], []):
        proc = cli(etcd_broker.url, "journals", "prune", "-l", "prefix=susp/", *args)
        out = ok(proc).decode()
        assert "0 fragment(s) (0 B of journal content) of 1 journal(s)" in out, out
        assert proc.stderr.decode() == (
            "left out 1 fully suspended journal(s), which no broker serves until an append "
            "resumes them: susp/empty\n"
        )
