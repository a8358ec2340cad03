"""`pygazette consumer serve` (pygazette/cli/run_consumer.py): flags checked before start-up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def consumer_serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    serve = ["consumer", "serve", "--app", "examples.word_count.counter:Counter"]
    if "--port" not in args:
        serve += ["--port", "0"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pygazette.cli.main",
            *serve,
            "--data-dir",
            str(tmp_path / "data"),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--id", "c1"], "Suffix: invalid length (2; expected 4 <= length <= 128)"),
        (["--zone", "a zone", "--id", "counter-1"], "Zone: not a valid token"),
    ],
)
def test_an_id_gazette_would_reject_is_refused_at_start(
    tmp_path: Path, args: list[str], why: str
) -> None:
    """A member ID its group cannot decode (Gazette's ProcessSpec.ID rules) is one usage
    error naming the flag, before the process joins; it used to register, find itself
    'undecodable' and leave with 'member key ... is not in the keyspace'."""
    proc = consumer_serve(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: invalid --zone/--id:"), proc.stderr
    assert why in lines[-1]
    assert "undecodable" not in proc.stderr
    assert not (tmp_path / "data").exists()


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    """gRPC's bind failure was a RuntimeError traceback after a C-core log line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = consumer_serve(tmp_path, "--port", str(port), "--id", "counter-1")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: cannot serve gRPC on 127.0.0.1:{port}: Address already in use (another "
        "process listens there; --port picks another port)"
    ]
