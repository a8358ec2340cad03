"""Progress of long CLI operations: a rich progress display on stderr, on a terminal only."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def progress_display(description: str) -> Iterator[Callable[..., None]]:
    """On a terminal, a rich progress display on stderr; `update(description=..., total=...,
    completed=..., advance=...)` drives it. Elsewhere `update` does nothing."""
    if not sys.stderr.isatty():
        yield lambda **_: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=None)

        def update(**kwargs: Any) -> None:
            progress.update(task, **kwargs)

        yield update
