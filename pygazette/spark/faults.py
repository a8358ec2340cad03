"""Fault injection points of the sink, for the exactly-once tests. Inert unless the
environment variable PYGAZETTE_SPARK_FAULTS names a directory.

A test arms a fault by creating a token file in that directory; the first task to reach
the fault point claims the token (an atomic rename), so each fault fires exactly once:

- ``fail-after-append.<journal>``: raise right after an append to <journal> committed, as
  a task dying between two appends would.
- ``hang-after-append.<journal>``: after the append committed, create ``hung.<journal>``
  (holding the hung process's pid) and block, so the test can kill the query, or the
  executor running the task, in the middle of a micro-batch.

Journal names have '/' replaced by '~' in file names.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FAULTS_ENV = "PYGAZETTE_SPARK_FAULTS"


class InjectedFault(RuntimeError):
    """A fault armed by a test."""


def token_name(kind: str, journal: str) -> str:
    return f"{kind}.{journal.replace('/', '~')}"


def _claim(directory: Path, name: str) -> bool:
    try:
        os.rename(directory / name, directory / f"{name}.fired")
    except FileNotFoundError:
        return False
    return True


def after_append(journal: str) -> None:
    value = os.environ.get(FAULTS_ENV)
    if not value:
        return
    directory = Path(value)
    if _claim(directory, token_name("fail-after-append", journal)):
        raise InjectedFault(f"injected failure after appending to {journal}")
    if _claim(directory, token_name("hang-after-append", journal)):
        hung = directory / token_name("hung", journal)
        partial = directory / f"{hung.name}.tmp"
        partial.write_text(str(os.getpid()))
        os.rename(partial, hung)  # Seen whole, pid included.
        while True:
            time.sleep(60)
