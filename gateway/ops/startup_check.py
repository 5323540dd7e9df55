"""The gateway's start-up check of each view against what the engine wrote.

The gateway has no JVM, so it cannot analyse a view's SQL itself; the engine's Delta table
was created from that SQL's analysed output, and its schema is what the gateway will read.
Comparing it with the view's GraphQL type catches a catalog changed on one side only (the
type edited, the engine not rebuilt) before the first wrong answer.
"""

from __future__ import annotations

import re

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from schema.catalog import Catalog, compare_columns
from schema.errors import CatalogError, Problem
from schema.storage import delta_table_path, read_current_generation

# Delta's primitive type names -> Spark's simpleString (what compare_columns speaks).
_SPARK_NAME = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


def spark_name(delta_type: str) -> str:
    base = re.split(r"[(<]", delta_type, maxsplit=1)[0]
    return _SPARK_NAME.get(base, delta_type)


def check_against_delta(catalog: Catalog, delta_root: str) -> list[str]:
    """Raise CatalogError naming view, field and fix for every mismatch between a view's
    GraphQL type and its current Delta table; returns the views not written yet."""
    problems: list[Problem] = []
    unwritten: list[str] = []
    for view in catalog.views.values():
        generation = read_current_generation(delta_root, view.name)
        try:
            table = DeltaTable(delta_table_path(delta_root, view.name, generation))
        except TableNotFoundError:
            unwritten.append(view.name)
            continue
        columns = {
            f.name: spark_name(str(getattr(f.type, "type", f.type))) for f in table.schema().fields
        }
        for problem in compare_columns(view, columns):
            problems.append(
                Problem(
                    problem.view,
                    problem.field,
                    f"{problem.message} (per the engine's Delta table, generation {generation})",
                    f"{problem.fix}; after changing a view's SQL, run `viewgate rebuild "
                    f"{view.name}`",
                )
            )
    if problems:
        raise CatalogError(problems)
    return unwritten
