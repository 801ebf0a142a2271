"""Arrow schemas of the projection's batch tables (each written as one line of columns),
and the tables of a batch's rows built from them."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["rows_table", "schema", "table"]

_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "int32[]": pa.list_(pa.int32()),
}


def schema(columns: str) -> pa.Schema:
    """The Arrow schema of ``"name:type name:type …"`` (a type of ``_TYPES``), in order."""
    fields = []
    for column in columns.split():
        name, _, kind = column.partition(":")
        fields.append((name, _TYPES[kind]))
    return pa.schema(fields)


def table(columns: Iterable[Sequence[Any]], schema: pa.Schema) -> pa.Table:
    """An Arrow table of ``schema`` from its columns as Python sequences, in order."""
    return pa.table(
        [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def rows_table(items: Iterable[Any], schema: pa.Schema) -> pa.Table:
    """An Arrow table of ``schema`` from objects with an attribute per column."""
    rows = list(map(operator.attrgetter(*schema.names), items))
    return table(zip(*rows, strict=True) if rows else [[] for _ in schema], schema)
