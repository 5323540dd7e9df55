"""Which keys of a view a change of one of its inputs can affect: the first half of the
incremental step of a view over views (the second recomputes those keys with the view's
own SQL and compares them with the stored rows).

Read off the view's lineage (engine.lineage):
- the key columns are copies of columns of the changed input (a projection, a GROUP BY
  over it, the driving side of a join): the keys are those columns of the changed rows,
  before and after the change;
- the key columns are copies of another input's columns, and a condition equates a column
  of that input with one of the changed input (a join): the keys are found in that input
  by the changed rows' join values (a customer's tier change affects that customer's
  orders);
- otherwise the view's key cannot be traced, and the view is refused at start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.lineage import Column, Lineage
from schema.errors import Problem


@dataclass(frozen=True)
class KeysFromRows:
    """The affected keys are the changed rows' own `columns` (one per key column)."""

    columns: tuple[str, ...]

    def keys(self, rows: Iterable[Mapping[str, Any] | None]) -> set[tuple[Any, ...]]:
        return {tuple(row[c] for c in self.columns) for row in rows if row is not None}


@dataclass(frozen=True)
class KeysByLookup:
    """The affected keys are the `key_columns` of the rows of `table` whose `match`
    column equals the changed rows' `changed` column."""

    table: str
    key_columns: tuple[str, ...]
    match: str
    changed: str

    def values(self, rows: Iterable[Mapping[str, Any] | None]) -> set[Any]:
        """The join values to look up in `table`."""
        return {row[self.changed] for row in rows if row is not None} - {None}


AffectedKeys = KeysFromRows | KeysByLookup


class UntraceableKey(ValueError):
    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _joined(lineage: Lineage, changed: str, other: str) -> tuple[str, str] | None:
    """(column of `other`, column of `changed`) a condition equates, if any."""
    for left, right in lineage.equalities:
        if left.table == other and right.table == changed:
            return left.name, right.name
        if left.table == changed and right.table == other:
            return right.name, left.name
    return None


def plan_affected(view: str, key: Sequence[str], lineage: Lineage,
                  changed: str) -> AffectedKeys:
    """How to find the keys of `view` a change of its input `changed` affects."""
    traced: list[Column | None] = [lineage.source_of(k) for k in key]
    if any(c is None for c in traced):
        missing = [k for k, c in zip(key, traced, strict=True) if c is None]
        raise UntraceableKey(Problem(
            view, ",".join(missing),
            "the key is computed, not a column of the view's inputs, so the engine cannot "
            "tell which keys a change of an input affects",
            "key the view by input columns it selects as they are (the GROUP BY columns of "
            "an aggregate, the key of the driving side of a join)"))
    tables = {c.table for c in traced if c is not None}
    if tables == {changed}:
        return KeysFromRows(tuple(c.name for c in traced if c is not None))
    if len(tables) == 1:
        (other,) = tables
        joined = _joined(lineage, changed, other)
        if joined is not None:
            return KeysByLookup(other, tuple(c.name for c in traced if c is not None),
                                match=joined[0], changed=joined[1])
        raise UntraceableKey(Problem(
            view, ",".join(key),
            f"its key comes from {other}, and no condition equates a column of {other} with "
            f"one of {changed}, so a change of {changed} cannot be traced to keys",
            f"join {changed} to {other} with an equality (ON {other}.x = {changed}.y)"))
    raise UntraceableKey(Problem(
        view, ",".join(key),
        f"its key columns come from several inputs ({', '.join(sorted(tables))})",
        "key the view by the columns of one input"))
