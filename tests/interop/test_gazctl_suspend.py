"""`gazctl journals suspend` against pygazette's brokers and against Gazette's, side by side.

Two brokers of each system on etcd, two journals at replication 2: one never written (it is
suspended FULL: no broker serves it), one written (in use: suspended only with --force, then
PARTIAL: one broker serves it). An append resumes it where it was. At every step both systems
must show the same suspension, offsets and number of brokers serving each journal.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker_cluster import BrokerCluster
from tests.support.gazette_process import EtcdServer, GazetteBinaries

pytestmark = pytest.mark.timeout(300)

JOURNALSPACE = """
name: susp/
replication: 2
fragment:
  length: 1048576
  compression_codec: NONE
  stores:
  - file:///
  refresh_interval: 1s
children:
- name: susp/busy
- name: susp/empty
"""
TIMEOUT = 60.0
# Brokers serving a journal at each suspension level (replication 2).
SERVED_BY = {"NONE": 2, "PARTIAL": 1, "FULL": 0}
SETTLING = ("INSUFFICIENT_JOURNAL_BROKERS", "NO_JOURNAL_PRIMARY_BROKER")


class Session:
    def __init__(self, gazctl: Path, cluster: BrokerCluster, work: Path) -> None:
        self.gazctl, self.cluster, self.work = gazctl, cluster, work
        work.mkdir(parents=True, exist_ok=True)
        self.steps: list[tuple[str, Any]] = []

    def run(self, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        """Run gazctl, again while the journal's route is still settling (gazctl's
        append gives up on those statuses at once)."""
        cmd = [
            str(self.gazctl),
            *args,
            f"--broker.address={self.cluster.brokers[0].url}",
            "--log.level=warn",
        ]
        deadline = time.monotonic() + TIMEOUT
        while True:
            proc = subprocess.run(
                cmd, input=stdin, capture_output=True, timeout=TIMEOUT, cwd=self.work
            )
            err = proc.stderr.decode(errors="replace")
            if proc.returncode == 0 or not any(s in err for s in SETTLING):
                break
            assert time.monotonic() < deadline, (args, err)
            time.sleep(0.1)
        assert proc.returncode == 0, (args, err)
        return proc

    def journals(self) -> dict[str, tuple[str, int, int]]:
        """Each journal's suspension level and offset, and how many brokers serve it."""
        out = self.run("journals", "list", "-l", "prefix=susp/", "--format", "json").stdout
        found = {}
        for j in json.loads(out).get("journals", []):
            suspend = j["spec"].get("suspend") or {}
            route = j.get("route") or {}
            members = route.get("members") or []
            primary = int(route.get("primary") or 0)
            found[j["spec"]["name"]] = (
                suspend.get("level") or "NONE",
                int(suspend.get("offset") or 0),
                len(members) if primary >= 0 or not members else -1,  # -1: no primary yet.
            )
        return found

    def settled(self, name: str) -> dict[str, tuple[str, int, int]]:
        """The journals once each is served by as many brokers as its suspension wants."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            found = self.journals()
            if found and all(SERVED_BY[level] == n for level, _, n in found.values()):
                self.steps.append((name, found))
                return found
            assert time.monotonic() < deadline, (name, found)
            time.sleep(0.1)


def run_session(s: Session) -> None:
    specs = s.work / "journalspace.yaml"
    specs.write_text(JOURNALSPACE)
    s.run("journals", "apply", "--specs", str(specs))
    s.settled("applied")
    s.run("journals", "append", "-l", "name=susp/busy", stdin=b"busy\n")

    s.run("journals", "suspend", "-l", "prefix=susp/")
    s.settled("suspend")
    s.run("journals", "suspend", "-l", "prefix=susp/", "--force")
    s.settled("suspend --force")
    s.run("journals", "append", "-l", "name=susp/busy", stdin=b"more\n")
    s.settled("append resumes")
    read = s.run("journals", "read", "-l", "name=susp/busy").stdout
    s.steps.append(("read", read.decode()))


def test_gazctl_suspend_matches_gazette(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    sessions = {}
    for system in ("gazette", "pygazette"):
        cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/suspend", brokers=2)
        cluster.start()
        try:
            s = Session(binaries.gazctl, cluster, tmp_path / system / "session")
            run_session(s)
            sessions[system] = s.steps
        finally:
            cluster.kill()
    assert sessions["pygazette"] == sessions["gazette"]
    # The session did what it says.
    assert dict(sessions["gazette"])["suspend"] == {
        "susp/busy": ("NONE", 0, 2),
        "susp/empty": ("FULL", 0, 0),
    }
    assert dict(sessions["gazette"])["suspend --force"]["susp/busy"] == ("PARTIAL", 5, 1)
    assert dict(sessions["gazette"])["read"] == "busy\nmore\n"


MOVED_JOURNALSPACE = """
name: susp/
replication: 2
fragment:
  length: 1048576
  compression_codec: NONE
  stores:
  - file:///
  refresh_interval: 1s
children:
- name: susp/moved
  suspend:
    level: PARTIAL
    offset: 100
"""


def run_moved_session(s: Session) -> None:
    """A journal suspended at 100 whose broker holds nothing of it (it moved, or its fragments
    expired): suspended again it stays at 100, and an append resumes it there."""
    specs = s.work / "journalspace.yaml"
    specs.write_text(MOVED_JOURNALSPACE)
    s.run("journals", "apply", "--specs", str(specs))
    s.settled("applied")
    s.run("journals", "suspend", "-l", "prefix=susp/")
    s.settled("suspend")
    s.run("journals", "append", "-l", "name=susp/moved", stdin=b"moved\n")
    s.settled("append resumes")


def test_gazctl_suspend_of_a_moved_journal_matches_gazette(
    binaries: GazetteBinaries, etcd: EtcdServer, tmp_path: Path
) -> None:
    sessions = {}
    for system in ("gazette", "pygazette"):
        cluster = BrokerCluster(system, binaries, etcd, tmp_path / system, "/suspend", brokers=2)
        cluster.start()
        try:
            s = Session(binaries.gazctl, cluster, tmp_path / system / "session")
            run_moved_session(s)
            sessions[system] = s.steps
        finally:
            cluster.kill()
    assert sessions["pygazette"] == sessions["gazette"]
    assert dict(sessions["gazette"])["suspend"] == {"susp/moved": ("FULL", 100, 0)}
