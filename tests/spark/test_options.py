"""Options of the gazette data source: names, values, combinations, and their errors."""

from __future__ import annotations

import pytest

from pygazette.spark.framing import Framing
from pygazette.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    parse_read_options,
    parse_write_options,
)


def test_read_options_parse_case_insensitively() -> None:
    opts = parse_read_options(
        {
            "broker": "http://127.0.0.1:9",
            "journals": "in/x, in/y",
            "framing": "JSON",
            "startingoffsets": '{"in/y": 42, "in/x": -2}',
            "maxBytesPerTrigger": "1000",
            "maxrecordspertrigger": "10",
            "failOnDataLoss": "false",
            "minPartitions": "3",
            "FILEROOT": "/mnt/gazette//fragments/",
            "checkpointLocation": "/tmp/ignored",
        },
        streaming=True,
    )
    assert opts.journals == ("in/x", "in/y")
    assert opts.framing is Framing.JSON
    assert opts.starting.for_journal("in/y") == 42
    assert opts.starting.for_journal("in/x") == EARLIEST
    assert (opts.max_bytes_per_trigger, opts.max_records_per_trigger) == (1000, 10)
    assert opts.fail_on_data_loss is False and opts.min_partitions == 3
    assert opts.file_root == "/mnt/gazette/fragments"


def test_defaults_follow_the_kafka_source() -> None:
    batch = parse_read_options({"selector": "topic=x"}, streaming=False)
    assert (batch.starting.default, batch.ending.default) == (EARLIEST, LATEST)
    assert batch.framing is Framing.RAW and batch.fail_on_data_loss is True
    assert batch.selector == "topic=x" and batch.file_root is None
    stream = parse_read_options({"selector": "topic=x"}, streaming=True)
    assert stream.starting.default == LATEST


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({}, False, "name the journals to read"),
        ({"journals": "in/b", "selector": "topic=y"}, False, "not both"),
        (
            {"journals": "in/b", "startingOffset": "earliest"},
            False,
            "unknown option 'startingOffset'.*did you mean startingOffsets",
        ),
        ({"journals": "in/b", "path": "x"}, False, "takes no path"),
        ({"journals": "in/b", "keycolumn": "k"}, True, "keyColumn applies to writes, not to"),
        ({"journals": "in//b"}, False, "invalid journal name"),
        ({"selector": "!!"}, False, "option selector"),
        ({"journals": "in/b", "framing": "xml"}, False, "unknown framing"),
        ({"journals": "in/b", "startingOffsets": "soon"}, False, "earliest, latest or JSON"),
        ({"journals": "in/b", "startingOffsets": '{"in/b": -3}'}, False, "must be an integer"),
        ({"journals": "in/b", "startingOffsets": '{"in/d": 1}'}, False, "not read: in/d"),
        ({"journals": "in/b", "startingOffsets": "latest"}, False, "cannot be latest"),
        ({"journals": "in/b", "endingOffsets": "earliest"}, False, "cannot be earliest"),
        ({"journals": "in/b", "endingOffsets": "latest"}, True, "batch reads only"),
        ({"journals": "in/b", "maxBytesPerTrigger": "1"}, False, "streams only"),
        ({"journals": "in/b", "maxBytesPerTrigger": "0"}, True, "positive integer"),
        ({"journals": "in/b", "failOnDataLoss": "maybe"}, True, "true or false"),
        ({"journals": "in/b", "startingTimestamp": "yesterday"}, True, "milliseconds"),
        (
            {"journals": "in/b", "startingTimestamp": "1", "startingOffsets": "earliest"},
            True,
            "not both",
        ),
        ({"journals": "in/b", "broker": "ftp://x"}, True, "unsupported broker address"),
        ({"journals": "in/b", "fileRoot": "data/fragments"}, False, "fileRoot must be the abs"),
        ({"journals": "in/b", "fileRoot": " "}, True, "fileRoot must be the absolute path"),
        ({"journals": "in/b", "readCommitted": "true"}, False, "framing json or csv, not raw"),
        ({"journals": "in/b", "framing": "json", "readCommitted": "maybe"}, False, "true or"),
        ({"journals": "in/b", "framing": "json", "uuidField": "id"}, False, "applies to read"),
        (
            {"journals": "in/b", "framing": "csv", "readCommitted": "1", "uuidField": "id"},
            False,
            "framing json",
        ),
        (
            {"journals": "in/b", "framing": "json", "readCommitted": "1", "uuidField": " "},
            False,
            "must not be empty",
        ),
        (
            {"journals": "in/b", "framing": "json", "readCommitted": "1"}
            | {"readCommittedWaitSeconds": "5"},
            False,
            "applies to readCommitted streams",
        ),
        (
            {"journals": "in/b", "framing": "json", "readCommitted": "1"}
            | {"readCommittedWaitSeconds": "soon"},
            True,
            "positive number of seconds",
        ),
        (
            {"journals": "in/b", "framing": "json", "readCommitted": "1"}
            | {"readCommittedOnTimeout": "skip"},
            False,
            "applies to readCommitted streams",
        ),
        (
            {"journals": "in/b", "framing": "json", "readCommitted": "1"}
            | {"readCommittedOnTimeout": "ignore"},
            True,
            "fail \\(the default\\) or skip, not 'ignore'",
        ),
    ],
)
def test_bad_read_options_are_clear_errors(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        parse_read_options(options, streaming=streaming)


def test_read_committed_options() -> None:
    opts = parse_read_options(
        {"journals": "in/b", "framing": "json", "readCommitted": "true", "uuidField": "UUID"},
        streaming=True,
    )
    committed = opts.committed_reads(streaming=True)
    assert committed is not None and committed.wait and committed.wait_seconds == 60
    assert committed.framing.uuid_field == "UUID"  # type: ignore[attr-defined]
    assert not committed.skip_open  # A timeout fails the query unless asked otherwise.
    skipping = parse_read_options(
        {"journals": "in/b", "framing": "csv", "readCommitted": "true"}
        | {"readCommittedOnTimeout": " Skip "},
        streaming=True,
    ).committed_reads(streaming=True)
    assert skipping is not None and skipping.skip_open
    plain = parse_read_options({"journals": "in/b", "framing": "csv"}, streaming=False)
    assert plain.committed_reads(streaming=False) is None


def test_write_options() -> None:
    one = parse_write_options({"journals": "out/a"})
    assert one.journal == "out/a" and one.journals == ()
    mapped = parse_write_options(
        {"selector": "topic=out", "keyColumn": "user", "partitioner": "Rendezvous"}
    )
    assert mapped.key_column == "user" and mapped.partitioner == "rendezvous"
    by_column = parse_write_options({"framing": "json", "writerId": "load-1"})
    assert by_column.journal is None and by_column.framing is Framing.JSON
    assert by_column.writer_id == "load-1"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"journal": "in/b", "selector": "topic=y", "keyColumn": "k"}, "excludes options"),
        ({"journals": "in/b,in/d"}, "needs option keyColumn"),
        ({"keyColumn": "k"}, "needs option journals or selector"),
        (
            {"selector": "topic=y", "keyColumn": "k", "partitioner": "random"},
            "modulo or rendezvous",
        ),
        ({"journal": "in/b", "topic": "x"}, "unknown option 'topic'"),
        ({"journal": "in/b", "startingoffsets": "earliest"}, "startingOffsets applies to reads"),
        ({"journal": "in/b", "writerId": " "}, "option writerId is empty"),
    ],
)
def test_bad_write_options_are_clear_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_write_options(options)
