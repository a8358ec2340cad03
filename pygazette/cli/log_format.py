"""How pygazette's processes log: one line per event on stderr, as logfmt text or as JSON, the
event's `extra` fields (journal, shard, peer, ...) as fields of the line; and the servers'
`--log-level` / `--log-format` options (env `LOG_LEVEL` / `LOG_FORMAT`, as Gazette's
`--log.level` / `--log.format`).

    text: time=2024-05-01T12:00:00.123Z level=warning logger=pygazette.x msg="..." journal=a/b
    json: {"time": "2024-05-01T12:00:00.123Z", "level": "warning", "logger": "pygazette.x",
           "msg": "...", "journal": "a/b"}

A record's traceback, if it has one, is the `exc` field. This module depends on nothing else
in pygazette.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

__all__ = [
    "DEFAULT_LOG_LEVEL",
    "LEVEL_ALIASES",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "JsonFormatter",
    "LogfmtFormatter",
    "announce",
    "configure_from_options",
    "configure_logging",
    "log_options",
]

LOG_LEVELS = ["debug", "info", "warning", "error"]
# Also accepted: Gazette's (logrus's) level names.
LEVEL_ALIASES = {"warn": "warning", "trace": "debug", "fatal": "error"}
LOG_FORMATS = ["text", "json"]
DEFAULT_LOG_LEVEL = "warning"
_configured_format = "text"

_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_JSON_KEYS = frozenset({"time", "level", "logger", "msg", "exc"})


def _timestamp(record: logging.LogRecord) -> str:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{ts}.{int(record.msecs):03d}Z"


def _extra_fields(record: logging.LogRecord) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in record.__dict__.items() if k not in _RECORD_ATTRS and k[0] != "_"]


class LogfmtFormatter(logging.Formatter):
    """`time=... level=... logger=... msg="..." key=value ...` lines; `extra` fields included."""

    def format(self, record: logging.LogRecord) -> str:
        fields: list[tuple[str, Any]] = [
            ("time", _timestamp(record)),
            ("level", record.levelname.lower()),
            ("logger", record.name),
            ("msg", record.getMessage()),
        ]
        fields.extend(_extra_fields(record))
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, the `extra` fields (a field named
    like one of those is prefixed `fields.`, as logrus does), and `exc` for a traceback.
    Values JSON cannot represent are written as their `str()`."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extra_fields(record):
            doc[f"fields.{key}" if key in _JSON_KEYS else key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.stack_info:
            doc["exc"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def _normalize_level(level: str) -> str:
    level = level.lower()
    return LEVEL_ALIASES.get(level, level)


def configure_logging(level: str = DEFAULT_LOG_LEVEL, fmt: str = "text") -> None:
    """Log events at `level` and above to stderr, one line each in `fmt` ("text" or "json")."""
    level = _normalize_level(level)
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    global _configured_format
    _configured_format = fmt
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # asyncio's debug chatter (selector choice, slow callbacks) only when asked for.
    logging.getLogger("asyncio").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def announce(message: str, logger: str = "pygazette") -> None:
    """A start-up line for the operator, shown at any log level: as is on stderr, or as a
    JSON log line (level "info") when logging is JSON, so every line of that output parses."""
    if _configured_format != "json":
        click.echo(message, err=True)
        return
    record = logging.makeLogRecord({"name": logger, "levelno": logging.INFO, "msg": message})
    record.levelname = "INFO"
    sys.stderr.write(JsonFormatter().format(record) + "\n")
    sys.stderr.flush()


def configure_from_options(level: str | None, fmt: str) -> None:
    """Configure logging from a server subcommand's `--log-level`/`--log-format`.

    The level is the first of: the subcommand's `--log-level` flag; the root command's
    `--log-level` flag; the subcommand's `LOG_LEVEL`; the root's environment variable; the
    default. (A flag beats any environment variable; the subcommand beats the root.) The
    format is the subcommand's, unless only the root's `--log-format` flag gives one.
    """
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    if ctx is not None and root is not None and root is not ctx:
        root_fmt = root.params.get("log_format")
        if (
            isinstance(root_fmt, str)
            and root.get_parameter_source("log_format") is ParameterSource.COMMANDLINE
            and ctx.get_parameter_source("log_format") is ParameterSource.DEFAULT
        ):
            fmt = root_fmt.lower()
        sub_source = ctx.get_parameter_source("log_level")
        root_level = root.params.get("log_level")
        root_source = root.get_parameter_source("log_level")
        if level is None or (
            sub_source is ParameterSource.ENVIRONMENT and root_source is ParameterSource.COMMANDLINE
        ):
            level = root_level if isinstance(root_level, str) else level
    configure_logging(level or DEFAULT_LOG_LEVEL, fmt)


F = TypeVar("F", bound=Callable[..., Any])


def log_options(fn: F) -> F:
    """Decorate a click command with `--log-level` and `--log-format` (parameters `log_level`,
    None unless given, and `log_format`); the command calls `configure_from_options`."""
    fn = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS, case_sensitive=False),
        default="text",
        show_default=True,
        envvar="LOG_FORMAT",
        help="Log line format on stderr: text (logfmt) or json (also $LOG_FORMAT).",
    )(fn)
    fn = click.option(
        "--log-level",
        type=click.Choice([*LOG_LEVELS, *LEVEL_ALIASES], case_sensitive=False),
        default=None,
        envvar="LOG_LEVEL",
        help="Logging verbosity; overrides the root --log-level (also $LOG_LEVEL) "
        f"[default: the root's, else {DEFAULT_LOG_LEVEL}].",
    )(fn)
    return fn
