"""Log lines: logfmt text and JSON formats, `--log-level`/`--log-format` precedence, and a
real `pygazette serve --log-format json` whose every stderr line parses as JSON."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import grpc
import grpc.aio
import pytest
from click.testing import CliRunner

from pygazette.cli.log_format import (
    JsonFormatter,
    LogfmtFormatter,
    configure_from_options,
    configure_logging,
    log_options,
)
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import protocol_pb2_grpc as pb_grpc
from tests.broker.rpc_helpers import append, apply_specs, journal_spec
from tests.support.broker_process import BrokerProcess


def _record(msg: str, level: int = logging.WARNING, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("pygazette.test")
    return logger.makeRecord(logger.name, level, __file__, 1, msg, (), None, extra=extra)


def test_json_lines_carry_time_level_logger_msg_and_the_extra_fields() -> None:
    record = _record("append failed", journal="a/b", peer="ipv4:1.2.3.4:5", size=3, obj={1})
    doc = json.loads(JsonFormatter().format(record))
    assert doc.pop("time").endswith("Z")
    assert doc == {
        "level": "warning",
        "logger": "pygazette.test",
        "msg": "append failed",
        "journal": "a/b",
        "peer": "ipv4:1.2.3.4:5",
        "size": 3,
        "obj": "{1}",  # Not JSON: its str().
    }


def test_json_fields_named_like_the_line_keys_are_prefixed_and_tracebacks_kept() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record = _record("oops", level=logging.ERROR)
        record.__dict__["level"] = "shadow"
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "error" and doc["fields.level"] == "shadow"
    assert doc["exc"].startswith("Traceback") and "ValueError: bad\nthing" in doc["exc"]


def test_logfmt_lines_quote_what_needs_quoting() -> None:
    line = LogfmtFormatter().format(_record("journal moved", journal="a/b", why='x "y"'))
    assert line.startswith("time=")
    assert line.endswith(
        ' level=warning logger=pygazette.test msg="journal moved" journal=a/b why="x \\"y\\""'
    )


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _app() -> click.Group:
    """A root command and a server subcommand, wired as `pygazette` and `serve` are."""

    @click.group()
    @click.option("--log-level", default="warning", envvar="PYGAZETTE_LOG_LEVEL")
    def root(log_level: str) -> None:
        configure_logging(log_level)

    @root.command()
    @log_options
    def sub(log_level: str | None, log_format: str) -> None:
        configure_from_options(log_level, log_format)
        root_logger = logging.getLogger()
        formatter = type(root_logger.handlers[0].formatter).__name__
        click.echo(f"{logging.getLevelName(root_logger.level).lower()} {formatter}")

    return root


@pytest.mark.parametrize(
    ("args", "env", "expect"),
    [
        ([], {}, "warning LogfmtFormatter"),
        (["--log-level", "info"], {}, "info LogfmtFormatter"),
        (["sub", "--log-level", "debug", "--log-format", "json"], {}, "debug JsonFormatter"),
        (["--log-level", "info", "sub", "--log-level", "error"], {}, "error LogfmtFormatter"),
        (["sub", "--log-level", "warn"], {}, "warning LogfmtFormatter"),  # Gazette's spelling.
        ([], {"LOG_LEVEL": "debug", "LOG_FORMAT": "json"}, "debug JsonFormatter"),
        ([], {"PYGAZETTE_LOG_LEVEL": "info", "LOG_LEVEL": "error"}, "error LogfmtFormatter"),
        # A flag beats an environment variable, the root's flag included.
        (["--log-level", "info"], {"LOG_LEVEL": "error"}, "info LogfmtFormatter"),
        (["sub", "--log-level", "info"], {"LOG_LEVEL": "error"}, "info LogfmtFormatter"),
    ],
)
def test_level_and_format_precedence(
    restore_logging: None, args: list[str], env: dict[str, str], expect: str
) -> None:
    if "sub" not in args:
        args = [*args, "sub"]
    env = {"PYGAZETTE_LOG_LEVEL": "", "LOG_LEVEL": "", "LOG_FORMAT": "", **env}
    result = CliRunner().invoke(_app(), args, env={k: v or None for k, v in env.items()})
    assert result.exit_code == 0, result.output
    assert result.output.strip() == expect


async def test_serve_writes_json_lines(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "data", extra_args=["--log-format", "json", "--log-level", "info"]
    )
    broker.start()
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.JournalStub(channel)
            await apply_specs(stub, journal_spec("logs/json"))
            assert (await append(stub, "logs/json", b"hello\n")).status == pb.OK
            raw = channel.unary_unary(
                "/protocol.Journal/Apply", request_serializer=None, response_deserializer=None
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw(b"\x07garbage", timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        broker.stop()
    lines = broker.log_path.read_text().splitlines()
    docs = [json.loads(line) for line in lines]  # Every line is one JSON object.
    for doc in docs:
        assert {"time", "level", "logger", "msg"} <= doc.keys(), doc
    by_msg = {doc["msg"]: doc for doc in docs}
    assert any(m.startswith("pygazette broker listening on") for m in by_msg)
    assert by_msg["broker serving"]["endpoint"] == f"http://127.0.0.1:{broker.port}"
    malformed = by_msg["malformed request"]
    assert malformed["level"] == "warning"
    assert malformed["method"] == "/protocol.Journal/Apply"
    assert malformed["peer"].startswith("ipv4:127.0.0.1:")
    assert "broker stopped" in by_msg
