"""A JSON schema inferred from records' values, by the rules of Spark's JSON inference.

Each record's values are typed (null, boolean, long, double, string, array, struct), and
the types of a field across records (and journals) are merged as Spark's
`JsonInferSchema.compatibleType` merges them: null gives way to any type, long widens to
double, structs merge their fields and arrays their elements, and any other two types
meet as string. A field null in every record, or an array empty in every one, is a
string (Spark's rule). Struct fields are sorted by name. A sample Arrow's JSON reader typed
(each field of one type) enters the merge through `arrow_type`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
)

if TYPE_CHECKING:
    import pyarrow as pa

_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def value_type(value: Any) -> DataType:
    """The type Spark infers for one JSON value."""
    if value is None:
        return NullType()
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType() if _LONG_MIN <= value <= _LONG_MAX else DoubleType()
    if isinstance(value, float):
        return DoubleType()
    if isinstance(value, str):
        return StringType()
    if isinstance(value, list):
        element: DataType = NullType()
        for item in value:
            element = merge(element, value_type(item))
        return ArrayType(element, True)
    if isinstance(value, dict):
        return StructType([StructField(k, value_type(v), True) for k, v in sorted(value.items())])
    return StringType()


def merge(a: DataType, b: DataType) -> DataType:
    """The type of a field that has type `a` in some records and `b` in others."""
    if a == b:
        return a
    if isinstance(a, NullType):
        return b
    if isinstance(b, NullType):
        return a
    if {type(a), type(b)} == {LongType, DoubleType}:
        return DoubleType()
    if isinstance(a, StructType) and isinstance(b, StructType):
        fields = {f.name: f.dataType for f in a.fields}
        for f in b.fields:
            fields[f.name] = merge(fields[f.name], f.dataType) if f.name in fields else f.dataType
        return StructType([StructField(n, t, True) for n, t in sorted(fields.items())])
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(merge(a.elementType, b.elementType), True)
    return StringType()


def finish(t: DataType) -> DataType:
    """`t` with the types no value decided (null, an empty array's element) as string."""
    if isinstance(t, NullType):
        return StringType()
    if isinstance(t, ArrayType):
        return ArrayType(finish(t.elementType), True)
    if isinstance(t, StructType):
        return StructType([StructField(f.name, finish(f.dataType), True) for f in t.fields])
    return t


def arrow_type(t: pa.DataType | pa.Schema) -> DataType:
    """Spark's type for a type Arrow's JSON reader inferred (null stays null: `finish`)."""
    import pyarrow as pa
    import pyarrow.types as pt

    if isinstance(t, pa.Schema):
        t = pa.struct(list(t))
    if pt.is_null(t):
        return NullType()
    if pt.is_boolean(t):
        return BooleanType()
    if pt.is_integer(t):
        return LongType()
    if pt.is_floating(t):
        return DoubleType()
    if pt.is_struct(t):
        fields = sorted((t.field(i) for i in range(t.num_fields)), key=lambda f: f.name)
        return StructType([StructField(f.name, arrow_type(f.type), True) for f in fields])
    if pt.is_list(t) or pt.is_large_list(t):
        return ArrayType(arrow_type(t.value_type), True)
    return StringType()  # Strings, and timestamps Arrow parsed from strings.
