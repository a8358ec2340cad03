"""The gRPC core experiments the `pygazette` entry point turns off before gRPC loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pygazette.cli.grpc_core_tuning import (
    DEFAULTS_ENV,
    EXPERIMENTS_ENV,
    EXPERIMENTS_OFF,
    tune_grpc_core,
)


def test_turns_the_experiments_off_in_an_empty_environment() -> None:
    env: dict[str, str] = {}
    tune_grpc_core(env)
    assert env[EXPERIMENTS_ENV].split(",") == [f"-{e}" for e in EXPERIMENTS_OFF]


def test_keeps_what_the_environment_names_and_adds_the_rest() -> None:
    env = {EXPERIMENTS_ENV: "event_engine_client, other_experiment"}
    tune_grpc_core(env)
    assert env[EXPERIMENTS_ENV].split(",") == [
        "event_engine_client",  # Asked for on: left on.
        "other_experiment",
        "-event_engine_listener",
    ]


def test_is_idempotent() -> None:
    env: dict[str, str] = {}
    tune_grpc_core(env)
    once = dict(env)
    tune_grpc_core(env)
    assert env == once


def test_defaults_env_leaves_grpc_alone() -> None:
    env = {DEFAULTS_ENV: "1"}
    assert tune_grpc_core(env) is False
    assert EXPERIMENTS_ENV not in env


def test_the_entry_point_tunes_before_grpc_loads() -> None:
    """`main()` runs the tuning first; importing the CLI's entry module loads no gRPC, so
    the setting reaches gRPC's core when a subcommand loads it."""
    code = (
        "import json, os, sys\n"
        "import pygazette.cli.main as m\n"
        "loaded_before = 'grpc._cython.cygrpc' in sys.modules\n"
        "import atexit\n"
        "atexit.register(lambda: sys.stderr.write('\\nRESULT ' + json.dumps("
        "{'loaded_before': loaded_before, 'env': os.environ.get('GRPC_EXPERIMENTS')}) + '\\n'))\n"
        "m.main(['--help'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (EXPERIMENTS_ENV, DEFAULTS_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["loaded_before"] is False
    assert result["env"].split(",") == [f"-{e}" for e in EXPERIMENTS_OFF]
