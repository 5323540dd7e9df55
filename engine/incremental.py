"""The incremental step of a view over views: its inputs' changes in, its own changes out.

A view over views has table semantics: its rows are its SQL over its inputs' current rows.
For one batch, given each changed input's (previous row, new row) pairs:
1. the keys the changes can affect (engine.affected, from the view's lineage);
2. the input rows those keys are computed from: the rows of the input the key comes from
   with those keys, then, following the SQL's join equalities, the rows of each other
   input that join them;
3. the view's own SQL over those rows (Spark, a batch query over local relations): the
   affected keys' new rows;
4. compared with the stored rows of those keys: a key whose row appears, changes or
   disappears is a change of the view.
Nothing is subtracted, so a row leaving a WHERE or a group is retracted, and min, max,
count(DISTINCT) and max_by stay exact: the affected groups are recomputed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from engine.affected import KeysByLookup, UntraceableKey, plan_affected
from engine.driver_sql import OutsideSubset, Projection, schema_types
from engine.frames import frame_of, rows_of
from engine.lineage import Lineage
from schema.errors import Problem
from schema.storage import decode_row, encode_row

Row = dict[str, Any]
Key = tuple[Any, ...]
Change = tuple[Row | None, Row | None]  # (previous row, new row); None: absent


def json_form(row: Mapping[str, Any]) -> Row:
    """A row as Redis and the change feed hold it (datetimes as ISO-8601 UTC text, ...): the
    one form in which rows from Spark, from Delta and from change events compare equal."""
    return decode_row(encode_row(row))


_PLAIN = (str, int, float, bool, type(None))  # the same in JSON form


def json_value(value: Any) -> Any:
    """One value in JSON form (datetimes as text, ...)."""
    return value if isinstance(value, _PLAIN) else json_form({"v": value})["v"]


def row_key(row: Mapping[str, Any], columns: Sequence[str]) -> Key:
    """The row's key in JSON form."""
    if len(columns) == 1:  # most keys: without a generator, a third of the time
        return (json_value(row[columns[0]]),)
    return tuple(json_value(row[c]) for c in columns)


class CurrentRows(Protocol):
    """An input's rows as they are after this batch's changes to it."""

    def rows_where(self, table: str, column: str, values: set[Any]) -> list[Row]: ...


@dataclass(frozen=True)
class TableView:
    """What the incremental step needs of a view: its name, SQL, key, and the Spark schema
    of each input (to register the gathered rows under the names the SQL reads)."""

    name: str
    sql: str
    key: tuple[str, ...]
    inputs: Mapping[str, StructType]


def affected_keys(view: TableView, lineage: Lineage, changes: Mapping[str, Sequence[Change]],
                  current: CurrentRows) -> set[Key]:
    keys: set[Key] = set()
    for table, pairs in changes.items():
        rows = [row for pair in pairs for row in pair]
        plan = plan_affected(view.name, view.key, lineage, table)
        if isinstance(plan, KeysByLookup):
            found = current.rows_where(plan.table, plan.match, plan.values(rows))
            keys |= {row_key(r, plan.key_columns) for r in found}
        else:
            keys |= {row_key(r, plan.columns) for r in rows if r is not None}
    return keys


@dataclass(frozen=True)
class Read:
    """One read of the incremental step: the rows of `table` whose `column` is one of the
    values `via` gives (None: the affected keys' first column; else the `via` column of
    the rows read from `via_table`)."""

    table: str
    column: str
    via_table: str | None = None
    via: str | None = None


def gather_plan(view_name: str, key: Sequence[str], lineage: Lineage,
                inputs: Sequence[str]) -> list[Read]:
    """The reads step 2 makes: the input the key comes from by its key columns, then,
    following the join equalities, each other input by its join column."""
    traced = [lineage.source_of(k) for k in key]
    driving = traced[0].table  # plan_affected checked: every key column, one input
    plan = [Read(driving, traced[0].name)]
    planned = {driving}
    pending = True
    while pending:
        pending = False
        for left, right in lineage.equalities:
            for have, need in ((left, right), (right, left)):
                if have.table in planned and need.table not in planned:
                    plan.append(Read(need.table, need.name, have.table, have.name))
                    planned.add(need.table)
                    pending = True
    missing = [t for t in inputs if t not in planned]
    if missing:
        raise UntraceableKey(Problem(
            view_name, None,
            f"no join equality connects {', '.join(missing)} to {driving}, so the rows of "
            f"{', '.join(missing)} an affected key needs cannot be found",
            "join every input with an equality on columns (ON a.x = b.y)"))
    return plan


def _gather(view: TableView, lineage: Lineage, keys: set[Key],
            current: CurrentRows) -> dict[str, list[Row]]:
    """The input rows the affected keys are computed from (step 2 of the docstring)."""
    names = [lineage.source_of(k).name for k in view.key]
    gathered: dict[str, list[Row]] = {}
    for read in gather_plan(view.name, view.key, lineage, list(view.inputs)):
        if read.via_table is None:
            candidates = current.rows_where(read.table, read.column, {k[0] for k in keys})
            # By a one-column key, rows_where answered exactly the keys' rows.
            gathered[read.table] = candidates if len(names) == 1 else [
                r for r in candidates if row_key(r, names) in keys]
        else:
            values = {r[read.via] for r in gathered[read.via_table]} - {None}
            gathered[read.table] = current.rows_where(read.table, read.column, values)
    return gathered


def recompute(spark: SparkSession, view: TableView, gathered: Mapping[str, list[Row]],
              keys: set[Key]) -> dict[Key, Row]:
    """The view's SQL over the gathered rows: the affected keys' new rows. It replaces the
    session's temporary views of the inputs' names: give it a session of its own
    (`SparkSession.newSession()`), or hold engine.analyzer.SQL_LOCK."""
    for table, schema in view.inputs.items():
        frame_of(spark, gathered.get(table, []), schema).createOrReplaceTempView(table)
    return rows_by_key(rows_of(spark.sql(view.sql), sum(map(len, gathered.values()))),
                       view.key, keys)


def rows_by_key(rows: Iterable[Row], key: Sequence[str], keys: set[Key]) -> dict[Key, Row]:
    """The rows whose key (in JSON form) is one of `keys`, by it."""
    out = {}
    for row in rows:
        found = row_key(row, key)
        if found in keys:
            out[found] = row
    return out


class _Clock:
    """Per-step times of one view's incremental step, for the graph's debug log."""

    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, step: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[step] = (now - self.last) * 1000
            self.last = now


Evaluate = Callable[[Mapping[str, list[Row]], set[Key]], dict[Key, Row]]


class StoredRows(dict[Key, Row]):
    """A view's stored rows by key (JSON form), with the text Redis returned for each it
    read there (`texts`): changed_rows compares a new row with that text instead of
    encoding the stored row again. A row without a text (Delta filled it in) is encoded."""

    def __init__(self, rows: Mapping[Key, Row], texts: Mapping[Key, bytes]) -> None:
        super().__init__(rows)
        self.texts = texts


def projected_rows(view: TableView) -> Evaluate | None:
    """Step 3 in the driver for a view that picks, computes and filters the columns of one
    input with SQL engine.driver_sql evaluates as Spark does (`SELECT a, CAST(b AS DOUBLE)
    AS c FROM Order WHERE status <> 'cancelled'`): each gathered row, kept by the WHERE,
    gives one row. None for any other view (a join, a group, a function outside the
    subset): it keeps the Spark query."""
    if len(view.inputs) != 1:
        return None
    (table, schema), = view.inputs.items()
    try:
        projection = Projection.compile(view.sql, schema_types(schema))
    except OutsideSubset:
        return None
    if projection.table != table:
        return None

    def evaluate(gathered: Mapping[str, list[Row]], keys: set[Key]) -> dict[Key, Row]:
        return rows_by_key(projection.rows(gathered.get(table, [])), view.key, keys)
    return evaluate


def view_changes(spark: SparkSession, view: TableView, lineage: Lineage,
                 changes: Mapping[str, Sequence[Change]], current: CurrentRows,
                 stored: Callable[[set[Key]], Mapping[Key, Row]],
                 timings: dict[str, float] | None = None,
                 evaluate: Evaluate | None = None) -> dict[Key, Change]:
    """The view's changes for one batch of its inputs' changes: {key: (previous, new)},
    only the keys whose row appears, changes or disappears. Keys are in JSON form (`row_key`),
    `stored` answers rows in JSON form, new rows are as Spark computed them. `evaluate`
    answers the new rows in Spark's place for a view whose SQL it evaluates exactly
    (engine.projected_join, `projected_rows`); else step 3 is the Spark query."""
    clock = _Clock(timings)
    keys = affected_keys(view, lineage, changes, current)
    clock.lap("affected")
    if not keys:
        return {}
    gathered = _gather(view, lineage, keys, current)
    clock.lap("gather")
    new = None
    if evaluate is not None:
        try:
            new = evaluate(gathered, keys)
            clock.lap("driver")
        except OutsideSubset:  # a value Spark fails on (a division by zero): Spark says so
            pass
    if new is None:
        new = recompute(spark, view, gathered, keys)
        clock.lap("sql")
    old = stored(keys)
    clock.lap("stored")
    return changed_rows(keys, old, new)


def changed_rows(keys: set[Key], old: Mapping[Key, Row], new: Mapping[Key, Row]
                 ) -> dict[Key, Change]:
    """{key: (stored row, new row)} for the keys whose row appears, changes or disappears.
    Compared as JSON text: the stored row is in JSON form (or the text Redis holds, which
    encode_row wrote), the new one as Spark has it, and both list the view's columns in the
    same order."""
    texts = old.texts if isinstance(old, StoredRows) else {}
    out = {}
    for key in keys:
        before, after = old.get(key), new.get(key)
        if (before is None) != (after is None) or (
                after is not None
                and encode_row(after) != (texts.get(key) or encode_row(before))):
            out[key] = (before, after)
    return out
