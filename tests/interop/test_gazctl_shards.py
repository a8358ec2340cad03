"""The released `gazctl shards …` against pygazette consumer processes.

Each test runs a pygazette broker and `pygazette consumer serve` processes of the Counter app
(tests/consumer/apps.py: a JSONFileStore recorded to a recovery log, FSM hints in etcd), on
the interop etcd, and drives them with Gazette's own gazctl:

- apply (a Gazette shardspace YAML; --dry-run compared with pygazette's) and list in every
  format and with selectors, --lag and the column flags, compared with `pygazette shards
  list` as parsed structures (not text);
- edit through $EDITOR, unassign (--dry-run, --failed), each seen by the other tool;
- recover: Gazette's recoverylog.Player plays a log that pygazette recorded, from the hints
  pygazette stored, into the very state file the consumer holds (the byte-compatibility
  proof of the recovery log and the hints), as `pygazette shards recover` does;
- prune: removes exactly the fragments no hint needs (the same that `pygazette shards prune
  --dry-run` names), and a fresh consumer still recovers the whole state from what is left.

gazctl never configures the root of `file://` stores for `shards prune` (Gazette's
fs.FileSystemStoreRoot stays at its "/dev/null/must/configure/file/store/root" placeholder:
only `gazette serve --file-root` and `journals read --file-root` set it), so removing a
fragment of a plain `file:///` store fails. The recovery logs here use a `file://` store
whose path climbs out of any root (`file:///../../…/<broker file root>/`): joined under
gazctl's placeholder or under the broker's root, it names the same directory, the broker's
file root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
import yaml
from google.protobuf import json_format, text_format

from pygazette.client import JournalClient, append, apply_journals, list_all_fragments
from pygazette.client.append_service import AppendService
from pygazette.client.reader import Reader
from pygazette.consumer.json_file_store import decode_document
from pygazette.consumer.shard_client import ShardClient
from pygazette.keyspace.etcd import EtcdKeyspace
from pygazette.keyspace.layout import KeyLayout
from pygazette.message.publisher import Publisher
from pygazette.protocol.fragment_name import fragment_content_path
from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import consumer_pb2 as cpb
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb
from tests.support.broker_process import BrokerProcess
from tests.support.consumer_process import ConsumerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries

pytestmark = pytest.mark.timeout(120)

NDJSON = "application/x-ndjson"
RECOVERY_LOG = "application/x-gazette-recoverylog"
SOURCES = ("shards/in-a", "shards/in-b")
OUT = "shards/out"
LOGS = "shards/recovery"
SHARDS = ("counter-000", "counter-001")
LEASE = "2s"
CLI_TIMEOUT = 60
WAIT = 45.0
CONNECT_TIMEOUTS = ("timed out before receiving SETTINGS frame", "tcp handshaker shutdown")
# Where gazctl roots file:// stores: it never sets Gazette's fs.FileSystemStoreRoot.
GAZCTL_FILE_ROOT = Path("/dev/null/must/configure/file/store/root")

# counter-000 reads in-a, counter-001 reads in-b; each records to shards/recovery/<id>.
SHARDSPACE = """\
common:
  recovery_log_prefix: shards/recovery
  hint_prefix: {hints}
  hint_backups: 1
  max_txn_duration: 100ms
  labels:
  - name: app
    value: counter
shards:
- id: counter-000
  hot_standbys: {standbys}
  sources:
  - journal: shards/in-a
- id: counter-001
  labels:
  - name: tier
    value: gold
  sources:
  - journal: shards/in-b
"""


def escaping_file_store(root: Path) -> str:
    """A file:// store naming `root` under any file root (see the module docstring)."""
    root = root.resolve()
    ups = "../" * (len(GAZCTL_FILE_ROOT.parts) + len(root.parts))
    return f"file:///{ups}{str(root).lstrip('/')}/"


def journal_spec(name: str, content_type: str, store: str, length: int) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name, replication=1, labels=label_set({"content-type": content_type})
    )
    spec.fragment.length = length
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.stores.append(store)
    spec.fragment.refresh_interval.seconds = 1
    return spec


class Cluster:
    """A broker, the interop etcd and Counter consumer processes in a key root of their own;
    gazctl and the pygazette CLI pointed at them through $CONSUMER_ADDRESS/$BROKER_ADDRESS."""

    def __init__(
        self, tmp: Path, binaries: GazetteBinaries, etcd: EtcdServer, broker: BrokerProcess
    ) -> None:
        self.tmp = tmp
        self.gazctl_bin = binaries.gazctl
        self.etcd = etcd
        self.broker = broker
        root = f"/interop-shards-{uuid.uuid4().hex[:12]}"
        self.prefix = f"{root}/consumer"
        self.hints = f"{root}/hints"
        self.layout = KeyLayout(self.prefix)
        self.ks = EtcdKeyspace(etcd.url, root)  # Assignments and hints.
        self.consumers: list[ConsumerProcess] = []
        self.log_store = escaping_file_store(broker.file_root)
        self._cli_slots = asyncio.Semaphore(2)  # Concurrent command lines (2 cores).

    async def open(self) -> None:
        await self.ks.open()
        specs = [journal_spec(j, NDJSON, "file:///", 1 << 20) for j in [*SOURCES, OUT]]
        specs += [journal_spec(f"{LOGS}/{s}", RECOVERY_LOG, self.log_store, 1024) for s in SHARDS]
        async with JournalClient(self.broker.url) as client:
            await apply_journals(
                client, [pb.ApplyRequest.Change(upsert=s, expect_mod_revision=0) for s in specs]
            )

    async def close(self) -> None:
        for c in self.consumers:
            c.kill()
        await self.ks.close()

    # Processes.
    def add_consumer(self, env: dict[str, str] | None = None) -> ConsumerProcess:
        n = len(self.consumers)
        proc = ConsumerProcess(
            self.tmp / f"consumer-{n}" / "data",
            app="tests.consumer.apps:Counter",
            broker=self.broker.url,
            etcd=self.etcd.url,
            etcd_prefix=self.prefix,
            member_id=f"member-{n}",
            extra_args=["--lease-ttl", LEASE, "--hints-interval", "1s"],
            env={"COUNTER_OUTPUT": OUT, **(env or {})},
        )
        proc.data_dir.parent.mkdir(parents=True)
        self.consumers.append(proc)
        proc.start()
        return proc

    @property
    def consumer_url(self) -> str:
        for c in self.consumers:
            if c.running():
                return c.url
        raise AssertionError("no consumer is running")

    def shardspace(self, standbys: int = 0) -> Path:
        path = self.tmp / f"shardspace-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(SHARDSPACE.format(hints=self.hints, standbys=standbys))
        return path

    # The command lines.
    def _env(self, editor: Path | None) -> dict[str, str]:
        env = {
            **os.environ,
            "CONSUMER_ADDRESS": self.consumer_url,
            "BROKER_ADDRESS": self.broker.url,
        }
        env.pop("GAZ_EDITOR", None)
        if editor is not None:
            env["EDITOR"] = str(editor)
        return env

    async def _run(
        self, cmd: list[str], editor: Path | None, check: bool
    ) -> subprocess.CompletedProcess[str]:
        async with self._cli_slots:
            proc = await asyncio.to_thread(
                subprocess.run,
                cmd,
                env=self._env(editor),
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT,
                cwd=self.tmp,
            )
        if check:
            assert proc.returncode == 0, f"{cmd[1:]} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc

    async def gazctl(
        self, *args: str, editor: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return await self._run([str(self.gazctl_bin), "shards", *args], editor, check)

    async def pygazette(
        self, *args: str, editor: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "pygazette.cli.main", "shards", *args]
        proc = await self._run(cmd, editor, check=False)
        if check:
            assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc

    # State, from the etcd mirror.
    def assignments(self, shard: str) -> dict[int, tuple[str, int, cpb.ReplicaStatus]]:
        """slot -> (member, create revision, status) of the shard's assignments."""
        out = {}
        for kv in self.ks.range(self.layout.item_assignments_prefix(shard)):
            key = self.layout.parse_assignment_key(kv.key)
            status = cpb.ReplicaStatus()
            status.ParseFromString(kv.value)
            out[key.slot] = (key.suffix, kv.create_revision, status)
        return out

    def primary(self, shard: str) -> tuple[str, int] | None:
        """(member, assignment create revision) of the shard's PRIMARY."""
        slot0 = self.assignments(shard).get(0)
        if slot0 is None or slot0[2].code != cpb.ReplicaStatus.PRIMARY:
            return None
        return slot0[0], slot0[1]

    async def wait_for(self, cond: Callable[[], Any], what: str, within: float = WAIT) -> Any:
        """Wait (on etcd changes) until `cond()` is truthy; its value."""
        deadline = time.monotonic() + within
        while not (value := cond()):
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {c.member_id}\n{c.log()}" for c in self.consumers)
                raise AssertionError(f"timed out waiting for {what}\n{logs}")
            with contextlib.suppress(TimeoutError):
                await self.ks.wait_for_change(self.ks.revision, 0.5)
        return value

    async def wait_serving(self, *shards: str, standbys: int = 0) -> None:
        def ready() -> bool:
            for shard in shards:
                if self.primary(shard) is None:
                    return False
                codes = [s.code for slot, (_m, _r, s) in self.assignments(shard).items() if slot]
                if codes.count(cpb.ReplicaStatus.STANDBY) < standbys:
                    return False
            return True

        await self.wait_for(ready, f"primaries of {shards}")

    async def etcd_revision(self) -> int:
        """The store's current revision (an empty transaction's)."""
        return (await self.ks.txn([], [])).revision

    async def wait_hints_after(self, shard: str, revision: int) -> None:
        """Until the shard's primary hints were stored after `revision`."""
        key = f"{self.hints}/{shard}.primary"

        def written() -> bool:
            kv = self.ks.get(key)
            return kv is not None and kv.mod_revision > revision

        await self.wait_for(written, f"hints of {shard} after revision {revision}")

    # Inputs.
    async def publish(self, journal: str, messages: list[dict[str, Any]]) -> None:
        async with JournalClient(self.broker.url) as client, AppendService(client) as service:
            pub = Publisher(service)
            for aa in pub.publish_committed_many(lambda _m: (journal, NDJSON), messages):
                await aa

    async def wait_read_through(self, shard: str, journal: str) -> cpb.StatResponse:
        """Until the shard's committed transactions have read `journal` to its write head."""
        async with JournalClient(self.broker.url) as client:
            reader = Reader(client, journal, offset=-1, metadata_only=True, block=False)
            with contextlib.suppress(Exception):
                await reader.read()
            head = reader.write_head
            await reader.aclose()
        async with ShardClient(self.consumer_url) as shards:
            return await shards.stat(shard, {journal: head}, within=WAIT)

    async def list_shards(self, selector: str = "") -> list[cpb.ListResponse.Shard]:
        async with ShardClient(self.consumer_url) as shards:
            return await shards.list_shards(selector)

    async def get_hints(self, shard: str) -> cpb.GetHintsResponse:
        async with ShardClient(self.consumer_url) as shards:
            return await shards.get_hints(shard)

    async def fragments(self, journal: str) -> list[pb.Fragment]:
        async with JournalClient(self.broker.url) as client:
            return [f.spec for f in await list_all_fragments(client, journal)]


@pytest.fixture
async def cluster(
    tmp_path: Path, binaries: GazetteBinaries, etcd: EtcdServer, broker: BrokerProcess
) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, binaries, etcd, broker)
    await c.open()
    try:
        yield c
    finally:
        await c.close()


def keyed(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"key": f"k{(start + i) % 10}"} for i in range(n)]


def counts_of(n: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in keyed(n):
        out[m["key"]] = out.get(m["key"], 0) + 1
    return out


# Parsing what the two tools print.


def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of gazctl's box-drawn table or of pygazette's aligned columns."""
    lines = [line for line in text.splitlines() if line.strip()]
    if any("│" in line for line in lines):
        cells = [
            [c.strip() for c in line.strip().strip("│").split("│")] for line in lines if "│" in line
        ]
    else:
        starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
        bounds = list(zip(starts, [*starts[1:], None], strict=True))
        cells = [[line[a:b].strip() for a, b in bounds] for line in lines]
    header, *body = cells
    return [dict(zip(header, row, strict=True)) for row in body]


def normalize_row(row: dict[str, str]) -> dict[str, str]:
    out = dict(row)
    # pygazette prints "<none>" for an empty replicas cell; gazctl leaves it empty.
    if out.get("REPLICAS") == "":
        out["REPLICAS"] = "<none>"
    # gazctl's lag follows Go's (random) map order.
    if "LAG" in out:
        out["LAG"] = ", ".join(sorted(out["LAG"].split(", ")))
    return out


def parse_tables(gaz: str, ours: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    return [normalize_row(r) for r in parse_table(gaz)], [
        normalize_row(r) for r in parse_table(ours)
    ]


def parse_list_json(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(text)
    # Hints are stored every second: the revision of the answer moves on between calls.
    doc["header"]["etcd"]["revision"] = "N"
    # gazctl's jsonpb writes the empty `extension` bytes as null; pygazette as "".
    if doc.get("extension") is None:
        doc["extension"] = ""
    return doc


def parse_list_proto(text: str) -> cpb.ListResponse:
    resp = text_format.Parse(text, cpb.ListResponse())
    resp.header.etcd.revision = 0
    # gazctl's text omits a zero duration; pygazette's prints it as `min_txn_duration {}`.
    for shard in resp.shards:
        for name in ("max_txn_duration", "min_txn_duration"):
            if getattr(shard.spec, name).ToNanoseconds() == 0:
                shard.spec.ClearField(name)
    return resp


def gazctl_log(stderr: str, msg: str) -> list[dict[str, Any]]:
    """gazctl's --log.format=json records with message `msg`."""
    out = []
    for line in stderr.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("msg", "").startswith(msg):
                out.append(rec)
    return out


def local_state(consumer: ConsumerProcess, shard: str) -> bytes:
    """The state file of the shard's JSONFileStore in the consumer's data directory."""
    found = list((consumer.data_dir / "shards").glob(f"{shard}-*/state.json"))
    assert len(found) == 1, found
    return found[0].read_bytes()


# The tests.


async def test_apply_and_list(cluster: Cluster) -> None:
    cluster.add_consumer()
    cluster.add_consumer()
    specs = cluster.shardspace(standbys=1)

    # A dry run prints the ApplyRequest, the same as pygazette's, and applies nothing.
    gaz = await cluster.gazctl("apply", "--specs", str(specs), "--dry-run")
    ours = await cluster.pygazette("apply", "--specs", str(specs), "--dry-run")
    request = text_format.Parse(gaz.stdout, cpb.ApplyRequest())
    assert [c.upsert.id for c in request.changes] == list(SHARDS)
    assert ours.stdout == gaz.stdout  # Byte for byte.
    assert await cluster.list_shards() == []

    await cluster.gazctl("apply", "--specs", str(specs))
    await cluster.wait_serving(*SHARDS, standbys=0)
    await cluster.wait_serving("counter-000", standbys=1)
    listed = {s.spec.id: s for s in await cluster.list_shards()}
    assert list(listed) == list(SHARDS)
    first, second = listed["counter-000"].spec, listed["counter-001"].spec
    assert [s.journal for s in first.sources] == ["shards/in-a"]
    assert first.hot_standbys == 1 and second.hot_standbys == 0
    assert first.hint_prefix == cluster.hints and first.hint_backups == 1
    assert first.max_txn_duration.ToMilliseconds() == 100
    assert {(lb.name, lb.value) for lb in second.labels.labels} == {
        ("app", "counter"),
        ("tier", "gold"),
    }
    # Applying the same specs again (revision 0: create) fails on both, changing nothing.
    again = await cluster.gazctl("apply", "--specs", str(specs), check=False)
    assert again.returncode != 0 and "ETCD_TRANSACTION_FAILED" in again.stderr
    again = await cluster.pygazette("apply", "--specs", str(specs), check=False)
    assert again.returncode != 0 and "ETCD_TRANSACTION_FAILED" in again.stderr

    # Inputs, read through, so that --lag is settled (0 everywhere).
    await cluster.publish("shards/in-a", keyed(50))
    await cluster.publish("shards/in-b", keyed(30))
    await cluster.wait_read_through("counter-000", "shards/in-a")
    await cluster.wait_read_through("counter-001", "shards/in-b")

    # Every listing gives the same shards, statuses and routes from both tools.
    parsers: dict[str, Callable[[str], Any]] = {
        "table": lambda text: [normalize_row(r) for r in parse_table(text)],
        "json": parse_list_json,
        "yaml": yaml.safe_load,
        "proto": parse_list_proto,
    }
    cases = [
        ("table", []),
        ("table", ["--primary", "--replicas", "--rf", "-L", "tier", "-L", "app"]),
        ("table", ["-l", "tier=gold", "-p", "-r"]),
        ("table", ["-l", "app=counter,tier!=gold", "-p", "--rf"]),
        ("table", ["--lag", "-p", "-r"]),
        ("json", []),
        ("json", ["-l", "id in (counter-000)"]),
        ("json", ["-l", "app=nope"]),
        ("yaml", []),
        ("proto", []),
    ]

    async def both(fmt: str, args: list[str]) -> tuple[Any, Any]:
        gaz, ours = await asyncio.gather(
            cluster.gazctl("list", "-o", fmt, *args), cluster.pygazette("list", "-o", fmt, *args)
        )
        return parsers[fmt](gaz.stdout), parsers[fmt](ours.stdout)

    listings = await asyncio.gather(*(both(fmt, args) for fmt, args in cases))
    for (fmt, args), (gaz_listing, our_listing) in zip(cases, listings, strict=True):
        assert gaz_listing == our_listing, (fmt, args)
    # JSON and protobuf text byte for byte (the header's revision aside: hints are stored
    # every second).
    masks = {
        "json": re.compile(r'"revision":"\d+"'),
        "proto": re.compile(r"(?m)^    revision: \d+$"),
    }
    for fmt, args in [
        (f, a) for f in masks for a in ([], ["-l", "id in (counter-000)"], ["-l", "app=nope"])
    ]:
        gaz, ours = await asyncio.gather(
            cluster.gazctl("list", "-o", fmt, *args),
            cluster.pygazette("list", "-o", fmt, *args),
        )
        mask = masks[fmt]
        assert mask.sub("R", ours.stdout) == mask.sub("R", gaz.stdout), (fmt, args)
    by_id = {r["ID"]: r for r in listings[4][0]}
    assert by_id["counter-000"]["STATUS"] == "PRIMARY"
    assert by_id["counter-000"]["PRIMARY"].endswith(":PRIMARY")
    assert by_id["counter-000"]["REPLICAS"].endswith(":STANDBY")
    assert by_id["counter-000"]["LAG"] == "shards/in-a:0"
    assert by_id["counter-001"]["LAG"] == "shards/in-b:0"
    assert [r["ID"] for r in listings[2][0]] == ["counter-001"]
    assert [r["ID"] for r in listings[3][0]] == ["counter-000"]
    assert [s["spec"]["id"] for s in listings[6][0]["shards"]] == ["counter-000"]
    assert listings[7][0]["shards"] == []
    doc = listings[5][0]
    assert [s["spec"]["id"] for s in doc["shards"]] == list(SHARDS)
    routes = {s["spec"]["id"]: s["route"] for s in doc["shards"]}
    assert len(routes["counter-000"]["members"]) == 2
    assert routes["counter-000"]["endpoints"][0] in {c.url for c in cluster.consumers}

    # The listed YAML applies back: delete one shard at its listed revision.
    listed_yaml = yaml.safe_load(
        (await cluster.gazctl("list", "-o", "yaml", "-l", "id=counter-001")).stdout
    )
    listed_yaml["shards"][0]["delete"] = True
    deletion = cluster.tmp / "delete.yaml"
    deletion.write_text(yaml.safe_dump(listed_yaml))
    await cluster.gazctl("apply", "--specs", str(deletion))
    assert [s.spec.id for s in await cluster.list_shards()] == ["counter-000"]
    await cluster.wait_for(lambda: not cluster.assignments("counter-001"), "unassigned shard")


def editor_script(path: Path, old: str, new: str) -> Path:
    path.write_text(f"#!/bin/sh\nsed -i 's/value: {old}/value: {new}/' \"$1\"\n")
    path.chmod(0o755)
    return path


def label_of(shard: cpb.ListResponse.Shard, name: str) -> str:
    return next((lb.value for lb in shard.spec.labels.labels if lb.name == name), "")


async def test_edit(cluster: Cluster) -> None:
    cluster.add_consumer()
    await cluster.gazctl("apply", "--specs", str(cluster.shardspace()))
    await cluster.wait_serving(*SHARDS)
    before = {s.spec.id: s for s in await cluster.list_shards()}

    to_silver = editor_script(cluster.tmp / "to-silver.sh", "gold", "silver")
    await cluster.gazctl("edit", "-l", "id=counter-001", editor=to_silver)
    after = {s.spec.id: s for s in await cluster.list_shards()}
    assert label_of(after["counter-001"], "tier") == "silver"
    assert after["counter-001"].mod_revision > before["counter-001"].mod_revision
    assert after["counter-000"] == before["counter-000"]

    # Nothing to change: gazctl aborts the edit and applies nothing.
    unchanged = await cluster.gazctl("edit", "-l", "id=counter-001", editor=to_silver)
    assert "nothing to do" in unchanged.stdout + unchanged.stderr
    assert {s.spec.id: s for s in await cluster.list_shards()} == after

    # pygazette's edit, seen by gazctl.
    to_bronze = editor_script(cluster.tmp / "to-bronze.sh", "silver", "bronze")
    await cluster.pygazette("edit", "-l", "tier=silver", editor=to_bronze)
    rows = parse_table((await cluster.gazctl("list", "-L", "tier")).stdout)
    assert {r["ID"]: r["TIER"] for r in rows} == {"counter-000": "<none>", "counter-001": "bronze"}
    # The shards kept running throughout.
    await cluster.wait_serving(*SHARDS)


async def test_lag_of_sources_not_read_yet(cluster: Cluster) -> None:
    """`--lag` names every source of a shard, as against Gazette's consumers (whose Stat
    answers each source from the shard's start, at 0 until read): here in-a has nothing,
    and in-b only a message still incomplete (no newline), which no transaction has read."""
    cluster.add_consumer()
    await cluster.gazctl("apply", "--specs", str(cluster.shardspace()))
    await cluster.wait_serving(*SHARDS)
    async with JournalClient(cluster.broker.url) as client:
        await append(client, "shards/in-b", b'{"key": "k')

    rows = parse_table((await cluster.gazctl("list", "--lag")).stdout)
    assert {r["ID"]: r["LAG"] for r in rows} == {
        "counter-000": "shards/in-a:0",
        "counter-001": "shards/in-b:10",
    }
    async with ShardClient(cluster.consumer_url) as shards:
        stat = await shards.stat("counter-001", {}, within=WAIT)
    assert dict(stat.read_through) == {"shards/in-b": 0}


async def test_unassign(cluster: Cluster) -> None:
    fail_on_poison = {"COUNTER_FAIL_ON": "poison"}
    cluster.add_consumer(fail_on_poison)
    cluster.add_consumer(fail_on_poison)
    await cluster.gazctl("apply", "--specs", str(cluster.shardspace()))
    await cluster.wait_serving(*SHARDS)
    first = {s: cluster.primary(s) for s in SHARDS}

    # A dry run names the shard and changes nothing.
    dry = await cluster.gazctl(
        "unassign", "-l", "id=counter-000", "--dry-run", "--log.level=info", "--log.format=json"
    )
    assert len(gazctl_log(dry.stderr, "Successfully unassigned shard: id=counter-000")) == 1
    ours = await cluster.pygazette("unassign", "-l", "id=counter-000", "--dry-run")
    assert "would unassign 1 shard(s)" in ours.stdout
    assert {s: cluster.primary(s) for s in SHARDS} == first

    # Unassigned: the allocator assigns the shard anew (a new assignment key).
    done = await cluster.gazctl(
        "unassign", "-l", "id=counter-000", "--log.level=info", "--log.format=json"
    )
    assert len(gazctl_log(done.stderr, "Successfully unassigned shard: id=counter-000")) == 1
    old_rev = first["counter-000"][1]  # type: ignore[index]
    await cluster.wait_for(
        lambda: (p := cluster.primary("counter-000")) is not None and p[1] > old_rev,
        "counter-000 reassigned",
    )
    assert cluster.primary("counter-001") == first["counter-001"]

    # A failed shard: --failed unassigns it, and only it.
    await cluster.publish("shards/in-b", [{"key": "poison"}])

    def failed() -> int | None:
        slot0 = cluster.assignments("counter-001").get(0)
        if slot0 is not None and slot0[2].code == cpb.ReplicaStatus.FAILED:
            return slot0[1]
        return None

    failed_rev = await cluster.wait_for(failed, "counter-001 to fail")
    healthy = cluster.primary("counter-000")
    gaz_rows, our_rows = parse_tables(
        (await cluster.gazctl("list", "-p", "-r")).stdout,
        (await cluster.pygazette("list", "-p", "-r")).stdout,
    )
    assert gaz_rows == our_rows
    assert {r["ID"]: r["STATUS"] for r in gaz_rows} == {
        "counter-000": "PRIMARY",
        "counter-001": "FAILED",
    }
    gaz_doc = parse_list_json((await cluster.gazctl("list", "-o", "json")).stdout)
    assert gaz_doc == parse_list_json((await cluster.pygazette("list", "-o", "json")).stdout)
    errors = [e for s in gaz_doc["shards"] for st in s["status"] for e in st["errors"]]
    assert any("cannot count key 'poison'" in e for e in errors), errors

    done = await cluster.gazctl(
        "unassign", "-l", "app=counter", "--failed", "--log.level=info", "--log.format=json"
    )
    unassigned = gazctl_log(done.stderr, "Successfully unassigned shard")
    assert [r["msg"].split("id=")[1].split(".")[0] for r in unassigned] == ["counter-001"]
    # Reassigned (where it fails again: every consumer fails on the poison message).
    await cluster.wait_for(
        lambda: any(r > failed_rev for _m, r, _s in cluster.assignments("counter-001").values()),
        "counter-001 reassigned",
    )
    assert cluster.primary("counter-000") == healthy
    # pygazette's --failed does the same, once the shard has failed again.
    refailed = await cluster.wait_for(failed, "counter-001 to fail again")
    ours = await cluster.pygazette("unassign", "-l", "app=counter", "--failed")
    assert "unassigned 1 shard(s)" in ours.stdout
    await cluster.wait_for(
        lambda: any(r > refailed for _m, r, _s in cluster.assignments("counter-001").values()),
        "counter-001 reassigned by pygazette",
    )
    assert cluster.primary("counter-000") == healthy


async def test_recover_with_gazettes_player(cluster: Cluster) -> None:
    consumer = cluster.add_consumer()
    await cluster.gazctl("apply", "--specs", str(cluster.shardspace()))
    await cluster.wait_serving(*SHARDS)
    sent = 0
    for n in (120, 80, 50):
        await cluster.publish("shards/in-a", keyed(n, sent))
        sent += n
        stat = await cluster.wait_read_through("counter-000", "shards/in-a")
    revision = await cluster.etcd_revision()
    await cluster.wait_hints_after("counter-000", revision)

    # The hints in etcd are JSON as Gazette's consumer writes them (Go's encoding/json of
    # recoverylog.FSMHints): its field names, nothing else, and what GetHints serves.
    stored = {}
    for key in ("primary", "backup.0"):
        kv = cluster.ks.get(f"{cluster.hints}/counter-000.{key}")
        assert kv is not None, key
        stored[key] = json_format.ParseDict(json.loads(kv.value), rpb.FSMHints())
    hints = await cluster.get_hints("counter-000")
    assert stored["primary"] == hints.primary_hints.hints
    assert stored["backup.0"] == hints.backup_hints[0].hints
    assert stored["primary"].log == f"{LOGS}/counter-000"
    assert len(stored["primary"].live_nodes) == 1  # state.json

    held = local_state(consumer, "counter-000")
    state, checkpoint = decode_document(held)
    assert state == {"counts": counts_of(sent)}
    assert checkpoint.sources["shards/in-a"].read_through == stat.read_through["shards/in-a"]

    gaz_dir = cluster.tmp / "gazctl-recovered"
    await cluster.gazctl("recover", "--id", "counter-000", "--dir", str(gaz_dir))
    assert sorted(p.name for p in gaz_dir.iterdir()) == ["state.json"]
    assert (gaz_dir / "state.json").read_bytes() == held

    our_dir = cluster.tmp / "pygazette-recovered"
    await cluster.pygazette("recover", "--id", "counter-000", "--dir", str(our_dir))
    assert (our_dir / "state.json").read_bytes() == held

    # A shard that has consumed nothing recovers to an empty directory (nothing recorded).
    empty_dir = cluster.tmp / "gazctl-empty"
    await cluster.gazctl("recover", "--id", "counter-001", "--dir", str(empty_dir))
    assert list(empty_dir.iterdir()) == []


def live_segments(hints: rpb.FSMHints) -> list[tuple[int, int]]:
    """(first, last) offsets of the hinted segments; the last one open-ended (last 0), as
    playback goes on past it."""
    segs = sorted(
        (s.first_offset, s.last_offset) for node in hints.live_nodes for s in node.segments
    )
    if segs:
        segs[-1] = (segs[-1][0], 0)
    return segs


def overlaps(segs: list[tuple[int, int]], frag: pb.Fragment) -> bool:
    return any(first < frag.end and (last == 0 or last > frag.begin) for first, last in segs)


async def test_prune_then_recover(cluster: Cluster) -> None:
    shard, log_name = "counter-000", f"{LOGS}/counter-000"
    first = cluster.add_consumer()
    await cluster.gazctl("apply", "--specs", str(cluster.shardspace()))
    await cluster.wait_serving(*SHARDS)

    # Several commits, each a rewrite of state.json: the log rolls several fragments.
    sent = 0
    for n in (100, 100, 100):
        await cluster.publish("shards/in-a", keyed(n, sent))
        sent += n
        await cluster.wait_read_through(shard, "shards/in-a")

    # Until hints of a completed recovery are in the backups, gazctl won't prune (a fresh
    # shard's backup hints have no live files). Hand the shard to a second consumer.
    second = cluster.add_consumer()
    first.stop()
    await cluster.wait_for(
        lambda: (p := cluster.primary(shard)) is not None and p[0] == second.member_id,
        "the hand-off",
    )
    for n in (100, 100):
        await cluster.publish("shards/in-a", keyed(n, sent))
        sent += n
        await cluster.wait_read_through(shard, "shards/in-a")
    await cluster.wait_hints_after(shard, await cluster.etcd_revision())

    hints = await cluster.get_hints(shard)
    assert len(hints.backup_hints) == 1 and hints.backup_hints[0].hints.live_nodes
    segments = [live_segments(h.hints) for h in [*hints.backup_hints, hints.primary_hints]]
    fragments = await cluster.fragments(log_name)
    expected = [(f.begin, f.end) for f in fragments if not any(overlaps(s, f) for s in segments)]
    earliest = min(s[0][0] for s in segments)
    assert expected == [(f.begin, f.end) for f in fragments if f.end <= earliest]
    assert expected and len(expected) < len(fragments), (expected, fragments)

    # gazctl refuses to prune a fragment that is not persisted yet: wait until they are.
    async def persisted() -> bool:
        frags = await cluster.fragments(log_name)
        return all(f.mod_time for f in frags if (f.begin, f.end) in expected)

    deadline = time.monotonic() + WAIT
    while not await persisted():
        assert time.monotonic() < deadline, "fragments were not persisted"
        await asyncio.sleep(0.2)

    def stored() -> set[str]:
        base = cluster.broker.file_root / log_name
        return {p.name for p in base.iterdir()} if base.exists() else set()

    files = {
        Path(fragment_content_path(f)).name: (f.begin, f.end)
        for f in await cluster.fragments(log_name)
        if f.mod_time
    }
    before = stored()
    assert set(files) <= before

    dry = await cluster.gazctl(
        "prune", "-l", f"id={shard}", "--dry-run", "--log.level=debug", "--log.format=json"
    )
    would = [(r["begin"], r["end"]) for r in gazctl_log(dry.stderr, "pruning fragment")]
    assert sorted(would) == expected
    assert stored() == before

    # pygazette's dry run finds the same fragments.
    ours = await cluster.pygazette(
        "prune", "-l", f"id={shard}", "--dry-run", "--file-root", str(cluster.broker.file_root)
    )
    rows = [r for r in parse_table(ours.stdout) if r.get("JOURNAL") == log_name]
    assert sorted((int(r["BEGIN"]), int(r["END"])) for r in rows) == expected

    done = await cluster.gazctl(
        "prune", "-l", f"id={shard}", "--log.level=info", "--log.format=json"
    )
    (metrics,) = gazctl_log(done.stderr, "finished pruning logs for all shards")
    assert (metrics["fragmentsPruned"], metrics["failedToRemove"]) == (len(expected), 0)
    removed = {name for name, span in files.items() if span in expected}
    assert len(removed) == len(expected)
    assert stored() == before - removed

    # A fresh consumer recovers the whole state from what is left.
    second.kill()
    third = cluster.add_consumer()
    await cluster.wait_for(
        lambda: (p := cluster.primary(shard)) is not None and p[0] == third.member_id,
        "recovery by a fresh consumer",
    )
    state, _cp = decode_document(local_state(third, shard))
    assert state == {"counts": counts_of(sent)}
    # And it goes on counting from there.
    await cluster.publish("shards/in-a", keyed(10, sent))
    sent += 10
    await cluster.wait_read_through(shard, "shards/in-a")
    state, _cp = decode_document(local_state(third, shard))
    assert state == {"counts": counts_of(sent)}

    # gazctl plays the pruned log too.
    await cluster.wait_hints_after(shard, await cluster.etcd_revision())
    recovered = cluster.tmp / "after-prune"
    await cluster.gazctl("recover", "--id", shard, "--dir", str(recovered))
    assert (recovered / "state.json").read_bytes() == local_state(third, shard)


SQLITE_SHARD = "counter-sqlite"
# One shard whose Counter store is a SQLiteStore compacting its log after 32 KiB of history
# (tests/consumer/apps.py); no backup hints, so that `shards prune` goes by the primary's.
SQLITE_SHARDSPACE = """\
common:
  recovery_log_prefix: shards/recovery
  hint_prefix: {hints}
  max_txn_duration: 100ms
shards:
- id: counter-sqlite
  sources:
  - journal: shards/in-a
"""


async def test_gazctl_recovers_a_compacted_sqlite_log(cluster: Cluster) -> None:
    """Gazette's Player plays a pygazette SQLite store's log from hints recorded after a
    compaction (the database recorded anew as a new file, renamed over the old), with every
    fragment before that compaction pruned: the database it writes opens with the rows the
    consumer holds, byte for byte what `pygazette shards recover` writes."""
    log_name = f"{LOGS}/{SQLITE_SHARD}"
    async with JournalClient(cluster.broker.url) as client:
        spec = journal_spec(log_name, RECOVERY_LOG, cluster.log_store, 1024)
        await apply_journals(client, [pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=0)])
    cluster.add_consumer()
    specs = cluster.tmp / "sqlite-shardspace.yaml"
    specs.write_text(SQLITE_SHARDSPACE.format(hints=cluster.hints))
    await cluster.gazctl("apply", "--specs", str(specs))
    await cluster.wait_serving(SQLITE_SHARD)

    # Commits (each its own transaction: the shard reads through each batch before the
    # next) until the recorded history passes the store's 32 KiB compaction threshold.
    sent = 0
    for n in (40,) * 12:
        await cluster.publish("shards/in-a", keyed(n, sent))
        sent += n
        await cluster.wait_read_through(SQLITE_SHARD, "shards/in-a")

    def hints_after_compaction() -> rpb.FSMHints | None:
        kv = cluster.ks.get(f"{cluster.hints}/{SQLITE_SHARD}.primary")
        if kv is None:
            return None
        hints = json_format.ParseDict(json.loads(kv.value), rpb.FSMHints())
        first = min((s.first_offset for n in hints.live_nodes for s in n.segments), default=0)
        return hints if first > 0 else None

    hints = await cluster.wait_for(hints_after_compaction, "hints after a compaction")
    assert len(hints.live_nodes) == 1  # store.sqlite, as one file node
    first = min(s.first_offset for n in hints.live_nodes for s in n.segments)

    # Remove every fragment before the compaction (once persisted, as prune requires).
    async def dead() -> list[pb.Fragment]:
        return [f for f in await cluster.fragments(log_name) if f.end <= first]

    deadline = time.monotonic() + WAIT
    while not (old := await dead()) or not all(f.mod_time for f in old):
        assert time.monotonic() < deadline, "fragments before the compaction not persisted"
        await asyncio.sleep(0.2)
    pruned = await cluster.pygazette(
        "prune", "-l", f"id={SQLITE_SHARD}", "--file-root", str(cluster.broker.file_root)
    )
    removed = {
        (int(r["BEGIN"]), int(r["END"]))
        for r in parse_table(pruned.stdout)
        if r.get("JOURNAL") == log_name
    }
    assert {(f.begin, f.end) for f in old} <= removed, pruned.stdout
    for f in old:
        assert not (cluster.broker.file_root / fragment_content_path(f)).exists()

    gaz_dir = cluster.tmp / "gazctl-sqlite"
    await cluster.gazctl("recover", "--id", SQLITE_SHARD, "--dir", str(gaz_dir))
    assert sorted(p.name for p in gaz_dir.iterdir()) == ["store.sqlite"]
    conn = apsw.Connection(str(gaz_dir / "store.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert dict(conn.execute("SELECT k, n FROM counts").fetchall()) == counts_of(sent)
    finally:
        conn.close()
    our_dir = cluster.tmp / "pygazette-sqlite"
    await cluster.pygazette("recover", "--id", SQLITE_SHARD, "--dir", str(our_dir))
    assert (our_dir / "store.sqlite").read_bytes() == (gaz_dir / "store.sqlite").read_bytes()
