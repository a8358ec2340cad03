"""The released `gazctl` against pygazette, compared with the same commands against Gazette.

One scripted session of `gazctl journals apply/list/append/read/fragments` runs against each
broker; every command must succeed or fail the same way, with the same output once
revisions, process ids and times are masked.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from pygazette.protocol.labels import label_set
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from pygazette.protocol.selector import parse_selector
from tests.interop.conftest import BROKER_ID
from tests.interop.scenario import record_content
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import EtcdServer, GazetteBinaries, GazetteBroker

JOURNALSPACE = """
name: ctl/
replication: 1
labels:
- name: app
  value: gazctl
fragment:
  length: 1024
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1s
children:
- name: ctl/events/
  labels:
  - name: topic
    value: events
  children:
  - name: ctl/events/part-000
  - name: ctl/events/part-001
  - name: ctl/events/part-002
- name: ctl/logs
  fragment:
    compression_codec: GZIP
  labels:
  - name: topic
    value: logs
- name: ctl/raw
  fragment:
    compression_codec: NONE
"""

TIMEOUT = 60


@dataclass
class Session:
    gazctl: Path
    url: str
    file_root: Path
    work: Path
    steps: list[tuple[str, object]]

    def run(
        self, *args: str, stdin: bytes = b"", env_cache: bool = False
    ) -> subprocess.CompletedProcess[bytes]:
        cmd = [str(self.gazctl), *args, f"--broker.address={self.url}", "--log.level=warn"]
        if env_cache:
            cmd.append("--broker.cache.size=64")
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=TIMEOUT, cwd=self.work)

    def step(self, name: str, *args: str, stdin: bytes = b"", **kw: bool) -> bytes:
        """Run a gazctl command and record its exit status and (masked) output."""
        proc = self.run(*args, stdin=stdin, **kw)
        self.steps.append(
            (
                name,
                {
                    "exit": proc.returncode,
                    "stdout": mask(proc.stdout.decode(errors="replace")),
                    "stderr": mask_errors(proc.stderr.decode(errors="replace")),
                },
            )
        )
        return proc.stdout


def mask(text: str) -> str:
    """Revisions, etcd ids, ports, times and ages vary between brokers and runs."""
    fields = r"(revision|mod_revision|create_revision|mod_time|cluster_id|member_id|raft_term)"
    text = re.sub(fields + r"(\"?:\s*\"?)\d+", r"\1\2N", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    # The fragments table's PERSISTED column ("now", "3 seconds ago"...), and the column
    # widths that follow from it.
    text = re.sub(r"│ (now|\d+ \w+ ago)\s*│", "│ AGE │", text)
    text = re.sub(r"─+", "─", text)
    return re.sub(r" +", " ", text)


def mask_errors(text: str) -> str:
    """gazctl's fatal log line, without its timestamp."""
    lines = [re.sub(r'time="[^"]*" ', "", line) for line in text.splitlines()]
    return "\n".join(line for line in lines if "level=fatal" in line or "level=error" in line)


def session(gazctl: Path, url: str, file_root: Path, work: Path) -> Session:
    work.mkdir(parents=True, exist_ok=True)
    return Session(gazctl, url, file_root, work, [])


def run_session(s: Session) -> None:
    specs = s.work / "journalspace.yaml"
    specs.write_text(JOURNALSPACE)

    s.step("apply --dry-run", "journals", "apply", "--specs", str(specs), "--dry-run")
    s.step("apply", "journals", "apply", "--specs", str(specs))
    s.step("apply again (stale revisions)", "journals", "apply", "--specs", str(specs))
    wait_assigned(s)

    s.step("list", "journals", "list")
    s.step("list selector", "journals", "list", "-l", "topic=events", "-L", "app,topic", "-p")
    s.step("list rf and stores", "journals", "list", "-l", "app=gazctl", "--rf", "--stores")
    s.step("list yaml", "journals", "list", "--format", "yaml")
    s.step("list json", "journals", "list", "-l", "name=ctl/raw", "--format", "json")
    s.step("list nothing", "journals", "list", "-l", "topic=nope")
    s.step("list bad selector", "journals", "list", "-l", "topic in (")

    # Edit through a YAML round trip: list, change, apply with the listed revisions.
    listed = s.run("journals", "list", "-l", "name=ctl/raw", "--format", "yaml").stdout.decode()
    edited = s.work / "edited.yaml"
    edited.write_text(
        listed.replace("compression_codec: NONE", "compression_codec: NONE\n  flush_interval: 2h")
    )
    s.step("apply edited", "journals", "apply", "--specs", str(edited))
    s.step("list edited", "journals", "list", "-l", "name=ctl/raw", "--format", "yaml")

    # Appends: one journal; records spread over a selector.
    raw = b""
    for n, size in enumerate([300, 900, 1200]):
        data = record_content("ctl/raw", n, size)
        s.step(f"append raw {n}", "journals", "append", "-l", "name=ctl/raw", stdin=data)
        raw += data
    s.step("append more raw", "journals", "append", "-l", "name=ctl/raw", stdin=b"tail\n")
    logs = b""
    for n, size in enumerate([2000, 2000, 2000, 100]):
        data = record_content("ctl/logs", n, size)
        s.step(f"append logs {n}", "journals", "append", "-l", "name=ctl/logs", stdin=data)
        logs += data
    # Each record follows its partition key, which maps it to a journal (modulo).
    events = b"".join(b"event %05d\n" % i for i in range(600))
    keyed = b"".join(
        b"key-%d\n" % (i * 7 % 31) + line for i, line in enumerate(events.splitlines(True))
    )
    s.step(
        "append events by key",
        "journals",
        "append",
        "-l",
        "topic=events",
        "--framing",
        "lines",
        "--mapping",
        "modulo",
        stdin=keyed,
    )
    s.step("append unknown", "journals", "append", "-l", "name=ctl/nope", stdin=b"x\n")

    # Reads.
    assert s.step("read raw", "journals", "read", "-l", "name=ctl/raw") == raw + b"tail\n"
    assert s.step("read logs", "journals", "read", "-l", "name=ctl/logs") == logs
    # gazctl reads the three journals concurrently: their interleaving is arbitrary.
    got = s.run("journals", "read", "-l", "topic=events").stdout
    assert sorted(got.splitlines()) == sorted(events.splitlines())
    for part in range(3):
        s.step(
            f"read events part {part}", "journals", "read", "-l", f"name=ctl/events/part-00{part}"
        )
    offsets = s.work / "offsets.json"
    offsets.write_text(json.dumps({"ctl/raw": 1500}))
    s.step(
        "read from offsets",
        "journals",
        "read",
        "-l",
        "name=ctl/raw",
        "--offsets",
        str(offsets),
        "--offsets-out",
        str(s.work / "offsets-out.json"),
    )
    s.steps.append(("offsets written", json.loads((s.work / "offsets-out.json").read_text())))
    s.step("read tail", "journals", "read", "-l", "name=ctl/raw", "--tail")
    s.step("read nothing", "journals", "read", "-l", "name=ctl/nope")

    # Fragments, once the rolled ones are persisted (listed as such by both brokers).
    # Fragments roll after a journal's first append, and once over 1024 bytes.
    wait_persisted(s, "ctl/raw", 2)
    wait_persisted(s, "ctl/logs", 3)
    s.step("fragments table", "journals", "fragments", "-l", "name=ctl/raw")
    # (Not of ctl/events: gazctl's AppendService batches records as the broker's latency
    # allows, so those fragments differ from run to run.)
    s.step(
        "fragments json",
        *("journals", "fragments", "-l", "name in (ctl/raw, ctl/logs)", "--format", "json"),
    )
    s.step(
        "fragments with urls",
        "journals",
        "fragments",
        "-l",
        "name=ctl/logs",
        "--format",
        "json",
        "--url-ttl",
        "1m",
    )
    # Direct reads of persisted fragments: gazctl opens their file:// URLs under --file-root.
    direct = s.step(
        "read direct",
        "journals",
        "read",
        "-l",
        "name=ctl/logs",
        "--file-root",
        str(s.file_root),
        env_cache=True,
    )
    assert direct == logs


def fragments_json(s: Session, journal: str) -> list[dict[str, object]]:
    proc = s.run("journals", "fragments", "-l", f"name={journal}", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line)["spec"] for line in proc.stdout.decode().splitlines() if line]


def wait_persisted(s: Session, journal: str, count: int) -> None:
    import time

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        frags = fragments_json(s, journal)
        if sum(1 for f in frags if f.get("backing_store")) >= count:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{journal}: fewer than {count} fragments persisted")


def wait_assigned(s: Session) -> None:
    import time

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        proc = s.run("journals", "list", "--format", "json")
        listed = json.loads(proc.stdout or b"{}").get("journals", [])
        if listed and all(j.get("route", {}).get("primary", -1) == 0 for j in listed):
            return
        time.sleep(0.1)
    raise TimeoutError("journals not assigned")


def test_gazctl_sessions_match(
    binaries: GazetteBinaries,
    pygazette: BrokerProcess,
    gazette: GazetteBroker,
    tmp_path: Path,
) -> None:
    ours = session(
        binaries.gazctl, pygazette.url, pygazette.data_dir / "fragments", tmp_path / "py-session"
    )
    theirs = session(binaries.gazctl, gazette.url, gazette.file_root, tmp_path / "go-session")
    run_session(theirs)
    run_session(ours)

    assert [name for name, _ in ours.steps] == [name for name, _ in theirs.steps]
    differences = [
        f"=== {name}\npygazette: {mine}\ngazette:   {gaz}"
        for (name, mine), (_, gaz) in zip(ours.steps, theirs.steps, strict=True)
        if mine != gaz
    ]
    assert not differences, "\n".join(differences)
    # The session did what it says.
    failed = {name for name, out in theirs.steps if isinstance(out, dict) and out.get("exit")}
    assert failed == {
        "apply again (stale revisions)",
        "list bad selector",
        "append unknown",
    }


WRITE_ONLY = """
name: ctl/write-only
replication: 1
flags: O_WRONLY
fragment:
  length: 1024
  compression_codec: NONE
  stores:
  - file:///
  refresh_interval: 1s
"""


def test_fragments_of_a_journal_that_may_not_be_read(
    binaries: GazetteBinaries,
    pygazette: BrokerProcess,
    gazette: GazetteBroker,
    etcd: EtcdServer,
    tmp_path: Path,
) -> None:
    """`journals fragments` of an O_WRONLY journal fails NOT_ALLOWED, as reads of it do (its
    fragments would name its content's URLs), on Gazette's broker and on pygazette's, alone
    or on etcd."""
    clustered = BrokerProcess(
        tmp_path / "clustered" / "data",
        extra_args=[
            *("--id", BROKER_ID, "--zone", "local", "--etcd", etcd.url),
            *("--etcd-prefix", f"/write-only-{uuid.uuid4().hex[:8]}"),
        ],
    )
    clustered.data_dir.parent.mkdir(parents=True)
    clustered.start()
    try:
        outcomes = []
        for name, url in [
            ("gazette", gazette.url),
            ("pygazette", pygazette.url),
            ("pygazette on etcd", clustered.url),
        ]:
            s = session(binaries.gazctl, url, tmp_path, tmp_path / name)
            specs = s.work / "journalspace.yaml"
            specs.write_text(WRITE_ONLY)
            assert s.run("journals", "apply", "--specs", str(specs)).returncode == 0
            wait_assigned(s)
            s.step("append", "journals", "append", "-l", "name=ctl/write-only", stdin=b"x\n")
            s.step("fragments", "journals", "fragments", "-l", "name=ctl/write-only")
            outcomes.append((name, s.steps))
    finally:
        clustered.kill()
    (_, gazettes), *others = outcomes
    assert [step["exit"] for _, step in gazettes] == [0, 1]  # type: ignore[index]
    assert "NOT_ALLOWED" in gazettes[1][1]["stderr"]  # type: ignore[index]
    for name, steps in others:
        assert steps == gazettes, name


async def _watched_snapshots(url: str, prefix: str) -> list[list[tuple[str, str]]]:
    """Snapshots of a List watch of `prefix` (journal names and their `version` label)
    while a journal is created, assigned a route, and then relabeled."""

    def spec(version: str) -> pb.JournalSpec:
        labels = label_set({"version": version})
        out = pb.JournalSpec(name=f"{prefix}one", replication=1, labels=labels)
        out.fragment.length = 1024
        out.fragment.refresh_interval.seconds = 1
        out.fragment.compression_codec = pb.NONE
        return out

    snapshots: list[list[tuple[str, str]]] = []
    arrived = asyncio.Event()
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        stub = pb_grpc.JournalStub(channel)  # type: ignore[no-untyped-call]
        selector = parse_selector(f"prefix={prefix}")
        stream = stub.List(pb.ListRequest(selector=selector, watch=True))

        async def collect() -> None:
            # A snapshot: a first response (its status and header), more journals, and a
            # response without journals, its end.
            pending: list[tuple[str, str]] | None = None
            async for resp in stream:
                journals = [(j.spec.name, j.spec.labels.labels[0].value) for j in resp.journals]
                if pending is None:
                    pending = journals
                elif journals:
                    pending += journals
                else:
                    snapshots.append(pending)
                    pending = None
                    arrived.set()

        async def until(cond: Callable[[], bool]) -> None:
            async with asyncio.timeout(TIMEOUT):
                while not cond():
                    arrived.clear()
                    await arrived.wait()

        async def assigned() -> int:
            """The journal's mod revision once it has a primary (else 0)."""
            async for resp in stub.List(pb.ListRequest(selector=selector)):
                for j in resp.journals:
                    if j.route.primary == 0:
                        return int(j.mod_revision)
            return 0

        task = asyncio.create_task(collect())
        try:
            await until(lambda: len(snapshots) == 1)
            change = pb.ApplyRequest.Change(upsert=spec("1"), expect_mod_revision=0)
            assert (await stub.Apply(pb.ApplyRequest(changes=[change]))).status == pb.OK
            async with asyncio.timeout(TIMEOUT):
                while not (revision := await assigned()):  # noqa: ASYNC110 (polls List)
                    await asyncio.sleep(0.05)
            change = pb.ApplyRequest.Change(upsert=spec("2"), expect_mod_revision=revision)
            assert (await stub.Apply(pb.ApplyRequest(changes=[change]))).status == pb.OK
            await until(lambda: bool(snapshots) and snapshots[-1] == [(f"{prefix}one", "2")])
        finally:
            task.cancel()
    return snapshots


def test_a_watch_sends_a_snapshot_per_spec_change_not_per_route_change(
    pygazette: BrokerProcess, gazette: GazetteBroker, etcd: EtcdServer, tmp_path: Path
) -> None:
    """`gazctl journals list --watch` (and every WatchedList: gazctl's reads, publishers'
    mappings) gets a new snapshot when a matching spec changes, as from Gazette's broker,
    not again when only a route does (here: the new journal's assignment)."""
    clustered = BrokerProcess(
        tmp_path / "clustered" / "data",
        extra_args=[
            *("--id", BROKER_ID, "--zone", "local", "--etcd", etcd.url),
            *("--etcd-prefix", f"/watch-{uuid.uuid4().hex[:8]}"),
        ],
    )
    clustered.data_dir.parent.mkdir(parents=True)
    clustered.start()
    try:
        expected = [[], [("watch/one", "1")], [("watch/one", "2")]]
        for url in (gazette.url, clustered.url, pygazette.url):
            assert asyncio.run(_watched_snapshots(url, "watch/")) == expected, url
    finally:
        clustered.kill()
