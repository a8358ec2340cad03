"""The CLI's standard output read by a process that goes away (`pygazette ... | head -1`): the
command ends as a Unix tool does, and as gazctl does (a Go program writing to a closed pipe
dies of SIGPIPE), quietly; a write that fails otherwise is still an error."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.support.broker_process import BrokerProcess
from tests.support.gazette_process import gazette_binaries

REPO = Path(__file__).resolve().parents[2]
JOURNAL = "pipe/lines"
CONTENT = b"".join(b"line %06d\n" % i for i in range(200_000))  # 2.4 MB: more than a pipe holds.


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("pipe") / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def journal(broker: BrokerProcess) -> str:
    async def create() -> None:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            spec = journal_spec(JOURNAL, length=1 << 22)
            assert (await apply_specs(stub, spec)).status == pb.OK
            for i in range(0, len(CONTENT), 1 << 20):
                assert (await append(stub, JOURNAL, CONTENT[i : i + (1 << 20)])).status == pb.OK

    asyncio.run(create())
    return JOURNAL


def _env(broker: BrokerProcess) -> dict[str, str]:
    env = dict(os.environ, BROKER_ADDRESS=broker.url)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _read_then_close(argv: list[str], env: dict[str, str], stdin: bytes = b"") -> tuple[int, str]:
    """Run `argv` with its stdout a pipe we read one byte of (none if it writes none) and
    then close, as `| head -c 1` does; (its exit status, its stderr)."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    proc.stdout.read(1)
    proc.stdout.close()
    try:
        err = proc.stderr.read()
        status = proc.wait(60)
    finally:
        proc.kill()
    return status, err.decode(errors="replace")


def _pygazette(*args: str) -> list[str]:
    return [sys.executable, "-m", "pygazette.cli.main", *args]


@pytest.mark.parametrize("block", [True, False], ids=["block", "to-head"])
def test_a_read_into_a_closed_pipe_dies_of_sigpipe_as_gazctl(
    broker: BrokerProcess, journal: str, block: bool
) -> None:
    flag = ["--block"] if block else []
    status, err = _read_then_close(
        _pygazette("journals", "read", "-l", f"name={journal}", *flag), _env(broker)
    )
    # Without the fix: status 1 (click's exit for any EPIPE).
    assert (status, err) == (-signal.SIGPIPE, "")

    gazctl = str(gazette_binaries().gazctl)
    status, err = _read_then_close(
        [
            gazctl,
            "journals",
            "read",
            "--broker.address",
            broker.url,
            "-l",
            f"name={journal}",
            *flag,
        ],
        _env(broker),
    )
    assert status == -signal.SIGPIPE, err

    # In a shell: status 141, as of any process killed by SIGPIPE; nothing on stderr.
    shell = subprocess.run(
        [
            *["bash", "-c", '"$@" | head -c 1 >/dev/null; echo "${PIPESTATUS[0]}"', "-"],
            *_pygazette("journals", "read", "-l", f"name={journal}", *flag),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=_env(broker),
        cwd=REPO,
        timeout=60,
    )
    assert (shell.stdout, shell.stderr) == (b"141\n", b"")


@pytest.mark.parametrize(
    "args",
    [
        ["journals", "list"],
        ["journals", "fragments", "-l", f"name={JOURNAL}"],
        ["journals", "read", "-l", f"name={JOURNAL}"],
        ["attach-uuids", "--format", "json"],
        ["--help"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_every_command_stops_quietly_once_its_reader_is_gone(
    broker: BrokerProcess, journal: str, args: list[str]
) -> None:
    # The reader is gone before the command writes anything.
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        proc = subprocess.run(
            _pygazette(*args),
            input=b'{"a": 1}\n' * 10,
            stdout=write_fd,
            stderr=subprocess.PIPE,
            env=_env(broker),
            cwd=REPO,
            timeout=60,
        )
    finally:
        os.close(write_fd)
    # Without the fix: status 1 (0 for --help), click's exit for any EPIPE.
    assert (proc.returncode, proc.stderr.decode()) == (-signal.SIGPIPE, "")


def test_a_write_that_fails_otherwise_is_still_an_error(
    broker: BrokerProcess, journal: str
) -> None:
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            _pygazette("journals", "list"),
            stdout=full,
            stderr=subprocess.PIPE,
            env=_env(broker),
            cwd=REPO,
            timeout=60,
        )
    assert proc.returncode == 1
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "No space left" in lines[0]
