"""Check each view's SQL with Spark's analyzer, without data: the output columns must
match the view's GraphQL type. Gives each view's output schema for its Delta table."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from engine.affected import KeysByLookup, UntraceableKey, plan_affected
from engine.analyzer import analysed
from engine.current_rows import redis_serves
from engine.incremental import gather_plan
from engine.lineage import Lineage
from schema.catalog import Catalog, View, ViewKind, compare_columns
from schema.errors import CatalogError, Problem


def dependency_order(catalog: Catalog) -> list[View]:
    ordered: list[View] = []
    seen: set[str] = set()

    def visit(view: View, path: tuple[str, ...]) -> None:
        if view.name in seen:
            return
        if view.name in path:
            raise CatalogError(
                [
                    Problem(
                        view.name, None, f"views read each other in a cycle "
                        f"{' -> '.join((*path, view.name))}", "break the cycle"
                    )
                ]
            )
        for upstream in view.reads:
            visit(catalog.view(upstream), (*path, view.name))
        seen.add(view.name)
        ordered.append(view)

    for view in catalog.views.values():
        visit(view, ())
    return ordered


def analyse(spark: SparkSession, catalog: Catalog,
            warnings: list[str] | None = None) -> dict[str, StructType]:
    """{view: output schema}, or CatalogError naming every view and field that is off.
    What works but costs more than it should is appended to `warnings`."""
    catalog.validate()
    schemas: dict[str, StructType] = {}
    problems: list[Problem] = []
    for view in dependency_order(catalog):
        if view.kind is ViewKind.TABLE:
            problems += _analyse_table_view(spark, view, schemas, catalog,
                                            [] if warnings is None else warnings)
            continue
        source = catalog.source_of(view)
        if view.kind is ViewKind.UPSERT and tuple(view.key) != (source.key,):
            problems.append(
                Problem(
                    view.name,
                    ",".join(view.key),
                    f"an upsert view is keyed by its source's key ({source.key}), "
                    "so that a tombstone deletes its row",
                    f"set key=({source.key!r},)",
                )
            )
            continue
        inputs = {source.name: source.schema,
                  **{dim: schemas[dim] for dim in view.dimensions if dim in schemas}}
        try:
            schema = analysed(spark, view.sql, inputs).schema
        except Exception as exc:  # noqa: BLE001 - Spark's analysis errors vary
            problems.append(
                Problem(
                    view.name,
                    None,
                    f"Spark cannot analyse the SQL: {exc}".split("\n")[0],
                    "fix the SQL; it runs over the source table "
                    f"{source.name!r} and dimension views {list(view.dimensions)}",
                )
            )
            continue
        actual = {f.name: f.dataType.simpleString() for f in schema.fields}
        found = compare_columns(view, actual)
        if found:
            problems += found
            continue
        schemas[view.name] = schema
    if problems:
        raise CatalogError(problems)
    return schemas


def _analyse_table_view(spark: SparkSession, view: View, schemas: dict[str, StructType],
                        catalog: Catalog, warnings: list[str]) -> list[Problem]:
    """A view over views: its SQL over its inputs' schemas, and for each input, how the
    keys a change of it affects are found (engine.affected). Adds its schema on success."""
    missing = [name for name in view.reads if name not in schemas]
    if missing:
        return []  # the views it reads have problems of their own, reported already
    try:
        found = analysed(spark, view.sql, {name: schemas[name] for name in view.reads})
        schema, traced = found.schema, found.lineage
    except Exception as exc:  # noqa: BLE001 - Spark's analysis errors vary
        return [Problem(view.name, None,
                        f"Spark cannot analyse the SQL: {exc}".split("\n")[0],
                        f"fix the SQL; it reads the views {list(view.reads)}")]
    actual = {f.name: f.dataType.simpleString() for f in schema.fields}
    problems = compare_columns(view, actual)
    for name in view.reads:
        try:
            plan_affected(view.name, view.key, traced, name)
        except UntraceableKey as exc:
            problems.append(exc.problem)
    unread = [name for name in view.reads if name not in traced.inputs]
    if unread:
        problems.append(Problem(view.name, None, f"lists {', '.join(unread)} but its SQL does "
                                "not read it", "remove it from dimensions, or read it"))
    if not problems:
        try:
            warnings += unindexed_reads(view, traced, catalog)
        except UntraceableKey as exc:
            problems.append(exc.problem)
    if not problems:
        schemas[view.name] = schema
    return problems


def unindexed_reads(view: View, traced: Lineage, catalog: Catalog) -> list[str]:
    """The reads of the view's incremental step (engine.incremental) that Redis cannot
    answer by key or index: each batch then scans the input's Delta files instead."""
    reads = [(plan.table, plan.match) for name in view.reads
             if isinstance(plan := plan_affected(view.name, view.key, traced, name),
                           KeysByLookup)]
    reads += [(r.table, r.column)
              for r in gather_plan(view.name, view.key, traced, list(view.reads))]
    return [f"{view.name} reads {table} by {column}, which {table} is not keyed by and "
            f"does not index as text: each batch that changes {view.name}'s inputs scans "
            f"{table}'s Delta files that may hold the values (fix: add {column!r} to "
            f"{table}'s indexes)"
            for table, column in dict.fromkeys(reads)
            if not redis_serves(catalog.views[table], column)]
