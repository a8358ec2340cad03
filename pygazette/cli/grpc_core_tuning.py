"""The gRPC core experiments pygazette's processes turn off, set before gRPC loads.

grpcio (1.85) accepts and dials TCP connections through its EventEngine by default (the
`event_engine_listener` and `event_engine_client` experiments). Under `grpc.aio` each message
then takes more thread hand-offs between the EventEngine's threads, the completion-queue
poller and the event loop. With both off, gRPC uses its older polling TCP path, and on the
2-core VM a 4 KiB `grpc.aio` echo round trip cost the server ~150-190 µs of CPU instead of
~250 µs, at up to 1.8x the round trips a second (`bench/grpc_core_tuning.py` measures it).
Gazette's stream-sum on pygazette's brokers: ~10 % less broker CPU.

gRPC reads `GRPC_EXPERIMENTS` once, when its core library loads, so this runs at the process
entry point (`pygazette.cli.main.main`), before anything imports `grpc`. An experiment the
environment already names (either way) is left as it is, and `PYGAZETTE_GRPC_DEFAULTS=1`
keeps gRPC's own defaults altogether.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
DEFAULTS_ENV = "PYGAZETTE_GRPC_DEFAULTS"
EXPERIMENTS_OFF = ("event_engine_listener", "event_engine_client")


def tune_grpc_core(environ: MutableMapping[str, str] | None = None) -> bool:
    """Turn EXPERIMENTS_OFF off in `environ` (the process environment by default) unless it
    names them already; whether the setting can still take effect (gRPC not loaded yet)."""
    env = os.environ if environ is None else environ
    if env.get(DEFAULTS_ENV, "") not in ("", "0"):
        return False
    current = [e.strip() for e in env.get(EXPERIMENTS_ENV, "").split(",") if e.strip()]
    named = {e.lstrip("-") for e in current}
    missing = [f"-{e}" for e in EXPERIMENTS_OFF if e not in named]
    if missing:
        env[EXPERIMENTS_ENV] = ",".join([*current, *missing])
    return "grpc._cython.cygrpc" not in sys.modules
