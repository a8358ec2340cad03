"""The `pygazette` command: root options, logging, subcommand registration, and the one-line
error reporting every subcommand relies on.

    pygazette [--broker URL] [--log-level LEVEL] journals {list,apply,append,read,fragments,
                                                            prune,store-health}
    pygazette serve --port P --data-dir D
    pygazette attach-uuids [--format csv|json] [FILE...]

Expected failures (bad input, broker statuses, an unreachable broker) print a single line,
`error: ...`, on stderr and exit non-zero; the Gazette status name is part of that line when
a broker answered with one. Logging goes to stderr in logfmt, at "warning" unless asked.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from pygazette.cli import prune_cmd as _prune_cmd  # noqa: F401  (registers journals prune)
from pygazette.cli.attach_uuids_cmd import attach_uuids
from pygazette.cli.consumer_cmd import consumer
from pygazette.cli.journals_cmd import CliState, journals
from pygazette.cli.serve_cmd import serve
from pygazette.cli.shards_cmd import shards
from pygazette.client.journal_client import BROKER_ADDRESS_ENV, DEFAULT_BROKER
from pygazette.protocol.errors import BrokerError, GazetteError

_LOG_LEVELS = ["debug", "info", "warning", "error"]
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class LogfmtFormatter(logging.Formatter):
    """`time=... level=... logger=... msg="..." key=value ...` lines; `extra` fields included."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        fields: list[tuple[str, Any]] = [
            ("time", f"{ts}.{int(record.msecs):03d}Z"),
            ("level", record.levelname.lower()),
            ("logger", record.name),
            ("msg", record.getMessage()),
        ]
        fields.extend(
            (k, v) for k, v in record.__dict__.items() if k not in _RECORD_ATTRS and k[0] != "_"
        )
        line = " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields)
        if record.exc_info:
            line += " exc=" + _logfmt_value(self.formatException(record.exc_info))
        return line


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\n\t\\'):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if level.lower() != "debug":
        logging.getLogger("asyncio").setLevel(logging.WARNING)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--broker",
    envvar=BROKER_ADDRESS_ENV,
    default=DEFAULT_BROKER,
    show_default=True,
    metavar="URL",
    help=f"Broker address (also ${BROKER_ADDRESS_ENV}).",
)
@click.option(
    "--log-level",
    type=click.Choice(_LOG_LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    envvar="PYGAZETTE_LOG_LEVEL",
    help="Logging verbosity (logs go to stderr).",
)
@click.pass_context
def cli(ctx: click.Context, broker: str, log_level: str) -> None:
    """pygazette: Gazette journals and brokers, in Python."""
    configure_logging(log_level)
    ctx.obj = CliState(broker=broker)


cli.add_command(journals)
cli.add_command(serve)
cli.add_command(attach_uuids)
cli.add_command(shards)
cli.add_command(consumer)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int = 1) -> int:
    try:
        sys.stderr.write(f"error: {_one_line(message)}\n")
        sys.stderr.flush()
    except OSError:
        pass
    return code


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status, reporting expected errors in one line."""
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="pygazette",
            standalone_mode=False,
        )
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        return _fail(exc.format_message() + hint, exc.exit_code)
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        return _fail("interrupted", 130)
    except BrokerError as exc:
        return _fail(str(exc))
    except GazetteError as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): stop quietly.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 141
    except OSError as exc:
        return _fail(str(exc))
    return result if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
