"""bench/raw_grpc_server.py, the baseline of bench/append_read.py and of the Go-client
benchmark's grpc.aio floor, runs gRPC's core as a `pygazette serve` broker does (the
EventEngine TCP experiments off, pygazette/cli/grpc_core_tuning.py), so that a ratio of
broker to baseline does not credit the broker with a gRPC setting the baseline lacks; and
bench/grpc_core_tuning.py's baseline mode still gets gRPC's defaults from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from grpc_core_tuning import _mode_env  # noqa: E402

from pygazette.cli.grpc_core_tuning import DEFAULTS_ENV, EXPERIMENTS_ENV  # noqa: E402

PROBE = (
    "import os, sys; sys.path.insert(0, 'bench'); import raw_grpc_server; "
    "import grpc._cython.cygrpc; print(os.environ.get('GRPC_EXPERIMENTS', ''))"
)


def experiments_in_raw_server(env: dict[str, str]) -> str:
    """GRPC_EXPERIMENTS as raw_grpc_server.py leaves it once it has loaded gRPC."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (EXPERIMENTS_ENV, DEFAULTS_ENV)}


def test_the_raw_server_runs_grpc_core_as_a_broker_does() -> None:
    got = experiments_in_raw_server(clean_env()).split(",")
    assert "-event_engine_listener" in got and "-event_engine_client" in got


def test_grpc_core_tuning_baseline_keeps_grpc_defaults_in_the_raw_server() -> None:
    assert experiments_in_raw_server(_mode_env("grpc_defaults")) == ""
    tuned = experiments_in_raw_server(_mode_env("pygazette")).split(",")
    assert "-event_engine_listener" in tuned and "-event_engine_client" in tuned
