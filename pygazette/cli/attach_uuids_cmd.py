"""`pygazette attach-uuids`: stamp message UUIDs on JSON lines or CSV records, like
Gazette's `gazctl attach-uuids`.

Every record gets a UUID of one new producer, with a clock that only grows, flagged
OUTSIDE_TXN (committed): readers then process each record exactly once, however many times
the stamped output is appended. Stamp into a file first, then append the file: a failed
append can then be repeated without creating new messages.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import IO

import click
import orjson

from pygazette.cli.journals_cmd import CommandError
from pygazette.message.csv_framing import CSVFraming
from pygazette.message.uuid import OUTSIDE_TXN, Clock, UUIDFormatter, new_producer_id

READ_CHUNK = 1 << 20
CLOCK_UPDATE_SECONDS = 0.1


class _Stamper:
    """Hands out the UUIDs of one producer; its clock follows wall time."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.clock.update()
        self.formatter = UUIDFormatter(new_producer_id())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(CLOCK_UPDATE_SECONDS):
            self.clock.update()

    def next(self) -> str:
        return self.formatter.format(self.clock.tick(), OUTSIDE_TXN)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _records(stream: IO[bytes], fmt: str, max_length: int, name: str) -> Iterator[bytes]:
    """Records of the input, without their final newline."""
    csv = CSVFraming()
    pending = b""
    while True:
        chunk = stream.read(READ_CHUNK)
        data = pending + chunk if pending else chunk
        if fmt == "csv":
            records, consumed = csv.split(data)
        else:
            consumed = data.rfind(b"\n") + 1
            records = data[:consumed].split(b"\n")[:-1] if consumed else []
        pending = data[consumed:]
        if len(pending) > max_length:
            raise CommandError(f"{name}: a record is longer than --max-length ({max_length} bytes)")
        for record in records:
            if not record.strip():
                continue  # Blank lines hold no record.
            if len(record) > max_length:
                raise CommandError(
                    f"{name}: a record is longer than --max-length ({max_length} bytes)"
                )
            yield record
        if not chunk:
            if pending.strip():
                yield pending  # The last line, without a newline.
            return


@click.command("attach-uuids")
@click.argument("paths", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "json"]),
    default="csv",
    show_default=True,
    help="csv: the UUID becomes a new first column. json: each line is a JSON object, and "
    "the UUID becomes its field --field.",
)
@click.option("--field", default="uuid", show_default=True, help="JSON field for the UUID.")
@click.option("--skip-header", is_flag=True, help="Omit the first record of each input.")
@click.option(
    "--max-length",
    type=click.IntRange(min=1),
    default=4 << 20,
    show_default=True,
    help="Longest record allowed, in bytes.",
)
def attach_uuids(
    paths: tuple[str, ...], fmt: str, field: str, skip_header: bool, max_length: int
) -> None:
    """Stamp a message UUID on every record of the input files (or stdin) and write the
    records to stdout.

    CSV records (which may span lines, within quotes) are prefixed with a UUID column, as
    Gazette's CSV framing expects; JSON lines get the UUID as a field. UUIDs are flagged as
    committed, so readers process the records as soon as they are appended.

    \b
    Examples:
      pygazette attach-uuids --skip-header events.csv > stamped.csv
      pygazette attach-uuids --format json events.jsonl | \\
          pygazette journals append -l topic=events --framing lines
    """
    out = sys.stdout.buffer
    stamper = _Stamper()
    try:
        for path in paths or ("-",):
            stream = _open(path)
            try:
                _stamp(stream, path, out, stamper, fmt, field, skip_header, max_length)
            finally:
                if stream is not sys.stdin.buffer:
                    stream.close()
    finally:
        stamper.close()
        out.flush()


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")
    except OSError as exc:
        raise CommandError(f"cannot open {path}: {exc.strerror or exc}") from None


def _stamp(
    stream: IO[bytes],
    path: str,
    out: IO[bytes],
    stamper: _Stamper,
    fmt: str,
    field: str,
    skip_header: bool,
    max_length: int,
) -> None:
    name = "stdin" if path == "-" else path
    buf = bytearray()
    for n, record in enumerate(_records(stream, fmt, max_length, name), start=1):
        if skip_header and n == 1:
            continue
        if fmt == "csv":
            buf += stamper.next().encode()
            buf += b","
            buf += record
            buf += b"\n"
        else:
            try:
                obj = orjson.loads(record)
            except orjson.JSONDecodeError as exc:
                raise CommandError(f"{name}: record {n} is not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise CommandError(f"{name}: record {n} is not a JSON object")
            if field in obj:
                raise CommandError(f"{name}: record {n} already has a field {field!r}")
            buf += orjson.dumps({field: stamper.next(), **obj}, option=orjson.OPT_APPEND_NEWLINE)
        if len(buf) >= READ_CHUNK:
            out.write(buf)
            buf.clear()
    out.write(buf)
