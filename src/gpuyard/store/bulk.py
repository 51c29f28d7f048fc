"""Many rows into one table in one statement, cheaply on every backend.

SQLite: the driver's own executemany (one prepared statement, stepped per row in C).
PostgreSQL: one ``INSERT … SELECT * FROM unnest(:c0::type[], :c1::type[], …)`` with a
column of values per parameter. psycopg's executemany sends a prepared statement per
row in a pipeline (about 50-100 µs a row in Python), and a multi-row VALUES list is a
new, long query text per row count, which psycopg parses again every time (it caches
only short ones); the unnest statement is one short text whatever the row count, so it
is parsed once and prepared by the server, and each batch sends one array a column.

Rows hold the same keys; a column left out gets its Python-side default, as an
executemany would (with_defaults), or the server's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import JSON, Insert, Table, Text, bindparam, cast, column, func, insert, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection


def table_of(mapped: type[Any]) -> Table:
    """The table a mapped class is written to."""
    table = mapped.__table__
    assert isinstance(table, Table)
    return table


def with_defaults(table: Table, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every other column of ``table`` that has a Python-side default
    at that default, as an insert of ``values`` alone would store it."""
    scalars, callables = _defaults(table)
    row = {**scalars, **values}
    for key, make in callables:
        if key not in values:
            row[key] = make(None)
    return row


@lru_cache(maxsize=64)
def _defaults(table: Table) -> tuple[dict[str, Any], tuple[tuple[str, Any], ...]]:
    """``table``'s Python-side column defaults: the values, and the functions."""
    scalars: dict[str, Any] = {}
    callables: list[tuple[str, Any]] = []
    for col in table.columns:
        default = col.default
        if default is None or getattr(default, "is_sequence", False):
            continue
        arg = getattr(default, "arg", None)
        if getattr(default, "is_callable", False):
            callables.append((col.key, arg))
        elif getattr(default, "is_scalar", False):
            scalars[col.key] = arg
    return scalars, tuple(callables)


def insert_rows(conn: Connection, mapped: type[Any], rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT ``rows`` into the table of the mapped class ``mapped`` (see the module
    docstring)."""
    if not rows:
        return
    table = table_of(mapped)
    if conn.dialect.name != "postgresql" or len(rows) == 1:
        # The executemany fills in the defaults itself.
        conn.execute(insert(table), list(rows))
        return
    full = [with_defaults(table, r) for r in rows]
    varying: list[str] = []
    same: list[str] = []
    params: dict[str, Any] = {}
    for key in full[0]:
        values = [r[key] for r in full]
        first = values[0]
        if all(type(v) is type(first) and v == first for v in values):
            if first is None and table.c[key].server_default is None:
                continue  # NULL in every row: what leaving it out stores
            same.append(key)
            params[f"s{len(same) - 1}"] = json.dumps(first) if _is_json(table, key) else first
        else:
            if _is_json(table, key):
                # Sent as text and cast: an array of JSON lists would read as 2-D.
                values = [json.dumps(v) for v in values]
            varying.append(key)
            params[f"c{len(varying) - 1}"] = values
    if not varying:  # the same row again and again: nothing to unnest
        conn.execute(insert(table), list(rows))
        return
    conn.execute(_unnest_insert(table, tuple(varying), tuple(same)), params)


def _is_json(table: Table, key: str) -> bool:
    return isinstance(table.c[key].type, JSON)


def _sent_type(table: Table, key: str) -> Any:
    return Text() if _is_json(table, key) else table.c[key].type


@lru_cache(maxsize=128)
def _unnest_insert(table: Table, varying: tuple[str, ...], same: tuple[str, ...]) -> Insert:
    """INSERT … SELECT of a column of values for each of ``varying`` (unnest of one
    array each) and one value for each of ``same`` (a value every row shares is sent
    once, not once a row)."""
    types = [_sent_type(table, k) for k in varying]
    arrays = [bindparam(f"c{i}", type_=ARRAY(t)) for i, t in enumerate(types)]
    source = (
        func.unnest(*arrays)
        .table_valued(*(column(f"u{i}", t) for i, t in enumerate(types)))
        .render_derived()
    )
    picked = [*source.c] + [
        bindparam(f"s{i}", type_=_sent_type(table, k)) for i, k in enumerate(same)
    ]
    keys = [*varying, *same]
    return insert(table).from_select(
        keys,
        select(
            *(
                cast(c, table.c[k].type) if _is_json(table, k) else c
                for c, k in zip(picked, keys, strict=True)
            )
        ),
    )
