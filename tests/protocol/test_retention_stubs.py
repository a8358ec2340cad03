"""The committed stubs of pygazette's own Retention service match retention.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO = "pygazette/protocol/pb/retention.proto"
GENERATED = ["retention_pb2.py", "retention_pb2.pyi", "retention_pb2_grpc.py"]


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            PROTO,
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "pygazette/protocol/pb" / name).read_bytes()
        committed = (REPO / "pygazette/protocol/pb" / name).read_bytes()
        assert fresh == committed, f"{name} is stale: regenerate with `make proto`"
