"""A supervisor for the chaos cluster's processes, as Kubernetes would be for a real one.

A broker or summer that exits while no fault holds it down (it crashed, or exited by itself,
e.g. after losing its lease while frozen) is restarted on its data directory, and the exit
is recorded: the report lists every such exit, with its status and the log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from tests.support.broker_process import BrokerProcess

log = logging.getLogger("chaos.supervisor")


def start_with_retries(proc: BrokerProcess, attempts: int = 5) -> None:
    """Start `proc`, trying again if it exits early (e.g. etcd is restarting)."""
    for attempt in range(attempts):
        try:
            proc.start(90.0)
            return
        except (RuntimeError, TimeoutError):
            if attempt + 1 == attempts:
                raise
            with contextlib.suppress(Exception):
                proc.kill()
            time.sleep(1.0 + attempt)


class Supervisor:
    def __init__(self, procs: dict[str, BrokerProcess]) -> None:
        self.procs = procs
        self.held: set[str] = set()  # Down on purpose: a fault restarts them.
        self.exits: list[dict[str, Any]] = []

    async def run(self, stop: asyncio.Event, every: float = 1.0) -> None:
        while not stop.is_set():
            for name, proc in self.procs.items():
                if name in self.held or proc.proc is None or proc.running():
                    continue
                status = proc.proc.returncode
                self.exits.append({"process": name, "status": status, "log": proc.log()[-1500:]})
                log.warning("process exited; restarting", extra={"proc": name, "status": status})
                try:
                    await asyncio.to_thread(start_with_retries, proc)
                except Exception as exc:
                    self.exits.append({"process": name, "restart_failed": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
