"""The real `pygazette shards ...` CLI, as a subprocess, against a real broker and a real
consumer process (`pygazette consumer serve` running the Counter app of tests/consumer/apps.py,
on a real etcd).

One broker and one consumer serve the whole module; each test works under journals and
shard IDs of its own. `Deployment` is where the processes come from: pointing it at other
processes (an etcd-backed consumer group, a Gazette consumer) needs no change to the tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from pygazette.cli.shardspace import flatten, parse_shardspace
from pygazette.client.appender import append
from pygazette.client.fragments import list_all_fragments
from pygazette.client.journal_client import JournalClient
from pygazette.consumer.shard_client import ShardClient
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.etcd_process import EtcdProcess

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
APP = "tests.consumer.apps:Counter"
OUTPUT = "cli-shards/out"
POISON = "poison"  # Counter fails on messages of this key (COUNTER_FAIL_ON).


class Deployment:
    """A broker and a consumer process, and the CLI pointed at them."""

    def __init__(self, broker: BrokerProcess, consumer: ConsumerProcess) -> None:
        self.broker = broker
        self.consumer = consumer

    @property
    def broker_url(self) -> str:
        return self.broker.url

    @property
    def consumer_url(self) -> str:
        return self.consumer.url

    def cli(
        self,
        *args: str,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        full_env = dict(
            os.environ, BROKER_ADDRESS=self.broker_url, CONSUMER_ADDRESS=self.consumer_url
        )
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), full_env.get("PYTHONPATH")])
        )
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "pygazette.cli.main", *args],
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            env=full_env,
            cwd=REPO,
            timeout=timeout,
        )

    # In-process clients, for setting up and waiting on conditions.

    def run(self, fn: Callable[[JournalClient, ShardClient], Any]) -> Any:
        async def go() -> Any:
            async with (
                JournalClient(self.broker_url) as journals,
                ShardClient(self.consumer_url) as shards,
            ):
                return await fn(journals, shards)

        return asyncio.run(go())


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProcess) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("shards-cli")
    broker = BrokerProcess(tmp / "broker")
    broker.start()
    consumer = ConsumerProcess(
        tmp / "consumer",
        app=APP,
        broker=broker.url,
        etcd=etcd.url,
        etcd_prefix=f"/test-{uuid.uuid4().hex[:12]}/consumers/counter",
        extra_args=["--hints-interval", "1s"],
        env={"COUNTER_OUTPUT": OUTPUT, "COUNTER_FAIL_ON": POISON},
    )
    try:
        consumer.start()
        dep = Deployment(broker, consumer)
        ok(
            dep.cli(
                "journals", "apply", "--specs", "-", stdin=journalspace("cli-shards/", [OUTPUT])
            )
        )
        yield dep
    finally:
        consumer.kill()
        broker.kill()


@pytest.fixture
def prefix() -> str:
    """Journals and shards of this test live under their own prefix."""
    return f"t{uuid.uuid4().hex[:8]}"


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The failure's stderr, which must be exactly one `error: ...` line."""
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def journalspace(
    directory: str,
    sources: list[str],
    recovery_logs: list[str] = (),  # type: ignore[assignment]
    *,
    content_type: str = "application/x-ndjson",
    fragment_length: int = 1 << 20,
) -> str:
    children = [{"name": s} for s in sources] + [
        {
            "name": log,
            "labels": [{"name": "content-type", "value": "application/x-gazette-recoverylog"}],
        }
        for log in recovery_logs
    ]
    doc = {
        "name": directory,
        "replication": 1,
        "labels": [{"name": "content-type", "value": content_type}],
        "fragment": {
            "length": fragment_length,
            "compression_codec": "NONE",
            "stores": ["file:///"],
            "refresh_interval": "1s",
        },
        "children": children,
    }
    return json.dumps(doc)  # JSON is YAML.


def setup_journals(dep: Deployment, prefix: str, shards: list[str], **kwargs: Any) -> None:
    """Source journals <prefix>/in/a and <prefix>/in/b, and a recovery log per shard."""
    ok(
        dep.cli(
            "journals",
            "apply",
            "--specs",
            "-",
            stdin=journalspace(
                f"{prefix}/",
                [f"{prefix}/in/a", f"{prefix}/in/b"],
                [f"{prefix}/recovery/{s}" for s in sorted(shards)],
                **kwargs,
            ),
        )
    )


def shardspace(prefix: str, *shard_lines: str, common: str = "") -> str:
    """A shardspace reading both source journals, recording to <prefix>/recovery."""
    text = textwrap.dedent(
        f"""\
        common:
          sources:
          - journal: {prefix}/in/a
          - journal: {prefix}/in/b
          recovery_log_prefix: {prefix}/recovery
          hint_prefix: /{prefix}/hints
          max_txn_duration: 100ms
          labels:
          - name: test
            value: {prefix}
        """
    )
    text += textwrap.indent(textwrap.dedent(common), "  ")
    text += "shards:\n" + "".join(textwrap.dedent(line) for line in shard_lines)
    return text


def apply_shards(dep: Deployment, prefix: str, *shard_lines: str, common: str = "") -> str:
    """`shards apply` of the `shardspace` of these shards, which must succeed."""
    return ok(
        dep.cli(
            "shards",
            "apply",
            "--specs",
            "-",
            stdin=shardspace(prefix, *shard_lines, common=common),
        )
    )


def listed(dep: Deployment, selector: str) -> list[dict[str, Any]]:
    out = ok(dep.cli("shards", "list", "-l", selector, "--format", "json"))
    shards: list[dict[str, Any]] = json.loads(out).get("shards", [])
    return shards


def table_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll `condition` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def replica_codes(dep: Deployment, shard: str) -> list[str]:
    async def fn(_: JournalClient, shards: ShardClient) -> list[str]:
        found = await shards.list_shards(f"id={shard}", within=30)
        if not found:
            return []
        return [cpb.ReplicaStatus.Code.Name(s.code) for s in found[0].status]

    codes: list[str] = dep.run(fn)
    return codes


def wait_primary(dep: Deployment, shard: str) -> None:
    wait_until(lambda: replica_codes(dep, shard) == ["PRIMARY"], f"{shard} to be PRIMARY")


def feed(dep: Deployment, shard: str, journal: str, keys: list[str]) -> None:
    """Append a message per key, and wait until the shard's primary has read through them."""
    lines = "".join(json.dumps({"key": k}) + "\n" for k in keys).encode()

    async def fn(journals: JournalClient, shards: ShardClient) -> None:
        resp = await append(journals, journal, lines)
        await shards.stat(shard, {journal: resp.commit.end}, within=60)

    dep.run(fn)


def hints_of(dep: Deployment, shard: str) -> cpb.GetHintsResponse:
    async def fn(_: JournalClient, shards: ShardClient) -> cpb.GetHintsResponse:
        return await shards.get_hints(shard, within=30)

    resp: cpb.GetHintsResponse = dep.run(fn)
    return resp


def fragments_of(dep: Deployment, journal: str) -> list[pb.Fragment]:
    async def fn(journals: JournalClient, _: ShardClient) -> list[pb.Fragment]:
        return [f.spec for f in await list_all_fragments(journals, journal)]

    frags: list[pb.Fragment] = dep.run(fn)
    return frags


# apply and list --------------------------------------------------------------------------


def test_apply_then_list_in_every_format(deployment: Deployment, prefix: str) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-one", f"{prefix}-two"])
    specs = shardspace(
        prefix,
        f"- id: {prefix}-one\n",
        f"""\
        - id: {prefix}-two
          hot_standbys: 1
          labels:
          - name: tier
            value: gold
        """,
    )
    out = ok(dep.cli("shards", "apply", "--specs", "-", stdin=specs))
    assert out.startswith("applied 2 shard change(s) at revision ")

    selector = f"test={prefix}"
    wait_primary(dep, f"{prefix}-one")
    wait_primary(dep, f"{prefix}-two")
    table = ok(dep.cli("shards", "list", "-l", selector, "-p", "-r", "--rf", "-L", "tier"))
    assert table_rows(table) == [
        ["ID", "STATUS", "RF", "PRIMARY", "REPLICAS", "TIER"],
        [f"{prefix}-one", "PRIMARY", "1", f"{dep.consumer.member_id}:PRIMARY", "<none>", "<none>"],
        # One consumer process cannot host the hot standby: the route has only the primary.
        [f"{prefix}-two", "PRIMARY", "2", f"{dep.consumer.member_id}:PRIMARY", "<none>", "gold"],
    ]
    assert table_rows(ok(dep.cli("shards", "list", "-l", f"id={prefix}-two")))[1] == [
        f"{prefix}-two",
        "PRIMARY",
    ]

    # YAML is the hoisted shardspace: what the shards share is common.
    hoisted = ok(dep.cli("shards", "list", "-l", selector, "--format", "yaml"))
    assert hoisted.startswith("common:\n  sources:\n")
    assert f"- id: {prefix}-one\n  revision: " in hoisted
    assert f"- id: {prefix}-two\n  hot_standbys: 1\n  labels:\n  - name: tier\n" in hoisted
    as_applied = {e.id: e.spec for e in flatten(parse_shardspace(specs))}
    as_listed = flatten(parse_shardspace(hoisted))
    assert {e.id: e.spec for e in as_listed} == as_applied
    assert all(e.revision > 0 for e in as_listed)

    by_json = listed(dep, selector)
    assert [s["spec"]["id"] for s in by_json] == [f"{prefix}-one", f"{prefix}-two"]
    assert by_json[1]["spec"]["hot_standbys"] == 1
    proto = ok(dep.cli("shards", "list", "-l", selector, "--format", "proto"))
    assert f'id: "{prefix}-two"' in proto

    # The listing applies back as it is (its revisions are current)...
    ok(dep.cli("shards", "apply", "--specs", "-", stdin=hoisted))
    # ...and a second time its revisions are stale.
    stale = one_line_error(dep.cli("shards", "apply", "--specs", "-", stdin=hoisted))
    assert "ETCD_TRANSACTION_FAILED" in stale


def test_dry_run_checks_everything_and_applies_nothing(deployment: Deployment, prefix: str) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-dry"])
    out = ok(
        dep.cli(
            "shards",
            "apply",
            "--dry-run",
            "--specs",
            "-",
            stdin=shardspace(prefix, f"- id: {prefix}-dry\n"),
        )
    )
    assert f'id: "{prefix}-dry"' in out
    assert "expect_mod_revision" not in out  # Zero: a creation.
    assert listed(dep, f"test={prefix}") == []
    # A dry run still checks the referenced journals.
    err = one_line_error(
        dep.cli(
            "shards",
            "apply",
            "--dry-run",
            "--specs",
            "-",
            stdin=shardspace(prefix, f"- id: {prefix}-nolog\n"),
        )
    )
    assert f"recovery log '{prefix}/recovery/{prefix}-nolog'" in err


def test_apply_reads_stdin_without_specs(deployment: Deployment, prefix: str) -> None:
    """--specs defaults to '-' (stdin), as gazctl's: `kustomize build | shards apply`."""
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-piped"])
    out = ok(dep.cli("shards", "apply", stdin=shardspace(prefix, f"- id: {prefix}-piped\n")))
    assert "applied 1 shard change(s)" in out
    assert [s["spec"]["id"] for s in listed(dep, f"test={prefix}")] == [f"{prefix}-piped"]


def test_apply_checks_specs_and_referenced_journals(
    deployment: Deployment, prefix: str, tmp_path: Path
) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-bad"])
    ok(
        dep.cli(
            "journals",
            "apply",
            "--specs",
            "-",
            stdin=journalspace(
                f"{prefix}/text/",
                [f"{prefix}/text/plain", f"{prefix}/text/{prefix}-bad"],
                content_type="text/plain",
            ),
        )
    )

    def apply(text: str) -> str:
        return one_line_error(dep.cli("shards", "apply", "--specs", "-", stdin=text))

    shard = f"- id: {prefix}-bad\n"
    missing = apply(shardspace(prefix, shard).replace(f"{prefix}/in/b", f"{prefix}/in/c"))
    assert f"shard '{prefix}-bad': source journal '{prefix}/in/c': JOURNAL_NOT_FOUND" in missing

    plain = apply(shardspace(prefix, shard).replace(f"{prefix}/in/b", f"{prefix}/text/plain"))
    assert f"source journal '{prefix}/text/plain'" in plain
    assert "no message framing for content-type text/plain" in plain

    # A recovery log must be labeled as one.
    wrong_log = apply(shardspace(prefix, shard).replace(f"{prefix}/recovery\n", f"{prefix}/text\n"))
    assert f"expected recovery log '{prefix}/text/{prefix}-bad' to have content-type" in wrong_log
    assert "but it has 'text/plain'" in wrong_log

    assert "shard 'ab': Id: invalid length" in apply(shardspace(prefix, "- id: ab\n"))
    assert "max_txn_duration: invalid duration '100 ms'" in apply(
        shardspace(prefix, shard).replace("100ms", "100 ms")
    )
    assert "unknown shard field 'hotstandbys'" in apply(
        shardspace(prefix, shard + "  hotstandbys: 1\n")
    )
    assert "invalid YAML" in apply("shards: [\n")
    missing_file = one_line_error(
        dep.cli("shards", "apply", "--specs", str(tmp_path / "nope.yaml"))
    )
    assert "cannot read" in missing_file
    assert listed(dep, f"test={prefix}") == []


def test_delete_by_revision(deployment: Deployment, prefix: str) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-del", f"{prefix}-keep"])
    apply_shards(dep, prefix, f"- id: {prefix}-del\n", f"- id: {prefix}-keep\n")
    [gone] = listed(dep, f"id={prefix}-del")
    no_revision = one_line_error(
        dep.cli(
            "shards",
            "apply",
            "--specs",
            "-",
            stdin=f"shards:\n- id: {prefix}-del\n  delete: true\n",
        )
    )
    assert "a delete needs the shard's current revision" in no_revision
    ok(
        dep.cli(
            "shards",
            "apply",
            "--specs",
            "-",
            stdin=f"shards:\n- id: {prefix}-del\n  delete: true\n"
            f"  revision: {gone['mod_revision']}\n",
        )
    )
    assert [s["spec"]["id"] for s in listed(dep, f"test={prefix}")] == [f"{prefix}-keep"]


def test_apply_splits_into_transactions_a_default_etcd_accepts(
    deployment: Deployment, prefix: str
) -> None:
    """More shards than one etcd transaction holds (the consumer's etcd is a default one):
    by default in transactions of --max-txn-size, with progress on stderr; in one
    transaction, refused with one clear line and nothing applied."""
    dep = deployment
    count = 250
    ids = [f"{prefix}-{i:03d}" for i in range(count)]
    setup_journals(dep, prefix, ids)
    specs = shardspace(prefix, *(f"- id: {i}\n  disable: true\n" for i in ids))

    whole = dep.cli("shards", "apply", "--specs", "-", "--max-txn-size", "0", stdin=specs)
    assert "apply them in batches" in one_line_error(whole)
    assert listed(dep, f"test={prefix}") == []

    done = dep.cli("shards", "apply", "--specs", "-", stdin=specs)
    assert ok(done).startswith(f"applied {count} shard change(s) at revision ")
    assert done.stderr.splitlines()[-1].startswith(
        f"applied {count}/{count} shard changes in 3 transaction(s) "
    ), done.stderr
    assert [s["spec"]["id"] for s in listed(dep, f"test={prefix}")] == ids


def test_a_disabled_shard_is_not_assigned(deployment: Deployment, prefix: str) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-off"])
    apply_shards(dep, prefix, f"- id: {prefix}-off\n  disable: true\n")
    table = ok(dep.cli("shards", "list", "-l", f"id={prefix}-off", "--rf", "-p"))
    assert table_rows(table)[1] == [f"{prefix}-off", "IDLE", "0", "<none>"]


# edit ------------------------------------------------------------------------------------

EDITOR = r"""
import json, os, pathlib, re, subprocess, sys
path = pathlib.Path(sys.argv[1])
state = pathlib.Path(os.environ["EDIT_STATE"])
calls = json.loads(state.read_text()) if state.exists() else []
text = path.read_text()
calls.append(text)
state.write_text(json.dumps(calls))
steps = json.loads(os.environ["EDIT_STEPS"])
step = steps[min(len(calls), len(steps)) - 1]
if step["do"] == "replace":
    text = text.replace(step["old"], step["new"])
elif step["do"] == "empty":
    text = ""
elif step["do"] == "run-then-replace":
    subprocess.run(step["cmd"], shell=True, check=True)
    text = text.replace(step["old"], step["new"])
path.write_text(text)
"""


def edit(
    dep: Deployment, tmp_path: Path, selector: str, steps: list[dict[str, str]]
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run `shards edit` with an editor that takes `steps` in turn; returns the process and
    what the editor was shown each time."""
    script = tmp_path / "editor.py"
    script.write_text(EDITOR)
    state = tmp_path / f"edit-{uuid.uuid4().hex}.json"
    proc = dep.cli(
        "shards",
        "edit",
        "-l",
        selector,
        env={
            "GAZ_EDITOR": f"{sys.executable} {script}",
            "EDIT_STATE": str(state),
            "EDIT_STEPS": json.dumps(steps),
            "TMPDIR": str(tmp_path),
        },
    )
    shown: list[str] = json.loads(state.read_text()) if state.exists() else []
    return proc, shown


def test_edit_applies_the_edited_specs(deployment: Deployment, prefix: str, tmp_path: Path) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-ed1", f"{prefix}-ed2"])
    apply_shards(dep, prefix, f"- id: {prefix}-ed1\n", f"- id: {prefix}-ed2\n")
    selector = f"test={prefix}"
    proc, shown = edit(dep, tmp_path, selector, [{"do": "replace", "old": "100ms", "new": "250ms"}])
    assert ok(proc).startswith("applied shard changes at revision ")
    assert len(shown) == 1
    assert shown[0].startswith("#⚙ Edit the spec below.")
    assert "max_txn_duration: 100ms" in shown[0]
    specs = listed(dep, selector)
    assert [s["spec"]["max_txn_duration"] for s in specs] == ["0.250s", "0.250s"]
    assert not list(tmp_path.glob("pygazette-shards-edit-*"))  # The temp file is gone.

    # An unchanged file cancels; so does an empty one.
    proc, shown = edit(dep, tmp_path, selector, [{"do": "replace", "old": "", "new": ""}])
    assert ok(proc) == "" and "Cancelled; nothing to do." in proc.stderr
    proc, shown = edit(dep, tmp_path, selector, [{"do": "empty"}])
    assert ok(proc) == "" and "Cancelled; empty file." in proc.stderr
    assert [s["spec"]["max_txn_duration"] for s in listed(dep, selector)] == ["0.250s", "0.250s"]

    nothing = one_line_error(dep.cli("shards", "edit", "-l", f"test={prefix}-none"))
    assert "no shard matches selector" in nothing


def test_edit_reopens_invalid_edits_with_the_error(
    deployment: Deployment, prefix: str, tmp_path: Path
) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-inv"])
    apply_shards(dep, prefix, f"- id: {prefix}-inv\n")
    proc, shown = edit(
        dep,
        tmp_path,
        f"test={prefix}",
        [
            {"do": "replace", "old": "100ms", "new": "100 ms"},
            {"do": "replace", "old": "100 ms", "new": "2s"},
        ],
    )
    ok(proc)
    assert len(shown) == 2
    assert "#⚠ There were errors validating or applying the spec." in shown[1]
    assert "max_txn_duration: invalid duration '100 ms'" in shown[1]
    assert "max_txn_duration: 100 ms" in shown[1]  # The user's edits are kept.
    assert listed(dep, f"id={prefix}-inv")[0]["spec"]["max_txn_duration"] == "2s"


def test_edit_reopens_when_the_shards_changed_meanwhile(
    deployment: Deployment, prefix: str, tmp_path: Path
) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-race"])
    apply_shards(dep, prefix, f"- id: {prefix}-race\n")
    concurrent = tmp_path / "concurrent.yaml"
    concurrent.write_text(
        shardspace(prefix, f"- id: {prefix}-race\n  revision: -1\n").replace("100ms", "3s")
    )
    cli = (
        f"BROKER_ADDRESS={dep.broker_url} CONSUMER_ADDRESS={dep.consumer_url} "
        f"{sys.executable} -m pygazette.cli.main shards apply --specs {concurrent} >/dev/null"
    )
    proc, shown = edit(
        dep,
        tmp_path,
        f"test={prefix}",
        [
            # While the editor is open, another apply changes the shard.
            {"do": "run-then-replace", "cmd": cli, "old": "100ms", "new": "5s"},
            {"do": "empty"},
        ],
    )
    assert ok(proc) == "" and "Cancelled; empty file." in proc.stderr
    assert len(shown) == 2 and "ETCD_TRANSACTION_FAILED" in shown[1]
    # The concurrent change stands; the stale edit was not applied.
    assert listed(dep, f"id={prefix}-race")[0]["spec"]["max_txn_duration"] == "3s"


# unassign --------------------------------------------------------------------------------


def test_unassign(deployment: Deployment, prefix: str) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-ok", f"{prefix}-bad"])
    apply_shards(
        dep,
        prefix,
        f"- id: {prefix}-bad\n",
        # The poison message goes to in/a, which this one does not read.
        f"- id: {prefix}-ok\n  sources:\n  - journal: {prefix}/in/b\n",
    )
    bad, good = f"{prefix}-bad", f"{prefix}-ok"
    wait_primary(dep, bad)
    wait_primary(dep, good)
    selector = f"test={prefix}"

    out = ok(dep.cli("shards", "unassign", "-l", selector, "--failed"))
    assert out == "unassigned 0 shard(s)\n"

    # Make one shard fail: Counter refuses the poison key.
    ok(
        dep.cli(
            "journals",
            "append",
            "-l",
            f"name={prefix}/in/a",
            stdin=json.dumps({"key": POISON}) + "\n",
        )
    )
    wait_until(lambda: "FAILED" in replica_codes(dep, bad), f"{bad} to fail")
    table = ok(dep.cli("shards", "list", "-l", selector))
    assert table_rows(table)[1:] == [[bad, "FAILED"], [good, "PRIMARY"]]

    dry = ok(dep.cli("shards", "unassign", "-l", selector, "--failed", "--dry-run"))
    assert table_rows(dry) == [
        ["ID", "PREVIOUS", "STATUS", "PRIMARY", "REPLICAS"],
        [bad, "FAILED", f"{dep.consumer.member_id}:FAILED", "<none>"],
        ["would", "unassign", "1", "shard(s)"],
    ]
    assert "FAILED" in replica_codes(dep, bad)

    out = ok(dep.cli("shards", "unassign", "-l", selector, "--failed"))
    assert out.endswith("unassigned 1 shard(s)\n")

    # A healthy shard is unassigned too, without --failed; the allocator reassigns it.
    out = ok(dep.cli("shards", "unassign", "-l", f"id={good}"))
    assert table_rows(out)[1][:2] == [good, "PRIMARY"]
    wait_primary(dep, good)


# --lag, prune and recover: shards that process messages ------------------------------------


def test_lag_prune_and_recover(deployment: Deployment, prefix: str, tmp_path: Path) -> None:
    dep = deployment
    shard = f"{prefix}-count"
    log = f"{prefix}/recovery/{shard}"
    # Small recovery-log fragments: each commit (state.json rewritten) spans fragments, so
    # older fragments hold only files that later commits replaced.
    setup_journals(dep, prefix, [shard], fragment_length=1024)
    apply_shards(dep, prefix, f"- id: {shard}\n")
    wait_primary(dep, shard)

    counts: dict[str, int] = {}
    for round_ in range(30):
        keys = [f"key-{round_ % 7}-{i % 3}" for i in range(10)]
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
        feed(dep, shard, f"{prefix}/in/{'ab'[round_ % 2]}", keys)

    lag = ok(dep.cli("shards", "list", "-l", f"id={shard}", "--lag"))
    assert table_rows(lag)[0] == ["ID", "STATUS", "LAG"]
    assert table_rows(lag)[1] == [shard, "PRIMARY", f"{prefix}/in/a:0,", f"{prefix}/in/b:0"]

    # Wait for hints recorded after the last commit, and for every fragment but the open
    # one to be persisted.
    def settled() -> bool:
        hints = hints_of(dep, shard)
        if not hints.primary_hints.HasField("hints"):
            return False
        frags = fragments_of(dep, log)
        return len(frags) > 3 and all(f.mod_time for f in frags[:-1])

    wait_until(settled, "hints and persisted fragments")
    before = fragments_of(dep, log)

    dry = ok(
        dep.cli(
            "shards",
            "prune",
            "-l",
            f"id={shard}",
            "--dry-run",
            "--file-root",
            str(dep.broker.file_root),
        )
    )
    summary = dry.splitlines()[-1]
    assert summary.startswith("would remove ") and "of 1 shard(s)" in summary
    assert fragments_of(dep, log) == before or len(fragments_of(dep, log)) >= len(before)
    would = [row for row in table_rows(dry)[1:-1]]
    assert would, dry  # Old commits' files are dead: some fragments are not needed.
    assert all(row[0] == log for row in would)

    out = ok(
        dep.cli("shards", "prune", "-l", f"id={shard}", "--file-root", str(dep.broker.file_root))
    )
    # The shard may persist or retire more of its log between the two runs (an open
    # fragment's flush, hints recorded after the last commit), so the real run removes at
    # least what the dry run named.
    assert out.splitlines()[-1].startswith("removed "), out
    removed = {(int(row[1]), int(row[2])) for row in table_rows(out)[1:-1]}
    assert {(int(row[1]), int(row[2])) for row in would} <= removed, (would, out)
    for begin, end in removed:
        assert not list(dep.broker.file_root.glob(f"{log}/{begin:016x}-{end:016x}-*")), (begin, end)

    # The log still recovers the shard's whole state.
    recovered = tmp_path / "recovered"
    out = ok(dep.cli("shards", "recover", "--id", shard, "--dir", str(recovered)))
    assert out == f"recovered shard {shard} from {log} into {recovered}\n"
    state = json.loads((recovered / "state.json").read_text())
    assert state["state"]["counts"] == counts

    # A non-empty directory is only overwritten on request.
    refused = one_line_error(
        dep.cli("shards", "recover", "-l", f"id={shard}", "--dir", str(recovered))
    )
    assert "is not empty" in refused
    ok(dep.cli("shards", "recover", "-l", f"id={shard}", "--dir", str(recovered), "--overwrite"))
    assert json.loads((recovered / "state.json").read_text())["state"]["counts"] == counts


def test_prune_skips_logs_without_complete_hints(deployment: Deployment, prefix: str) -> None:
    dep = deployment
    shard = f"{prefix}-backup"
    setup_journals(dep, prefix, [shard], fragment_length=1024)
    # Two backup hint sets: the first recovery writes backup.0 (without live files: the log
    # was empty); backup.1 is missing until another recovery.
    apply_shards(dep, prefix, f"- id: {shard}\n", common="hint_backups: 2\n")
    wait_primary(dep, shard)
    feed(dep, shard, f"{prefix}/in/a", [f"k{i}" for i in range(20)])
    proc = dep.cli("shards", "prune", "-l", f"id={shard}", "--file-root", str(dep.broker.file_root))
    assert ok(proc).startswith("removed 0 of 0 fragment(s)")
    assert f"warning: skipping recovery log {prefix}/recovery/{shard}: shard {shard}" in proc.stderr


def test_prune_under_another_file_root_fails_and_removes_nothing(
    deployment: Deployment, prefix: str, tmp_path: Path
) -> None:
    """`shards prune` removes file:// fragments itself, under its --file-root: one that is not
    the broker's finds none of them. That fails, naming the root, and removes nothing; it
    reported them removed (and exit 0) while every one stayed."""
    dep = deployment
    shard = f"{prefix}-root"
    log = f"{prefix}/recovery/{shard}"
    setup_journals(dep, prefix, [shard], fragment_length=1024)
    apply_shards(dep, prefix, f"- id: {shard}\n")
    wait_primary(dep, shard)
    for round_ in range(12):
        feed(dep, shard, f"{prefix}/in/a", [f"key-{round_}-{i}" for i in range(10)])

    def prunable() -> bool:
        hints = hints_of(dep, shard)
        if not hints.primary_hints.HasField("hints"):
            return False
        dry = ok(
            dep.cli(
                "shards",
                "prune",
                "-l",
                f"id={shard}",
                "--dry-run",
                "--file-root",
                str(dep.broker.file_root),
            )
        )
        return not dry.splitlines()[-1].startswith("would remove 0 ")

    wait_until(prunable, "fragments that no hint needs")
    stored = sorted(p.name for p in (dep.broker.file_root / log).iterdir())
    elsewhere = tmp_path / "not-the-file-root"
    elsewhere.mkdir()
    # A dry run (which needs no access to the stores) warns of it.
    dry = dep.cli(
        "shards", "prune", "-l", f"id={shard}", "--dry-run", "--file-root", str(elsewhere)
    )
    assert ok(dry).splitlines()[-1].startswith("would remove "), dry.stdout
    assert f"--file-root {elsewhere} is not the broker's file root" in dry.stderr, dry.stderr
    assert "skipped" not in dry.stdout.splitlines()[-1]
    err = one_line_error(
        dep.cli("shards", "prune", "-l", f"id={shard}", "--file-root", str(elsewhere))
    )
    assert f"--file-root {elsewhere} is not the broker's file root" in err, err
    assert "nothing was removed" in err, err
    assert sorted(p.name for p in (dep.broker.file_root / log).iterdir()) == stored


# errors ----------------------------------------------------------------------------------


def test_errors_are_one_line(deployment: Deployment, prefix: str, tmp_path: Path) -> None:
    dep = deployment
    setup_journals(dep, prefix, [f"{prefix}-e1", f"{prefix}-e2"])
    apply_shards(dep, prefix, f"- id: {prefix}-e1\n", f"- id: {prefix}-e2\n")
    unreachable = one_line_error(dep.cli("shards", "list", "--consumer", "http://127.0.0.1:1"))
    assert "consumer unavailable at http://127.0.0.1:1" in unreachable
    by_env = one_line_error(
        dep.cli("shards", "list", env={"CONSUMER_ADDRESS": "http://127.0.0.1:1"})
    )
    assert "consumer unavailable at http://127.0.0.1:1" in by_env
    assert "label selector" in one_line_error(dep.cli("shards", "list", "-l", "a in"))
    assert "SHARD_NOT_FOUND" in one_line_error(
        dep.cli("shards", "recover", "--id", f"{prefix}-none", "--dir", str(tmp_path / "r"))
    )
    two = one_line_error(
        dep.cli("shards", "recover", "-l", f"test={prefix}", "--dir", str(tmp_path / "r"))
    )
    assert "matches 2 shards" in two
    assert "exactly one of --id and --selector" in one_line_error(
        dep.cli("shards", "recover", "--dir", str(tmp_path / "r"))
    )
    assert "Missing option '-l'" in one_line_error(dep.cli("shards", "unassign"))
    broker_down = one_line_error(
        dep.cli(
            "--broker",
            "http://127.0.0.1:1",
            "shards",
            "apply",
            "--specs",
            "-",
            stdin=shardspace(prefix, f"- id: {prefix}-e3\n"),
        )
    )
    assert "unavailable at http://127.0.0.1:1" in broker_down


def test_a_broker_for_a_consumer_or_back_is_named_as_such(deployment: Deployment) -> None:
    """A newcomer's likeliest slip: the broker's address where the consumer's goes (both
    default to port 8080), or the other way round. The server answers UNIMPLEMENTED 'Method
    not found!'; the error says which service it lacks and which flag names the right one."""
    dep = deployment
    as_consumer = one_line_error(dep.cli("shards", "list", "--consumer", dep.broker_url))
    assert as_consumer == (
        f"error: consumer at {dep.broker_url}: UNIMPLEMENTED: Method not found! ({dep.broker_url}"
        " serves no consumer.Shard: not a consumer? --consumer URL or $CONSUMER_ADDRESS names one)"
    )
    as_broker = one_line_error(dep.cli("--broker", dep.consumer_url, "journals", "list"))
    assert as_broker == (
        f"error: UNIMPLEMENTED: Method not found! ({dep.consumer_url} serves no"
        " protocol.Journal: not a broker? --broker URL or $BROKER_ADDRESS names one)"
    )


def test_prune_after_sqlite_compactions_keeps_what_recovery_needs(
    deployment: Deployment, prefix: str, tmp_path: Path
) -> None:
    """A SQLite store that compacts its log (tests.consumer.apps: after 32 KiB): hints name
    only the newest database file, so `shards prune` removes everything before it, and the
    shard still recovers from what is left."""
    dep = deployment
    shard = f"{prefix}-sqlite"
    log = f"{prefix}/recovery/{shard}"
    setup_journals(dep, prefix, [shard], fragment_length=1024)
    apply_shards(dep, prefix, f"- id: {shard}\n")
    wait_primary(dep, shard)
    counts: dict[str, int] = {}
    for round_ in range(40):
        keys = [f"key-{round_ % 5}-{i % 4}" for i in range(8)]
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
        feed(dep, shard, f"{prefix}/in/{'ab'[round_ % 2]}", keys)

    def settled() -> bool:
        hints = hints_of(dep, shard)
        if not hints.primary_hints.HasField("hints"):
            return False
        first = min(
            s.first_offset for n in hints.primary_hints.hints.live_nodes for s in n.segments
        )
        frags = fragments_of(dep, log)
        seen["hints"], seen["first"] = hints.primary_hints.hints, first
        # Hints recorded after a compaction, and every older fragment persisted.
        return first > 0 and all(f.mod_time for f in frags if f.end <= first)

    seen: dict[str, Any] = {}
    wait_until(settled, "hints after a compaction and persisted fragments")
    assert len(seen["hints"].live_nodes) == 1  # store.sqlite, recorded anew by a compaction
    first = seen["first"]
    before = fragments_of(dep, log)
    out = ok(
        dep.cli("shards", "prune", "-l", f"id={shard}", "--file-root", str(dep.broker.file_root))
    )
    removed = [(int(row[1]), int(row[2])) for row in table_rows(out)[1:-1]]
    removed_bytes = sum(end - begin for begin, end in removed)
    total = sum(f.end - f.begin for f in before)
    assert removed_bytes > total / 2, out  # Most of the log held compacted-away history.
    # Every fragment before the latest compaction is deleted, from the listing and the disk.
    dead = [(f.begin, f.end) for f in before if f.end <= first]
    assert dead and set(dead) <= set(removed), (dead, out)
    for begin, end in dead:
        assert not list(dep.broker.file_root.glob(f"{log}/{begin:016x}-{end:016x}-*")), (begin, end)

    recovered = tmp_path / "recovered"
    ok(dep.cli("shards", "recover", "--id", shard, "--dir", str(recovered)))
    conn = apsw.Connection(str(recovered / "store.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert dict(conn.execute("SELECT k, n FROM counts").fetchall()) == counts
    finally:
        conn.close()


def test_a_failed_batch_says_what_stays_applied(deployment: Deployment, prefix: str) -> None:
    """A batch of `shards apply` failing after earlier batches applied says that they
    stay applied (as `journals apply` does), instead of reporting only the failure."""
    dep = deployment
    ids = [f"{prefix}-{s}" for s in ("a", "b", "c", "z")]
    setup_journals(dep, prefix, ids)
    apply_shards(dep, prefix, f"- id: {prefix}-z\n  disable: true\n")
    # The second transaction creates <prefix>-z (revision 0) again: it exists.
    failed = dep.cli(
        "shards",
        "apply",
        "--specs",
        "-",
        "--max-txn-size",
        "3",
        stdin=shardspace(prefix, *(f"- id: {i}\n  disable: true\n" for i in ids)),
    )
    assert failed.returncode != 0
    line = failed.stderr.splitlines()[-1]  # After any progress lines.
    assert line.startswith("error: ") and "the 3 change(s) before it stay applied" in line, line
    assert [s["spec"]["id"] for s in listed(dep, f"test={prefix}")] == ids


def test_an_edit_applied_in_part_is_not_reopened(
    deployment: Deployment, prefix: str, tmp_path: Path
) -> None:
    """A later transaction of an edit failing after earlier ones applied: the edits no longer
    apply as they are, so the edit ends saying what stayed applied (it was reopened under "No
    changes were applied"), and keeps the edits in their file."""
    dep = deployment
    ids = [f"{prefix}-p{i}" for i in range(4)]
    setup_journals(dep, prefix, ids)
    apply_shards(dep, prefix, *(f"- id: {i}\n" for i in ids))
    concurrent = tmp_path / "concurrent.yaml"
    concurrent.write_text(
        shardspace(prefix, f"- id: {ids[-1]}\n  revision: -1\n").replace("100ms", "3s")
    )
    cli = (
        f"BROKER_ADDRESS={dep.broker_url} CONSUMER_ADDRESS={dep.consumer_url} "
        f"{sys.executable} -m pygazette.cli.main shards apply --specs {concurrent} >/dev/null"
    )
    script = tmp_path / "editor.py"
    script.write_text(EDITOR)
    state = tmp_path / "edit-state.json"
    steps = [{"do": "run-then-replace", "cmd": cli, "old": "100ms", "new": "5s"}]
    proc = dep.cli(
        "shards",
        "edit",
        "-l",
        f"test={prefix}",
        "--max-txn-size",
        "2",
        env={
            "GAZ_EDITOR": f"{sys.executable} {script}",
            "EDIT_STATE": str(state),
            "EDIT_STEPS": json.dumps(steps),
            "TMPDIR": str(tmp_path),
        },
    )
    assert proc.returncode != 0, proc.stderr
    assert len(json.loads(state.read_text())) == 1  # Not reopened.
    assert "the 2 change(s) before it stay applied" in proc.stderr, proc.stderr
    assert "Last edits saved to" in proc.stderr
    durations = [s["spec"]["max_txn_duration"] for s in listed(dep, f"test={prefix}")]
    assert durations == ["5s", "5s", "0.100s", "3s"]
