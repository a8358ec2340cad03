"""JSON values into Arrow columns of types Arrow's JSON reader cannot fill as Spark does.

Arrow's JSON reader (`framing.parse_json`) parses a column of a user schema straight into
its type, but not a map (it has no conversion to maps), a date (it takes a JSON string for
a date's number), nor binary as Spark reads it (Spark decodes base64 text, which is also how
the sink, like Spark's JSON writer, writes binary; Arrow keeps the text's bytes). A column
whose type holds any of them, at any depth, is built here from the records' values decoded
by orjson (but a column of dates, which Arrow reads as text and casts, `framing.parse_json`),
as Spark's JSON reader converts them: a map from an object, a date from its ISO
text (yyyy-MM-dd), binary from base64, a timestamp from ISO-8601 text (UTC without an
offset, as Arrow's reader takes it), a decimal from the number's text, and a string field
from a string, or from any other value as its JSON text.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import pyarrow as pa


class JSONValueError(ValueError):
    """A JSON value that the column's type cannot hold."""


def needs_conversion(t: pa.DataType) -> bool:
    """Whether a column of type `t` is built here rather than by Arrow's JSON reader."""
    import pyarrow as pa

    if pa.types.is_map(t) or pa.types.is_date(t) or pa.types.is_binary(t):
        return True
    if pa.types.is_struct(t):
        return any(needs_conversion(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return needs_conversion(t.value_type)
    return False


def column(values: Sequence[Any], t: pa.DataType) -> pa.Array:
    """An Arrow array of type `t` from JSON values (None for a missing field)."""
    import pyarrow as pa

    convert = _converter(t)
    try:
        return pa.array([None if v is None else convert(v) for v in values], type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise JSONValueError(str(exc)) from None


def _converter(t: pa.DataType) -> Callable[[Any], Any]:
    """A function from a JSON value (not None) to the Python value `pa.array` takes for `t`."""
    import pyarrow as pa

    if pa.types.is_map(t):
        key, item = _nullable(_converter(t.key_type)), _nullable(_converter(t.item_type))

        def to_map(v: Any) -> list[tuple[Any, Any]]:
            if not isinstance(v, dict):
                raise JSONValueError(f"expected an object for a map, not {_text(v)}")
            return [(key(k), item(x)) for k, x in v.items()]

        return to_map
    if pa.types.is_struct(t):
        fields = [
            (t.field(i).name, _nullable(_converter(t.field(i).type))) for i in range(t.num_fields)
        ]

        def to_struct(v: Any) -> dict[str, Any]:
            if not isinstance(v, dict):
                raise JSONValueError(f"expected an object, not {_text(v)}")
            return {name: convert(v.get(name)) for name, convert in fields}

        return to_struct
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _nullable(_converter(t.value_type))

        def to_list(v: Any) -> list[Any]:
            if not isinstance(v, list):
                raise JSONValueError(f"expected an array, not {_text(v)}")
            return [element(x) for x in v]

        return to_list
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda v: v if isinstance(v, str) else _text(v)
    if pa.types.is_binary(t):
        return _binary
    if pa.types.is_date(t):
        return _date
    if pa.types.is_timestamp(t):
        return _timestamp
    if pa.types.is_decimal(t):
        return lambda v: decimal.Decimal(v if isinstance(v, str) else _text(v))
    return lambda v: v  # Numbers and booleans: `pa.array` checks them against the type.


def _nullable(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else convert(v)


def _text(v: Any) -> str:
    return orjson.dumps(v).decode()


def _binary(v: Any) -> bytes:
    if not isinstance(v, str):
        raise JSONValueError(f"expected base64 text for binary, not {_text(v)}")
    try:
        return base64.b64decode(v, validate=True)
    except binascii.Error:
        raise JSONValueError(f"binary value {v[:40]!r} is not base64") from None


def _date(v: Any) -> datetime.date:
    if not isinstance(v, str):
        raise JSONValueError(f"expected a date as yyyy-MM-dd text, not {_text(v)}")
    try:
        return datetime.date.fromisoformat(v)
    except ValueError:
        raise JSONValueError(f"{v[:40]!r} is not a date (yyyy-MM-dd)") from None


def _timestamp(v: Any) -> datetime.datetime:
    if not isinstance(v, str):
        raise JSONValueError(f"expected a timestamp as ISO-8601 text, not {_text(v)}")
    try:
        when = datetime.datetime.fromisoformat(v)
    except ValueError:
        raise JSONValueError(f"{v[:40]!r} is not an ISO-8601 timestamp") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)
