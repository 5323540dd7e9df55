"""The view catalog: sources, views and how their GraphQL types map to Spark columns.

Declarations are plain frozen dataclasses. `Catalog.validate` checks the structure
(names, keys, indexes, relationships, durations) without Spark; the engine checks the
SQL output against the type with `compare_columns` once Spark has analysed the query.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import strawberry
from strawberry.schema.config import StrawberryConfig
from strawberry.types.base import StrawberryOptional

from schema.errors import CatalogError, Problem
from schema.permissions import Grant, check_grants
from schema.stream_aggregates import combine_plan


@dataclass(frozen=True)
class Source:
    name: str  # table name the view SQL uses, e.g. "orders"
    topic: str  # Kafka topic
    schema: str  # Spark DDL of the JSON value, e.g. "order_id STRING, amount DOUBLE"
    # Column equal to the Kafka message key (UTF-8); a null value (tombstone) deletes that key.
    key: str
    event_time: str | None = None
    watermark: str | None = None  # e.g. "30 seconds"; only with event_time
    max_record_bytes: int = 100_000  # larger Kafka values are dead-lettered


class ViewKind(StrEnum):
    # Stateless SQL (projection / stream-static join): latest row per key, last offset wins.
    UPSERT = "upsert"
    AGGREGATE = "aggregate"  # stateful GROUP BY, output mode "update"
    WINDOW = "window"  # event-time window GROUP BY with watermark, output mode "update"
    # A view over views (table semantics): SQL over the current rows of other views,
    # recomputed for the keys each of their changes affects, so a row that leaves a WHERE
    # or a group is retracted and a join follows both sides.
    TABLE = "table"


@dataclass(frozen=True)
class Relationship:
    name: str  # GraphQL field name on this view's type, e.g. "customer"
    target: str  # target view name
    on: tuple[tuple[str, str], ...]  # pairs (field of this view, field of target view)
    many: bool = False  # True: a list (one-to-many); False: at most one row


@dataclass(frozen=True)
class View:
    name: str  # GraphQL type name; also names the Delta table and Redis keys
    # The one Source.name it streams; for a TABLE view, the view it reads (its driving input)
    source: str
    sql: str  # Spark SQL over the source table (and dimension views, by view name)
    key: tuple[str, ...]  # key columns of the SQL output
    graphql_type: type  # @strawberry.type whose fields are exactly the SQL output columns
    kind: ViewKind
    indexes: tuple[str, ...] = ()  # fields users filter/sort on
    relationships: tuple[Relationship, ...] = ()
    # Other views the SQL reads, by view name: joined as static tables (their latest rows
    # when a batch runs) by an UPSERT view; followed both ways by a TABLE view.
    dimensions: tuple[str, ...] = ()
    # Spark's processing-time trigger. The graph query runs at the shortest of its views':
    # a batch starts when the interval has passed and the previous batch is done, so a
    # short interval keeps the wait before a batch short without spinning when idle.
    trigger: str = "200 milliseconds"
    retention: str = "7 days"  # change-feed retention
    # How far back `asOf` reaches: Delta keeps the files and log entries of older versions
    # this long, then maintenance vacuums them (see engine.maintenance).
    history: str = "1 day"
    grants: tuple[Grant, ...] = ()  # who may read it besides the admin role (schema.permissions)

    @property
    def in_graph(self) -> bool:
        """Whether the view graph runs it (one query, one batch id as the version of all its
        views, schema.storage.graph_key): upsert views, views over views, and the stream
        aggregates kept from their own rows (schema.stream_aggregates). Other stream
        aggregates keep queries, and versions, of their own."""
        if self.kind in (ViewKind.UPSERT, ViewKind.TABLE):
            return True
        return not self.dimensions and combine_plan(self.sql, self.key) is not None

    @property
    def reads(self) -> tuple[str, ...]:
        """The views this view's SQL reads (its inputs that are views)."""
        upstream = (self.source,) if self.kind == ViewKind.TABLE else ()
        return tuple(dict.fromkeys((*upstream, *self.dimensions)))


# --- GraphQL type introspection -------------------------------------------------------

# Python field type -> the Spark type (simpleString, or its prefix for decimals).
SPARK_TYPES: dict[Any, str] = {
    str: "string",
    strawberry.ID: "string",
    int: "bigint",
    float: "double",
    bool: "boolean",
    datetime.datetime: "timestamp",
    datetime.date: "date",
    decimal.Decimal: "decimal",
}
# Spark types also accepted for an expected one (an `int` column fits a Python int).
_ALSO_ACCEPTED: dict[str, tuple[str, ...]] = {"bigint": ("int",)}
# Spark type -> the Python annotation to suggest in a fix.
_PYTHON_FOR_SPARK: dict[str, str] = {
    "string": "str",
    "bigint": "int",
    "int": "int",
    "double": "float",
    "float": "float",
    "boolean": "bool",
    "timestamp": "datetime.datetime",
    "date": "datetime.date",
    "decimal": "decimal.Decimal",
}

_NAME_CONVERTER = StrawberryConfig().name_converter


@dataclass(frozen=True)
class FieldInfo:
    python_name: str  # also the SQL column name
    graphql_name: str
    python_type: Any  # the unwrapped type, e.g. float for Optional[float]
    spark_type: str  # expected Spark type (prefix for decimal)
    nullable: bool


def _inspect_type(view_name: str, cls: type) -> tuple[dict[str, FieldInfo], list[Problem]]:
    """Fields of a strawberry type, and the problems that stop it being a view's type."""
    definition = getattr(cls, "__strawberry_definition__", None)
    if definition is None or definition.is_input or definition.is_interface:
        name = getattr(cls, "__name__", repr(cls))
        return {}, [
            Problem(view_name, None, f"graphql_type {name} is not a @strawberry.type class",
                    f"decorate {name} with @strawberry.type")
        ]
    fields: dict[str, FieldInfo] = {}
    problems: list[Problem] = []
    for f in definition.fields:
        if f.base_resolver is not None:
            problems.append(Problem(view_name, f.python_name,
                                    "has a resolver, but every field must be an SQL column",
                                    "remove the resolver, or serve it as a relationship"))
            continue
        try:
            ftype = f.type
        except Exception as exc:  # unresolvable forward reference and the like
            problems.append(Problem(view_name, f.python_name, f"type cannot be resolved ({exc})",
                                    "import the annotated type in the module of the class"))
            continue
        nullable = isinstance(ftype, StrawberryOptional)
        inner = ftype.of_type if nullable else ftype
        spark = SPARK_TYPES.get(inner)
        if spark is None:
            problems.append(Problem(
                view_name, f.python_name, f"type {inner!r} has no Spark column type",
                "use one of str, int, float, bool, datetime.datetime, datetime.date, "
                "decimal.Decimal (optionally Optional[...])"))
            continue
        fields[f.python_name] = FieldInfo(
            python_name=f.python_name,
            graphql_name=_NAME_CONVERTER.get_graphql_name(f),
            python_type=inner,
            spark_type=spark,
            nullable=nullable,
        )
    return fields, problems


@functools.lru_cache(maxsize=1024)
def graphql_fields(view: View) -> dict[str, FieldInfo]:
    """Per python field name of the view's type: GraphQL name, Spark type, nullability.
    Cached per view (keys are parsed per row on hot paths); do not change what it returns."""
    fields, problems = _inspect_type(view.name, view.graphql_type)
    if problems:
        raise CatalogError(problems)
    return fields


def graphql_type_name(cls: type) -> str:
    return cls.__strawberry_definition__.name  # type: ignore[attr-defined]


# --- Comparing the SQL output with the type --------------------------------------------


def expected_spark_columns(view: View) -> dict[str, tuple[str, bool]]:
    """Column -> (Spark type, or prefix for decimals; nullable) the view's SQL must output."""
    return {name: (f.spark_type, f.nullable) for name, f in graphql_fields(view).items()}


def spark_type_matches(expected: str, actual: str) -> bool:
    actual = actual.strip().lower()
    if expected == "decimal":
        return actual.startswith("decimal")
    return actual == expected or actual in _ALSO_ACCEPTED.get(expected, ())


def compare_columns(view: View, actual: Mapping[str, str]) -> list[Problem]:
    """Problems between the type's fields and the SQL output {column: Spark simpleString}.

    Only names and types are compared: Spark reports most streaming columns as nullable
    whatever the data, so nullability is the GraphQL type's promise, not Spark's.
    """
    expected = expected_spark_columns(view)
    problems: list[Problem] = []
    lowered = {c.lower(): c for c in actual}
    for col, (spark_type, _nullable) in expected.items():
        if col in actual:
            if not spark_type_matches(spark_type, actual[col]):
                cast_to = "DECIMAL(p, s)" if spark_type == "decimal" else spark_type.upper()
                problems.append(Problem(
                    view.name, col,
                    f"the SQL outputs type {actual[col]} but the GraphQL type needs {spark_type}",
                    f"write CAST(... AS {cast_to}) AS {col} in the SQL, or annotate the field "
                    f"as {_suggest_python(actual[col])}"))
        elif col.lower() in lowered:
            problems.append(Problem(
                view.name, col, f"the SQL outputs it as {lowered[col.lower()]}",
                f"alias it exactly: ... AS {col}"))
        else:
            problems.append(Problem(
                view.name, col, "field of the GraphQL type is missing from the SQL output",
                f"select it in the SQL (... AS {col}) or remove the field from the type"))
    expected_lower = {c.lower() for c in expected}
    for col, spark_type in actual.items():
        if col not in expected and col.lower() not in expected_lower:
            problems.append(Problem(
                view.name, col, f"the SQL outputs column {col} ({spark_type}) the type lacks",
                f"drop it from the SELECT, or add `{col}: {_suggest_python(spark_type)}` "
                f"to {getattr(view.graphql_type, '__name__', view.name)}"))
    return problems


def _suggest_python(spark_type: str) -> str:
    base = re.split(r"[(<]", spark_type.strip().lower(), maxsplit=1)[0]
    return _PYTHON_FOR_SPARK.get(base, f"a type matching {spark_type}")


# --- Durations and DDL ------------------------------------------------------------------

_UNIT_MS = {"millisecond": 1, "second": 1_000, "minute": 60_000, "hour": 3_600_000,
            "day": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s+(millisecond|second|minute|hour|day)s?\s*$", re.I)
TRIGGER_UNITS = ("millisecond", "second", "minute")


def parse_duration_ms(text: str, units: Iterable[str] = tuple(_UNIT_MS)) -> int:
    """'30 seconds' -> 30000. Raises ValueError for anything else."""
    match = _DURATION.match(text or "")
    if not match or match.group(2).lower() not in tuple(units):
        raise ValueError(f"not a duration: {text!r}")
    return int(match.group(1)) * _UNIT_MS[match.group(2).lower()]


def parse_ddl(ddl: str) -> dict[str, str]:
    """'a STRING, b DECIMAL(10,2)' -> {'a': 'string', 'b': 'decimal(10,2)'} (lower-cased types).

    Enough of Spark's DDL to find columns and their types; Spark parses it for real.
    """
    columns: dict[str, str] = {}
    depth, start, parts = 0, 0, []
    for i, ch in enumerate(ddl):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(ddl[start:i])
            start = i + 1
    parts.append(ddl[start:])
    for part in parts:
        tokens = part.strip().split(None, 1)
        if len(tokens) != 2:
            raise ValueError(f"cannot read column definition {part.strip()!r}")
        name, rest = tokens[0].strip("`"), tokens[1].strip().lower()
        columns[name] = re.split(r"\s+(not\s+null|comment)\b", rest, maxsplit=1)[0].strip()
    return columns


# --- The catalog ------------------------------------------------------------------------

_GRAPHQL_NAME = re.compile(r"^[A-Za-z][_0-9A-Za-z]*$")  # leading "_" is reserved for us
_SQL_NAME = re.compile(r"^[A-Za-z_][_0-9A-Za-z]*$")


@dataclass(frozen=True)
class Catalog:
    sources: Mapping[str, Source]
    views: Mapping[str, View]

    @classmethod
    def of(cls, sources: Iterable[Source], views: Iterable[View]) -> Catalog:
        """Build from lists; a repeated name is an error (a dict would hide it)."""
        problems: list[Problem] = []
        by_source: dict[str, Source] = {}
        for s in sources:
            if s.name in by_source:
                problems.append(Problem(s.name, None, "declared twice",
                                        "give each source a unique name", subject="source"))
            by_source[s.name] = s
        by_view: dict[str, View] = {}
        for v in views:
            if v.name in by_view:
                problems.append(Problem(v.name, None, "declared twice",
                                        "give each view a unique name"))
            by_view[v.name] = v
        if problems:
            raise CatalogError(problems)
        return cls(sources=by_source, views=by_view)

    def view(self, name: str) -> View:
        try:
            return self.views[name]
        except KeyError:
            raise CatalogError([Problem(name, None, "unknown view",
                                        f"use one of: {', '.join(sorted(self.views))}")]) from None

    def source_of(self, view: View) -> Source:
        """The source a view streams; for a view over views, the one at the end of its
        chain of `source`s (the source of the view it reads, and so on)."""
        seen = {view.name}
        while view.kind == ViewKind.TABLE and view.source in self.views:
            view = self.views[view.source]
            if view.name in seen:
                break  # a cycle; validate() names it
            seen.add(view.name)
        try:
            return self.sources[view.source]
        except KeyError:
            raise CatalogError([Problem(view.name, None, f"unknown source {view.source!r}",
                                        f"use one of: {', '.join(sorted(self.sources))}")]
                               ) from None

    def views_reading(self, source_name: str) -> list[View]:
        return [v for v in self.views.values()
                if v.source == source_name and v.kind != ViewKind.TABLE]

    def views_fed_by(self, source_name: str) -> list[View]:
        """The views that read the source, directly or through other views."""
        direct = self.views_reading(source_name)
        names = {v.name for v in direct}
        for view in direct:
            names |= {v.name for v in self.downstream(view.name)}
        return [v for v in self.views.values() if v.name in names]

    def upstream(self, view: View) -> list[View]:
        """Every view `view` reads, directly or through others."""
        found: dict[str, View] = {}
        pending = list(view.reads)
        while pending:
            name = pending.pop()
            if name not in found and name in self.views and name != view.name:
                found[name] = self.views[name]
                pending += self.views[name].reads
        return list(found.values())

    def downstream(self, name: str) -> list[View]:
        """Every view that reads view `name`, directly or through others."""
        return [v for v in self.views.values() if name in {u.name for u in self.upstream(v)}]

    def cycles(self) -> list[tuple[str, ...]]:
        """Each cycle of views reading each other, as the path that closes it."""
        found: list[tuple[str, ...]] = []
        done: set[str] = set()

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in path:
                cycle = path[path.index(name):] + (name,)
                if not any(set(cycle) == set(c) for c in found):
                    found.append(cycle)
                return
            if name in done or name not in self.views:
                return
            for upstream in self.views[name].reads:
                if upstream != name:  # reading itself is reported on its own
                    visit(upstream, (*path, name))
            done.add(name)

        for name in self.views:
            visit(name, ())
        return found

    def validate(self) -> None:
        """Raise CatalogError listing every structural problem (Spark is not needed)."""
        problems: list[Problem] = []
        for name, source in self.sources.items():
            problems += _check_source(name, source)
        fields_of: dict[str, dict[str, FieldInfo]] = {}
        for view in self.views.values():
            fields_of[view.name], type_problems = _inspect_type(view.name, view.graphql_type)
            problems += type_problems
        for name, view in self.views.items():
            problems += _check_view(self, name, view, fields_of)
        for cycle in self.cycles():
            problems.append(Problem(
                cycle[0], None, f"views read each other in a cycle: {' -> '.join(cycle)}",
                "a view may read only views that do not read it back; break the cycle"))
        if problems:
            raise CatalogError(problems)


def _check_source(name: str, s: Source) -> list[Problem]:
    def problem(field: str | None, message: str, fix: str) -> Problem:
        return Problem(s.name, field, message, fix, subject="source")

    out: list[Problem] = []
    if name != s.name:
        out.append(problem(None, f"registered under the name {name!r}",
                           "register each source under its own name (use Catalog.of)"))
    if not _SQL_NAME.match(s.name):
        out.append(problem(None, "name is not a plain SQL identifier",
                           "use letters, digits and underscores, not starting with a digit"))
    if not s.topic.strip():
        out.append(problem(None, "topic is empty", "set topic to the Kafka topic name"))
    try:
        columns = parse_ddl(s.schema)
    except ValueError as exc:
        out.append(problem("schema", str(exc), "write the schema as 'col TYPE, col TYPE, ...'"))
        columns = None
    if columns is not None:
        if s.key not in columns:
            out.append(problem(s.key, "key column is not in the schema",
                               f"add `{s.key} STRING` to the schema or pick one of "
                               f"{', '.join(columns)}"))
        if s.event_time is not None and s.event_time not in columns:
            out.append(problem(s.event_time, "event_time column is not in the schema",
                               f"add `{s.event_time} TIMESTAMP` to the schema"))
        elif s.event_time is not None and not columns[s.event_time].startswith("timestamp"):
            out.append(problem(s.event_time,
                               f"event_time column has type {columns[s.event_time]}",
                               "declare it as TIMESTAMP in the schema"))
    if s.watermark is not None:
        if s.event_time is None:
            out.append(problem("watermark", "watermark without event_time",
                               "set event_time to the timestamp column, or drop the watermark"))
        try:
            parse_duration_ms(s.watermark)
        except ValueError:
            out.append(problem("watermark", f"cannot parse {s.watermark!r}",
                               "write it like '30 seconds' or '5 minutes'"))
    if s.max_record_bytes <= 0:
        out.append(problem("max_record_bytes", "must be positive", "use e.g. 100000"))
    return out


def _check_view(catalog: Catalog, name: str, v: View,
                fields_of: Mapping[str, dict[str, FieldInfo]]) -> list[Problem]:
    def problem(field: str | None, message: str, fix: str) -> Problem:
        return Problem(v.name, field, message, fix)

    out: list[Problem] = []
    fields = fields_of[v.name]
    type_ok = hasattr(v.graphql_type, "__strawberry_definition__")
    known = ", ".join(fields) or "(none)"

    if name != v.name:
        out.append(problem(None, f"registered under the name {name!r}",
                           "register each view under its own name (use Catalog.of)"))
    if not _GRAPHQL_NAME.match(v.name):
        out.append(problem(None, "name is not a valid GraphQL type name",
                           "use letters, digits and underscores, starting with a letter"))
    if type_ok and graphql_type_name(v.graphql_type) != v.name:
        out.append(problem(None, f"graphql_type is named {graphql_type_name(v.graphql_type)!r}",
                           f"name the class {v.name} or use @strawberry.type(name={v.name!r})"))
    if not isinstance(v.kind, ViewKind):
        out.append(problem(None, f"kind {v.kind!r} is not a ViewKind",
                           "use ViewKind.UPSERT, AGGREGATE, WINDOW or TABLE"))

    source = catalog.sources.get(v.source) if v.kind != ViewKind.TABLE else None
    if v.kind == ViewKind.TABLE:
        if v.source not in catalog.views:
            hint = (f"{v.source!r} is a source: read it with an UPSERT, AGGREGATE or WINDOW "
                    "view, and declare this view over that view"
                    if v.source in catalog.sources
                    else f"use one of: {', '.join(sorted(catalog.views))}")
            out.append(problem(None, f"a table view reads views; {v.source!r} is not one",
                               hint))
        elif v.source == v.name:
            out.append(problem(None, "reads itself", "set source to another view"))
        for name in v.reads:
            read = catalog.views.get(name)
            if read is not None and read.kind not in (ViewKind.UPSERT, ViewKind.TABLE):
                out.append(problem(None, f"reads {name}, a {read.kind.value} view over a "
                                   "stream, whose changes it cannot follow",
                                   "read UPSERT or TABLE views; declare the aggregate as a "
                                   "TABLE view over an UPSERT view of the stream"))
    elif source is None:
        hint = (f"{v.source!r} is a view: to read it, set kind=ViewKind.TABLE"
                if v.source in catalog.views
                else f"use one of: {', '.join(sorted(catalog.sources)) or '(none)'}")
        out.append(problem(None, f"unknown source {v.source!r}", hint))

    # Keys and indexes must be fields of the type.
    if not v.key:
        out.append(problem(None, "key is empty", "list the key columns of the SQL output"))
    if len(set(v.key)) != len(v.key):
        out.append(problem(None, "key repeats a column", "list each key column once"))
    for col in v.key:
        if type_ok and col not in fields:
            out.append(problem(col, "key column is not a field of the GraphQL type",
                               f"add it to the type or use one of: {known}"))
        elif col in fields and fields[col].nullable:
            out.append(problem(col, "key column is Optional", "make the key field non-null"))
    for col in v.indexes:
        if type_ok and col not in fields:
            out.append(problem(col, "index is not a field of the GraphQL type",
                               f"index one of: {known}"))

    # Tombstones delete by the Kafka key, so an upsert view must be keyed by it.
    if v.kind == ViewKind.UPSERT and source is not None and v.key and source.key not in v.key:
        out.append(problem(source.key,
                           f"source key {source.key} is not a key column of this upsert view",
                           f"add {source.key} to key (and to the SELECT)"))
    # Windows close on the watermark; without one Spark keeps every window forever.
    if v.kind == ViewKind.WINDOW and source is not None and (
            source.event_time is None or source.watermark is None):
        out.append(problem(None, f"window view over source {source.name} without a watermark",
                           f"set event_time and watermark on source {source.name}"))

    for dim in v.dimensions:
        if dim == v.name:
            out.append(problem(None, "lists itself as a dimension",
                               "remove it from dimensions"))
        elif dim not in catalog.views:
            out.append(problem(None, f"unknown dimension view {dim!r}",
                               f"use one of: {', '.join(sorted(catalog.views))}"))

    for field, text in (("trigger", v.trigger), ("retention", v.retention),
                        ("history", v.history)):
        try:
            parse_duration_ms(text, TRIGGER_UNITS if field == "trigger" else _UNIT_MS)
        except ValueError:
            example = "'1 second', '500 milliseconds' or '1 minute'" if field == "trigger" \
                else "'7 days' or '12 hours'"
            out.append(problem(field, f"cannot parse {text!r}", f"write it like {example}"))

    out += _check_relationships(catalog, v, fields, fields_of)
    out += check_grants(v.name, v.grants, fields, tuple(dict.fromkeys([*v.key, *v.indexes])))
    return out


def _check_relationships(catalog: Catalog, v: View, fields: dict[str, FieldInfo],
                         fields_of: Mapping[str, dict[str, FieldInfo]]) -> list[Problem]:
    out: list[Problem] = []
    taken = set(fields) | {f.graphql_name for f in fields.values()}
    seen: set[str] = set()
    for rel in v.relationships:
        def problem(message: str, fix: str, rel: Relationship = rel) -> Problem:
            return Problem(v.name, rel.name, f"relationship {message}", fix)

        if rel.name in taken:
            out.append(problem("name clashes with a field of the type",
                               "rename the relationship"))
        if rel.name in seen:
            out.append(problem("declared twice", "give each relationship a unique name"))
        seen.add(rel.name)
        if not _GRAPHQL_NAME.match(rel.name):
            out.append(problem("name is not a valid GraphQL field name",
                               "use letters, digits and underscores"))
        target = catalog.views.get(rel.target)
        if target is None:
            out.append(problem(f"targets unknown view {rel.target!r}",
                               f"use one of: {', '.join(sorted(catalog.views))}"))
        if not rel.on:
            out.append(problem("has no `on` pairs", "add (this field, target field) pairs"))
            continue
        target_fields = fields_of.get(rel.target, {})
        for mine, theirs in rel.on:
            if mine not in fields:
                out.append(problem(f"joins on {mine!r}, not a field of {v.name}",
                                   f"use one of: {', '.join(fields)}"))
            if target is not None and theirs not in target_fields:
                out.append(problem(f"joins on {theirs!r}, not a field of {rel.target}",
                                   f"use one of: {', '.join(target_fields)}"))
            if (mine in fields and theirs in target_fields
                    and fields[mine].python_type is not target_fields[theirs].python_type):
                out.append(problem(f"joins {mine} to {rel.target}.{theirs} of another type",
                                   "join fields of the same type"))
        if target is None:
            continue
        # The gateway resolves a relationship by a key lookup or an index scan.
        their_cols = [t for _, t in rel.on]
        if set(their_cols) != set(target.key) and not any(c in target.indexes for c in their_cols):
            out.append(problem(f"cannot be looked up: {', '.join(their_cols)} is neither the key "
                               f"nor an index of {rel.target}",
                               f"add {their_cols[0]!r} to the indexes of view {rel.target}"))
    return out
