"""Schema inference of CSV journals: the first record's fields, read as the CSV framing
reads records."""

from __future__ import annotations

import pytest

from pygazette.spark.inference import infer_csv
from pygazette.spark.schema import SchemaError


def columns(samples: list[bytes]) -> list[str]:
    return [f.name for f in infer_csv(samples).fields]


def test_a_field_larger_than_pythons_csv_limit() -> None:
    # Python's csv module refuses a field over 128 KiB ('field larger than field limit'):
    # inference failed on a journal Go's reader, and the framing, read without trouble.
    big = b"x" * (200 << 10)
    assert columns([b"a," + big + b",c\n"]) == ["_c0", "_c1", "_c2"]


def test_a_quoted_field_across_lines_is_one_record() -> None:
    # Inference split the sample at every line: the first record's quoted newline made its
    # first line a record of its own, of the wrong width.
    assert columns([b'"line one\nline two",b,c,d\n']) == ["_c0", "_c1", "_c2", "_c3"]


def test_blank_lines_and_samples_without_records_are_skipped() -> None:
    assert columns([b"\n\r\n", b"\n1,2\n"]) == ["_c0", "_c1"]
    with pytest.raises(SchemaError, match="no records to sample"):
        infer_csv([b"", b"\n"])


def test_json_fields_of_several_types_are_inferred_as_spark_infers_them() -> None:
    # Spark merges a field's types across records: long and double make a double, structs
    # and arrays merge, null gives way, and other types meet as string. Arrow's inference
    # refused a field of several types ('changed from number to string'), within a
    # journal's sample or between journals, and the read failed 'cannot infer a JSON schema'.
    from pygazette.spark.inference import infer_json

    first = (
        b'{"id": 1, "v": 1, "o": {"a": 1}, "n": null, "e": []}\n'
        b'{"id": "x-2", "v": 2.5, "o": {"b": [1, 2.5]}, "t": true}\n'
        b"\n"
    )
    second = b'{"v": 3, "o": {"a": "text"}, "w": [{"k": 1}, {"k": null, "j": "s"}]}\n'
    schema = infer_json([first, second])
    assert schema.simpleString() == (
        "struct<e:array<string>,id:string,n:string,o:struct<a:string,b:array<double>>,"
        "t:boolean,v:double,w:array<struct<j:string,k:bigint>>>"
    )
    assert infer_json([b'{"o": {"a": 1}}\n', b'{"o": 5}\n']).simpleString() == "struct<o:string>"
    with pytest.raises(SchemaError, match=r"cannot infer a JSON schema.*not an object"):
        infer_json([b"[1, 2]\n"])
