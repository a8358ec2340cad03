"""The message-aware CLI, as subprocesses against a real broker: `journals append` of
records across a selector, `journals read` of many journals with message-aligned output,
and `attach-uuids`."""

from __future__ import annotations

import asyncio
import base64
import collections
import os
import subprocess
import sys
import threading

import orjson

from pygazette.client import JournalClient
from pygazette.message import (
    FixedFraming,
    ReadCommitted,
    ReadUncommitted,
    encode_fixed_frame,
    modulo_mapping,
    rendezvous_mapping,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from tests.cli.test_journals_cli import REPO, cli, ok, one_line_error
from tests.support.broker_process import BrokerProcess

SPECS = """
name: topic/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
fragment:
  length: 1048576
  compression_codec: SNAPPY
  stores: [file:///]
  refresh_interval: 1s
children:
- name: topic/csv/
  labels:
  - {name: topic, value: csv}
  - {name: content-type, value: text/csv}
  children: [{name: topic/csv/p0}]
- name: topic/fixed/
  labels:
  - {name: topic, value: fixed}
  - {name: content-type, value: application/x-protobuf-fixed}
  children: [{name: topic/fixed/p0}, {name: topic/fixed/p1}]
- name: topic/json/
  labels: [{name: topic, value: json}]
  children: [{name: topic/json/p0}, {name: topic/json/p1}, {name: topic/json/p2}]
"""

JSON_PARTS = ["topic/json/p0", "topic/json/p1", "topic/json/p2"]


def setup(broker: BrokerProcess) -> None:
    ok(cli(broker.url, "journals", "apply", "--specs", "-", stdin=SPECS.encode()))


def listing(names: list[str]) -> pb.ListResponse:
    resp = pb.ListResponse()
    for n in names:
        resp.journals.add(spec=pb.JournalSpec(name=n))
    return resp


def read_each(broker: BrokerProcess, journal: str) -> bytes:
    return ok(cli(broker.url, "journals", "read", "-l", f"name={journal}"))


def test_records_are_mapped_by_key_like_gazette(broker: BrokerProcess) -> None:
    setup(broker)
    keys = [f"user-{i % 13}" for i in range(2000)]
    mappings = {"modulo": modulo_mapping, "rendezvous": rendezvous_mapping}
    for name in mappings:
        data = b"".join(
            k.encode() + b"\n" + orjson.dumps({"k": k, "n": n, "m": name}) + b"\n"
            for n, k in enumerate(keys)
        )
        ok(
            cli(
                broker.url,
                "journals",
                "append",
                "-l",
                "topic=json",
                "-f",
                "lines",
                "-m",
                name,
                stdin=data,
            )
        )
    total = 0
    for journal in JSON_PARTS:
        got = [orjson.loads(line) for line in read_each(broker, journal).splitlines()]
        total += len(got)
        for name, make in mappings.items():
            expect = make(lambda k: k, listing(JSON_PARTS))
            mine = [m for m in got if m["m"] == name]
            assert all(expect(m["k"])[0] == journal for m in mine)  # Gazette's choice.
            ns = [m["n"] for m in mine]
            assert ns == sorted(ns)  # Order is kept within a journal.
    assert total == 4000

    # Base64 keys.
    data = b"".join(base64.b64encode(b"\x00key") + b"\n" + b'{"b64":1}\n' for _ in range(3))
    ok(
        cli(
            broker.url,
            "journals",
            "append",
            "-l",
            "topic=json",
            "-f",
            "lines",
            "-m",
            "modulo",
            "--base64",
            stdin=data,
        )
    )
    dest = modulo_mapping(lambda k: k, listing(JSON_PARTS))(b"\x00key")[0]
    assert read_each(broker, dest).count(b'{"b64":1}') == 3


def test_fixed_records_spread_at_random_and_read_back_whole(broker: BrokerProcess) -> None:
    setup(broker)
    payloads = [os.urandom(n % 300) for n in range(500)]
    data = b"".join(encode_fixed_frame(p) for p in payloads)
    ok(cli(broker.url, "journals", "append", "-l", "topic=fixed", "--framing", "fixed", stdin=data))
    parts = [read_each(broker, f"topic/fixed/p{i}") for i in range(2)]
    assert all(parts)  # Both journals got records.
    got = []
    for content in parts:
        frames, consumed = FixedFraming().split(content)
        assert consumed == len(content)
        got.extend(frames)
    assert collections.Counter(got) == collections.Counter(payloads)


def test_blocking_read_of_many_journals_never_interleaves_messages(broker: BrokerProcess) -> None:
    setup(broker)
    env = dict(os.environ, BROKER_ADDRESS=broker.url, PYTHONPATH=str(REPO))
    reader = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            "journals",
            "read",
            "-l",
            "topic=json",
            "--block",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        # Large messages (bigger than a read chunk), appended to every journal at once.
        big = [orjson.dumps({"n": n, "pad": "x" * (1_200_000 + n)}) + b"\n" for n in range(12)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pygazette.cli.main",
                    "journals",
                    "append",
                    "-l",
                    f"name={j}",
                    "-f",
                    "lines",
                ],
                stdin=subprocess.PIPE,
                env=env,
                cwd=REPO,
            )
            for j in JSON_PARTS
        ]
        for i, p in enumerate(procs):
            assert p.stdin is not None
            p.stdin.write(b"".join(big[i::3]))
            p.stdin.close()
        for p in procs:
            assert p.wait(120) == 0
        assert reader.stdout is not None
        timer = threading.Timer(120, reader.kill)  # Never hang the suite.
        timer.start()
        lines = []
        while len(lines) < len(big):
            line = reader.stdout.readline()
            if not line:
                break
            lines.append(line)
        timer.cancel()
    finally:
        reader.terminate()
        reader.wait(30)
    # Every output line is one whole message.
    assert sorted(orjson.loads(line)["n"] for line in lines) == list(range(12))


def test_attach_uuids_then_append_twice_is_read_once(
    broker: BrokerProcess, tmp_path: object
) -> None:
    setup(broker)
    events = b"".join(orjson.dumps({"event": n}) + b"\n" for n in range(200))
    stamped = ok(cli(broker.url, "attach-uuids", "--format", "json", stdin=events))
    msgs = [orjson.loads(line) for line in stamped.splitlines()]
    assert [m["event"] for m in msgs] == list(range(200)) and all("uuid" in m for m in msgs)
    # The stamped file is appended twice (say, a failed append was run again).
    for _ in range(2):
        ok(
            cli(
                broker.url,
                "journals",
                "append",
                "-l",
                "name=topic/json/p0",
                "-f",
                "lines",
                stdin=stamped,
            )
        )

    csv_in = b'a,b\nplain,1\n"multi\nline",2\n'
    stamped_csv = ok(cli(broker.url, "attach-uuids", "--skip-header", stdin=csv_in))
    ok(
        cli(
            broker.url,
            "journals",
            "append",
            "-l",
            "name=topic/csv/p0",
            "-f",
            "lines",
            stdin=stamped_csv,
        )
    )
    ok(
        cli(
            broker.url,
            "journals",
            "append",
            "-l",
            "name=topic/csv/p0",
            "-f",
            "lines",
            stdin=stamped_csv,
        )
    )

    async def read() -> tuple[list[object], list[object], list[list[str]]]:
        async with JournalClient(broker.url) as client:
            raw = [e.message["event"] async for e in ReadUncommitted(client, "topic/json/p0")]
            once = [e.message["event"] async for e in ReadCommitted(client, "topic/json/p0")]
            rows = [e.message[1:] async for e in ReadCommitted(client, "topic/csv/p0")]
            return raw, once, rows

    raw, once, rows = asyncio.run(read())
    assert len(raw) == 400
    assert once == list(range(200))
    assert rows == [["plain", "1"], ["multi\nline", "2"]]


def test_record_errors_are_one_line(broker: BrokerProcess) -> None:
    setup(broker)
    base = (broker.url, "journals", "append")
    err = one_line_error(cli(*base, "-l", "topic=json", "-f", "none", "-m", "modulo", stdin=b"x"))
    assert "--framing none may only be used with --mapping random" in err
    err = one_line_error(cli(*base, "-l", "topic=json", "-f", "lines", "--base64", stdin=b"x"))
    assert "--base64 requires" in err
    err = one_line_error(cli(*base, "-l", "topic=fixed", "-f", "fixed", stdin=b"not frames at all"))
    assert "not fixed-framed at byte 0" in err
    err = one_line_error(
        cli(*base, "-l", "topic=json", "-f", "lines", "-m", "modulo", stdin=b"key\nrec\nkey\n")
    )
    assert "partition key but no record" in err
    err = one_line_error(cli(*base, "-l", "topic=nope", "-f", "lines", stdin=b"x\n"))
    assert "no journal matches" in err
    err = one_line_error(
        cli(broker.url, "attach-uuids", "--format", "json", stdin=b'{"uuid": 1}\n')
    )
    assert "already has a field 'uuid'" in err
    err = one_line_error(cli(broker.url, "attach-uuids", "/nonexistent/file"))
    assert "/nonexistent/file" in err


def test_records_before_a_bad_record_are_appended_and_said_to_be(broker: BrokerProcess) -> None:
    """Input that turns bad midway (a key without its record, a broken frame) fails the
    command, after appending every record before the bad one: none of them is lost (they
    were queued, and were abandoned with the service), and the error says so."""
    setup(broker)
    records = [b'{"n": %d}\n' % i for i in range(300)]
    keyed = b"".join(b"k%d\n" % i + r for i, r in enumerate(records)) + b"dangling-key\n"
    err = one_line_error(
        cli(
            broker.url, "journals", "append", "-l", "name=topic/json/p0", "-f", "lines",
            "-m", "modulo", stdin=keyed,
        )
    )
    assert "partition key but no record" in err and "before it were appended" in err, err
    assert read_each(broker, "topic/json/p0") == b"".join(records)

    frames = b"".join(encode_fixed_frame(b"payload %d" % i) for i in range(300))
    err = one_line_error(
        cli(
            broker.url, "journals", "append", "-l", "name=topic/fixed/p0", "-f", "fixed",
            stdin=frames + b"not a frame",
        )
    )
    assert "fixed frame" in err and "before it were appended" in err, err
    assert read_each(broker, "topic/fixed/p0") == frames


def test_records_before_a_bad_key_in_the_same_chunk_are_appended(broker: BrokerProcess) -> None:
    """A bad partition key (not base64, or with --mapping direct a journal not selected)
    fails the command after appending the records read before it, in the same piece of
    input too, as its error says."""
    setup(broker)
    err = one_line_error(
        cli(
            broker.url, "journals", "append", "-l", "name=topic/json/p0", "-f", "lines",
            "-m", "modulo", "--base64", stdin=b'a2V5\n{"n": 1}\n!!!\n{"n": 2}\n',
        )
    )
    assert "not base64" in err and "before it were appended" in err, err
    assert read_each(broker, "topic/json/p0") == b'{"n": 1}\n'

    err = one_line_error(
        cli(
            broker.url, "journals", "append", "-l", "name=topic/json/p1", "-f", "lines",
            "-m", "direct", stdin=b'topic/json/p1\n{"n": 3}\ntopic/json/p0\n{"n": 4}\n',
        )
    )
    assert "'topic/json/p0' not found" in err and "before it were appended" in err, err
    assert read_each(broker, "topic/json/p1") == b'{"n": 3}\n'


def test_an_unterminated_last_line_is_refused_not_appended(broker: BrokerProcess) -> None:
    """With --framing lines, input ending within a line fails (as gazctl's unexpected EOF):
    appended, the line would run into the journal's next record. The records before it are
    appended."""
    setup(broker)
    err = one_line_error(
        cli(
            broker.url, "journals", "append", "-l", "name=topic/json/p0", "-f", "lines",
            stdin=b'{"n": 1}\n{"n": 2}\n{"n": ',
        )
    )
    assert "without a final newline" in err and "before it were appended" in err, err
    part = "name=topic/json/p0"
    ok(cli(broker.url, "journals", "append", "-l", part, "-f", "lines", stdin=b'{"n": 3}\n'))
    assert read_each(broker, "topic/json/p0") == b'{"n": 1}\n{"n": 2}\n{"n": 3}\n'
