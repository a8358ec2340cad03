"""The real `pygazette journals ...` CLI, as a subprocess, against a real broker."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pygazette.cli.journalspace import apply_request, parse_journalspace
from tests.support.broker_process import BrokerProcess
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "journalspace.yaml"
EXAMPLE_JOURNALS = [
    "examples/clicks-per-user",
    "examples/clicks/part-000",
    "examples/clicks/part-001",
    "examples/logs/app",
    "examples/logs/audit",
]


def cli(
    broker_url: str,
    *args: str,
    stdin: bytes | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, BROKER_ADDRESS=broker_url, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pygazette.cli.main", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess[bytes]) -> bytes:
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


def one_line_error(proc: subprocess.CompletedProcess[bytes]) -> str:
    """The failure's stderr, which must be exactly one `error: ...` line."""
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.decode().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr.decode()
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def listed_names(broker: BrokerProcess, selector: str = "") -> list[str]:
    out = ok(cli(broker.url, "journals", "list", "-l", selector, "--format", "json"))
    return [j["spec"]["name"] for j in json.loads(out).get("journals", [])]


def apply_example(broker: BrokerProcess) -> None:
    out = ok(cli(broker.url, "journals", "apply", "--specs", str(EXAMPLE)))
    assert b"applied 5" in out


def test_apply_reads_stdin_without_specs(broker: BrokerProcess) -> None:
    """--specs defaults to '-' (stdin), as gazctl's: `kustomize build | journals apply`."""
    out = ok(cli(broker.url, "journals", "apply", stdin=EXAMPLE.read_bytes()))
    assert b"applied 5" in out
    assert sorted(listed_names(broker)) == sorted(EXAMPLE_JOURNALS)


def test_apply_then_list_in_every_format(broker: BrokerProcess) -> None:
    apply_example(broker)

    table = ok(cli(broker.url, "journals", "list")).decode()
    header, *rows = table.splitlines()
    assert header.split() == ["NAME", "RF", "PRIMARY", "REPLICAS", "LABELS", "REVISION"]
    assert [r.split()[0] for r in rows] == EXAMPLE_JOURNALS
    assert all(r.split()[1] == "1" for r in rows)

    assert listed_names(broker) == EXAMPLE_JOURNALS
    assert listed_names(broker, "topic=logs") == ["examples/logs/app", "examples/logs/audit"]
    assert listed_names(broker, "prefix=examples/clicks/") == EXAMPLE_JOURNALS[1:3]
    assert listed_names(broker, "name=examples/logs/audit") == ["examples/logs/audit"]

    hoisted = ok(cli(broker.url, "journals", "list", "--format", "yaml")).decode()
    tree = parse_journalspace(hoisted)
    assert tree.name == "examples/"
    flat_listed = {c.upsert.name: c.upsert for c in apply_request(tree).changes}
    flat_file = {
        c.upsert.name: c.upsert
        for c in apply_request(parse_journalspace(EXAMPLE.read_text())).changes
    }
    assert flat_listed == flat_file
    assert all(c.expect_mod_revision > 0 for c in apply_request(tree).changes)

    # The listed hierarchy applies back as is (its revisions are current)...
    ok(cli(broker.url, "journals", "apply", "--specs", "-", stdin=hoisted.encode()))
    # ...and a second time it is stale.
    stale = one_line_error(
        cli(broker.url, "journals", "apply", "--specs", "-", stdin=hoisted.encode())
    )
    assert "ETCD_TRANSACTION_FAILED" in stale


def test_dry_run_applies_nothing(broker: BrokerProcess) -> None:
    out = ok(cli(broker.url, "journals", "apply", "--specs", str(EXAMPLE), "--dry-run"))
    assert b'name: "examples/logs/audit"' in out
    assert listed_names(broker) == []


DRY_RUN_SPECS = """
name: dry/
replication: 2
labels:
- name: app
  value: café
- name: flag
fragment:
  length: 1048576
  compression_codec: GZIP
  stores: [file:///a/]
  refresh_interval: 30s
  retention: 0s
  path_postfix_template: date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}
flags: O_RDONLY
children:
- name: dry/a
  revision: 7
  max_append_rate: 1000
- name: dry/b
  delete: true
  revision: 3
"""

# What gazctl v0.103.0 prints for DRY_RUN_SPECS: proto.MarshalText of the ApplyRequest.
GAZCTL_DRY_RUN = """changes: <
  expect_mod_revision: 7
  upsert: <
    name: "dry/a"
    replication: 2
    labels: <
      labels: <
        name: "app"
        value: "caf\\303\\251"
      >
      labels: <
        name: "flag"
      >
    >
    fragment: <
      length: 1048576
      compression_codec: GZIP
      stores: "file:///a/"
      refresh_interval: <
        seconds: 30
      >
      path_postfix_template: "date={{ .Spool.FirstAppendTime.Format \\"2006-01-02\\" }}"
    >
    flags: 1
    max_append_rate: 1000
  >
>
changes: <
  expect_mod_revision: 3
  delete: "dry/b"
>
"""


def test_dry_run_prints_the_request_as_gazctl_does() -> None:
    """A dry run needs no broker and prints the ApplyRequest byte for byte as gazctl's."""
    out = ok(
        cli("http://127.0.0.1:1", "journals", "apply", "--dry-run", stdin=DRY_RUN_SPECS.encode())
    )
    assert out.decode() == GAZCTL_DRY_RUN


FRAGMENTED_SPECS = """
name: lines/
replication: 1
fragment:
  length: 1048576
  compression_codec: GZIP
  stores: [file:///]
  refresh_interval: 1s
children:
- name: lines/a
- name: lines/b
"""


def test_append_lines_and_read_back_byte_identical(broker: BrokerProcess, tmp_path: Path) -> None:
    ok(cli(broker.url, "journals", "apply", "--specs", "-", stdin=FRAGMENTED_SPECS.encode()))
    rng = random.Random(7)
    data = b"".join(b"%06d %s\n" % (i, b"x" * rng.randrange(0, 180)) for i in range(100_000))
    assert len(data) > 8 << 20  # More than one append.
    ok(
        cli(
            broker.url, "journals", "append", "-l", "name=lines/a", "--framing", "lines", stdin=data
        )
    )
    assert ok(cli(broker.url, "journals", "read", "-l", "name=lines/a")) == data

    # Each append ended on a line boundary, and fragments never split appends.
    frags = [
        json.loads(line)
        for line in ok(
            cli(broker.url, "journals", "fragments", "-l", "name=lines/a", "--format", "json")
        ).splitlines()
    ]
    ends = [int(f["spec"].get("end", 0)) for f in frags]
    assert ends[-1] == len(data)
    assert len(ends) >= 2
    assert all(data[end - 1 : end] == b"\n" for end in ends)

    # Reading from an offset, and a second append, unframed.
    offset = ends[0]
    assert (
        ok(cli(broker.url, "journals", "read", "-l", "name=lines/a", "--offset", str(offset)))
        == data[offset:]
    )
    ok(cli(broker.url, "journals", "append", "-l", "name=lines/b", stdin=b"no newline at end"))
    assert (
        ok(cli(broker.url, "journals", "read", "-l", "prefix=lines/"))
        == data + b"no newline at end"
    )


def test_binary_content_round_trips(broker: BrokerProcess) -> None:
    apply_example(broker)
    blob = os.urandom(3 << 20)
    ok(cli(broker.url, "journals", "append", "-l", "name=examples/clicks/part-001", stdin=blob))
    assert ok(cli(broker.url, "journals", "read", "-l", "name=examples/clicks/part-001")) == blob


def test_fragments_table_and_json(broker: BrokerProcess) -> None:
    apply_example(broker)
    ok(cli(broker.url, "journals", "append", "-l", "name=examples/logs/app", stdin=b"a\nb\n"))

    table = ok(cli(broker.url, "journals", "fragments", "-l", "topic=logs")).decode()
    header, *rows = table.splitlines()
    assert header.split()[:4] == ["JOURNAL", "BEGIN", "END", "LENGTH"]
    assert any(r.startswith("examples/logs/app") and "ZSTANDARD" in r for r in rows)

    out = ok(
        cli(
            broker.url,
            "journals",
            "fragments",
            "-l",
            "name=examples/logs/app",
            "--format",
            "json",
            "--url-ttl",
            "1h",
        )
    )
    (frag,) = [json.loads(line) for line in out.splitlines()]
    assert frag["spec"]["journal"] == "examples/logs/app"
    assert int(frag["spec"]["end"]) == 4


def test_blocking_read_streams_new_content(broker: BrokerProcess) -> None:
    apply_example(broker)
    env = dict(os.environ, BROKER_ADDRESS=broker.url, PYTHONPATH=str(REPO))
    reader = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "journals",
            "read",
            "-l",
            "topic=clicks",
            "--block",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        ok(
            cli(
                broker.url,
                "journals",
                "append",
                "-l",
                "name=examples/clicks/part-000",
                stdin=b"streamed\n",
            )
        )
        assert reader.stdout is not None
        got = b""
        timer = threading.Timer(60, reader.kill)  # Never hang the suite.
        timer.start()
        while len(got) < len(b"streamed\n"):
            chunk = reader.stdout.read1(1024)  # type: ignore[attr-defined]
            if not chunk:
                break
            got += chunk
        timer.cancel()
        assert got == b"streamed\n"
    finally:
        reader.terminate()
        reader.wait(30)


def test_garbage_yaml_is_one_line_and_applies_nothing(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: examples/\nchildren:\n  - name: [oops\n  ::: }}\n")
    err = one_line_error(cli(broker.url, "journals", "apply", "--specs", str(bad)))
    assert "invalid YAML" in err

    bad.write_text("name: examples/\nreplication: 1\nchildren:\n- name: examples/a b\n")
    err = one_line_error(cli(broker.url, "journals", "apply", "--specs", str(bad)))
    assert "examples/a b" in err

    # A valid tree whose second journal has an invalid spec: nothing at all is applied.
    bad.write_text(
        EXAMPLE.read_text().replace(
            "  - name: examples/logs/audit\n    replication: 1\n",
            "  - name: examples/logs/audit\n    replication: 9\n",
        )
    )
    err = one_line_error(cli(broker.url, "journals", "apply", "--specs", str(bad)))
    assert "examples/logs/audit" in err and "Replication" in err

    err = one_line_error(
        cli(broker.url, "journals", "apply", "--specs", str(tmp_path / "missing.yaml"))
    )
    assert "missing.yaml" in err
    assert listed_names(broker) == []


def test_a_delete_without_a_revision_is_refused_before_anything_applies(
    broker: BrokerProcess,
) -> None:
    """As gazctl (its ApplyRequest.Validate before any batch): a delete expects the journal's
    revision or -1. Sent as it was, the broker refused it only in its own batch, after the
    batches before it had applied."""
    specs = (
        "name: del/\nreplication: 1\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 1m}\n"
        "children:\n- name: del/one\n- name: del/two\n  delete: true\n"
    )
    for args in ([], ["--max-txn-size", "1"], ["--dry-run"]):
        err = one_line_error(
            cli(broker.url, "journals", "apply", "--specs", "-", *args, stdin=specs.encode())
        )
        assert "del/two" in err and "revision" in err, err
    assert listed_names(broker, "prefix=del/") == []


def test_invalid_selector(broker: BrokerProcess) -> None:
    for command in (["list"], ["read"], ["append"], ["fragments"]):
        err = one_line_error(cli(broker.url, "journals", *command, "-l", "topic in (", stdin=b"x"))
        assert "selector" in err


def test_unknown_journal_reports_the_status(broker: BrokerProcess) -> None:
    apply_example(broker)
    err = one_line_error(cli(broker.url, "journals", "read", "-l", "name=examples/nope"))
    assert err == "error: JOURNAL_NOT_FOUND: examples/nope"
    err = one_line_error(
        cli(broker.url, "journals", "append", "-l", "name=examples/nope", stdin=b"x")
    )
    assert err == "error: JOURNAL_NOT_FOUND: examples/nope"
    err = one_line_error(cli(broker.url, "journals", "fragments", "-l", "name=examples/nope"))
    assert "JOURNAL_NOT_FOUND" in err

    err = one_line_error(cli(broker.url, "journals", "append", "-l", "topic=logs", stdin=b"x"))
    assert "matches 2 journals" in err
    assert ok(cli(broker.url, "journals", "read", "-l", "topic=logs")) == b""


def test_broker_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    err = one_line_error(cli(url, "journals", "list"))
    assert err.startswith(f"error: broker unavailable at {url}")


def test_usage_errors_are_one_line() -> None:
    err = one_line_error(cli("http://127.0.0.1:1", "journals", "read"))
    assert "--selector" in err
    err = one_line_error(cli("http://127.0.0.1:1", "journals", "list", "--format", "xml"))
    assert "xml" in err


@pytest.mark.parametrize(
    "args", [["--help"], ["journals", "--help"], ["journals", "append", "--help"]]
)
def test_help(args: list[str]) -> None:
    out = ok(cli("http://127.0.0.1:1", *args)).decode()
    assert "Usage:" in out


def test_serve_refuses_an_id_gazette_would_reject(tmp_path: Path) -> None:
    err = one_line_error(
        cli("http://127.0.0.1:1", "serve", "--id", "ab", "--data-dir", str(tmp_path))
    )
    assert "Suffix: invalid length (2; expected 4 <= length <= 128)" in err


def test_serve_auto_suspend_needs_a_cluster(tmp_path: Path) -> None:
    err = one_line_error(
        cli("http://127.0.0.1:1", "serve", "--auto-suspend", "--data-dir", str(tmp_path))
    )
    assert "--auto-suspend needs --etcd" in err


def test_serve_on_a_data_directory_in_use_is_a_one_line_error(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    """A second broker on a running broker's data directory (a supervisor restarting one
    that is still persisting its spools, say) is refused in one line, not a traceback."""
    err = _serve_error(
        cli(broker.url, "serve", "--port", "0", "--data-dir", str(broker.data_dir), timeout=60)
    )
    assert "another broker is using data directory" in err


def test_serve_on_a_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    """`make serve` where something listens on 8080 already: one line naming the address and
    the flag, before the broker announces itself. gRPC's bind failure was a RuntimeError
    traceback ('Failed to bind to address 127.0.0.1:8080') after a C-core log line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("http://127.0.0.1:1", "serve", "--port", str(port), "--data-dir", str(tmp_path))
    assert one_line_error(proc) == (
        f"error: cannot serve gRPC on 127.0.0.1:{port}: Address already in use (another "
        "process listens there; --port picks another port)"
    )
    assert not proc.stdout


def test_serve_on_a_damaged_keyspace_file_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "keyspace.json").write_text("{not json")
    err = _serve_error(
        cli("http://127.0.0.1:1", "serve", "--port", "0", "--data-dir", str(tmp_path))
    )
    assert "cannot load keyspace" in err


def _serve_error(proc: subprocess.CompletedProcess[bytes]) -> str:
    """A failed `serve`'s error: one `error: ...` line, after what it announced starting."""
    assert proc.returncode != 0, proc.stdout
    stderr = proc.stderr.decode()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and lines[-1].startswith("error: "), stderr
    assert [line for line in lines if not line.startswith("pygazette broker ")] == lines[-1:]
    return lines[-1]


def test_read_resumes_from_offsets_and_writes_them_out(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """gazctl's --offsets / --offsets-out: a read goes on where the last one ended, and
    --tail starts at the write head; --output writes to a file."""
    apply_example(broker)
    part = "name=examples/clicks/part-000"
    ok(cli(broker.url, "journals", "append", "-l", part, stdin=b"one\ntwo\n"))
    offsets = tmp_path / "offsets.json"
    out = ok(cli(broker.url, "journals", "read", "-l", part, "--offsets-out", str(offsets)))
    assert out == b"one\ntwo\n"
    assert json.loads(offsets.read_text()) == {"examples/clicks/part-000": 8}

    ok(cli(broker.url, "journals", "append", "-l", part, stdin=b"three\n"))
    args = ["--offsets", str(offsets), "--offsets-out", str(offsets)]
    out = ok(cli(broker.url, "journals", "read", "-l", part, *args))
    assert out == b"three\n"
    assert json.loads(offsets.read_text()) == {"examples/clicks/part-000": 14}
    # The same path in and out keeps the input, as gazctl does.
    assert json.loads((tmp_path / "offsets.json.previous").read_text()) == {
        "examples/clicks/part-000": 8
    }

    assert ok(cli(broker.url, "journals", "read", "-l", part, "--tail")) == b""
    dest = tmp_path / "out.txt"
    assert ok(cli(broker.url, "journals", "read", "-l", part, "-o", str(dest))) == b""
    assert dest.read_bytes() == b"one\ntwo\nthree\n"

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    err = one_line_error(cli(broker.url, "journals", "read", "-l", part, "--offsets", str(bad)))
    assert "journal offsets" in err


def test_a_blocking_read_ended_by_sigterm_writes_its_offsets(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    apply_example(broker)
    part = "name=examples/clicks/part-000"
    ok(cli(broker.url, "journals", "append", "-l", part, stdin=b"one\n"))
    offsets = tmp_path / "offsets.json"
    env = dict(os.environ, BROKER_ADDRESS=broker.url, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "pygazette.cli.main", "journals", "read", "-l", part]
    reader = subprocess.Popen(
        [*command, "--block", "--offsets-out", str(offsets)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        assert reader.stdout is not None
        timer = threading.Timer(60, reader.kill)  # Never hang the suite.
        timer.start()
        got = reader.stdout.read1(1024)  # type: ignore[attr-defined]
        timer.cancel()
        assert got == b"one\n"
        reader.terminate()
        assert reader.wait(30) == 0, reader.stderr.read() if reader.stderr else ""
    finally:
        reader.kill()
        reader.wait(30)
    assert json.loads(offsets.read_text()) == {"examples/clicks/part-000": 4}


def test_list_columns_and_proto_formats_of_gazctl(broker: BrokerProcess) -> None:
    """gazctl's journals list -L/-p/-r/--rf/--stores columns and --format proto, and
    journals fragments --format proto."""
    from google.protobuf import text_format

    from pygazette.protocol.pb import protocol_pb2 as pb

    apply_example(broker)
    columns = ["-L", "topic", "--rf", "-p"]
    table = ok(cli(broker.url, "journals", "list", "-l", "topic=clicks", *columns)).decode()
    header, *rows = table.splitlines()
    assert header.split() == ["NAME", "RF", "PRIMARY", "TOPIC"]
    assert [r.split()[0] for r in rows] == EXAMPLE_JOURNALS[1:3]
    assert all(r.split()[-1] == "clicks" for r in rows)

    out = ok(cli(broker.url, "journals", "list", "-l", "topic=clicks", "-o", "proto"))
    listing = text_format.Parse(out.decode(), pb.ListResponse())
    assert [j.spec.name for j in listing.journals] == EXAMPLE_JOURNALS[1:3]

    part = "name=examples/clicks/part-000"
    ok(cli(broker.url, "journals", "append", "-l", part, stdin=b"one\n"))
    out = ok(cli(broker.url, "journals", "fragments", "-l", part, "-o", "proto"))
    fragments = text_format.Parse(out.decode(), pb.FragmentsResponse())
    assert [(f.spec.begin, f.spec.end) for f in fragments.fragments] == [(0, 4)]


def test_a_blocking_read_reads_journals_that_come_to_match(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """As gazctl's, a blocking read watches its selector: a journal created while it reads
    is read too."""
    apply_example(broker)
    ok(cli(broker.url, "journals", "append", "-l", "name=examples/clicks/part-000", stdin=b"a\n"))
    env = dict(os.environ, BROKER_ADDRESS=broker.url, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "pygazette.cli.main", "journals", "read"]
    reader = subprocess.Popen(
        [*command, "-l", "topic=clicks", "--block"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    timer = threading.Timer(60, reader.kill)  # Never hang the suite.
    timer.start()
    try:
        assert reader.stdout is not None
        assert reader.stdout.read1(1024) == b"a\n"  # type: ignore[attr-defined]
        # The read is under way: now a journal comes to match its selector.
        spec = tmp_path / "new.yaml"
        spec.write_text(
            "name: examples/clicks/part-002\nreplication: 1\n"
            "labels: [{name: topic, value: clicks}]\n"
            "fragment: {length: 1048576, stores: ['file:///'], refresh_interval: 1m,"
            " compression_codec: NONE}\n"
        )
        ok(cli(broker.url, "journals", "apply", "--specs", str(spec)))
        part = "name=examples/clicks/part-002"
        ok(cli(broker.url, "journals", "append", "-l", part, stdin=b"late\n"))
        assert reader.stdout.read1(1024) == b"late\n"  # type: ignore[attr-defined]
    finally:
        timer.cancel()
        reader.terminate()
        reader.wait(30)


def test_list_watch_prints_the_listing_again_as_it_changes(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """gazctl's journals list --watch."""
    apply_example(broker)
    env = dict(os.environ, BROKER_ADDRESS=broker.url, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "pygazette.cli.main", "journals", "list", "--watch"]
    watcher = subprocess.Popen(
        [*command, "-l", "topic=clicks", "-L", "topic"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    timer = threading.Timer(60, watcher.kill)  # Never hang the suite.
    timer.start()
    try:
        assert watcher.stdout is not None
        got = b""
        while b"part-001" not in got:
            chunk = watcher.stdout.read1(4096)  # type: ignore[attr-defined]
            assert chunk, got
            got += chunk
        spec = tmp_path / "new.yaml"
        spec.write_text(
            "name: examples/clicks/part-002\nreplication: 1\n"
            "labels: [{name: topic, value: clicks}]\n"
            "fragment: {length: 1048576, stores: ['file:///'], refresh_interval: 1m,"
            " compression_codec: NONE}\n"
        )
        ok(cli(broker.url, "journals", "apply", "--specs", str(spec)))
        while b"part-002" not in got:
            chunk = watcher.stdout.read1(4096)  # type: ignore[attr-defined]
            assert chunk, got
            got += chunk
        assert got.count(b"NAME") >= 2, got  # Printed again (route changes may add more).
    finally:
        timer.cancel()
        watcher.terminate()
        watcher.wait(30)


def test_fragments_json_is_gazctls() -> None:
    """journals fragments --format json writes each fragment as gazctl does (Go's
    encoding/json: numbers, the codec's number, zero fields left out, HTML escapes), so that
    scripts doing arithmetic on offsets work on both; checked byte for byte against gazctl
    v0.103.0 on the same broker."""
    from pygazette.cli.output import fragments_json_lines
    from pygazette.protocol.pb import protocol_pb2 as pb

    f = pb.FragmentsResponse._Fragment(
        spec=pb.Fragment(
            journal="ex/a",
            begin=0,
            end=8,
            sum=pb.SHA1Sum(part1=14341950437075156503, part2=5207123855917124875, part3=7),
            compression_codec=pb.SNAPPY,
            backing_store="s3://bucket/",
            mod_time=1796017127,
        ),
        signed_url="https://h/x?a=1&b=<2>",
    )
    assert fragments_json_lines([f]) == (
        '{"spec":{"journal":"ex/a","end":8,"sum":{"part1":14341950437075156503,'
        '"part2":5207123855917124875,"part3":7},"compression_codec":4,'
        '"backing_store":"s3://bucket/","mod_time":1796017127},'
        '"signed_url":"https://h/x?a=1\\u0026b=\\u003c2\\u003e"}\n'
    )
    assert fragments_json_lines([pb.FragmentsResponse._Fragment()]) == '{"spec":{"sum":{}}}\n'
