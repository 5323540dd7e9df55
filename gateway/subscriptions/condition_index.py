"""Filter groups and live lists found by the changes that may concern them, not by trying
every one of them.

A browser tab typically watches its own slice of a view (`where: {customerId: {eq: me}}`),
so a gateway holding 10,000 tabs holds 10,000 distinct filters on one view. Trying each on
every change (the filters' `matches`) made every change cost 10,000 tests. Here each
filter is filed under one of its equality conditions (`eq`, or every value of an `in`): a
change can only concern the filters filed under its row's or its previous row's value of
that field, plus the few that have no equality condition, and only those are tested.
Pure logic: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from gateway.reads.filters import Condition, sortable
from schema.catalog import FieldInfo
from schema.storage import ChangeEvent

EQUALITY_OPERATORS = ("eq", "in")


class Conditioned(Protocol):
    conditions: Sequence[Condition]


T = TypeVar("T", bound=Conditioned)


def anchor(conditions: Sequence[Condition]) -> Condition | None:
    """The condition a filter is filed under: its first `eq`, else its first `in` (fewer
    values, fewer entries); None when it has neither."""
    equal = [c for c in conditions if c.op in EQUALITY_OPERATORS]
    return min(equal, key=lambda c: c.op != "eq", default=None)


class ConditionIndex(Generic[T]):
    """A dict of items with `conditions` (by their filter key), which also answers which of
    them a change may concern (`candidates`). The caller still applies the conditions:
    a candidate's anchor matches, its other conditions may not."""

    def __init__(self, fields: Mapping[str, FieldInfo]) -> None:
        self.fields = fields
        self._items: dict[str, T] = {}
        # field -> sortable value -> filter keys filed there
        self._by_value: dict[str, dict[Any, dict[str, None]]] = {}
        self._unanchored: dict[str, None] = {}  # filter keys with no equality condition

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def values(self) -> list[T]:
        return list(self._items.values())

    def __setitem__(self, key: str, item: T) -> None:
        if key in self._items:
            del self[key]
        self._items[key] = item
        condition = anchor(item.conditions)
        if condition is None:
            self._unanchored[key] = None
            return
        by_value = self._by_value.setdefault(condition.field, {})
        for value in self._values(condition):
            by_value.setdefault(value, {})[key] = None

    def __delitem__(self, key: str) -> None:
        item = self._items.pop(key)
        condition = anchor(item.conditions)
        if condition is None:
            del self._unanchored[key]
            return
        by_value = self._by_value[condition.field]
        for value in self._values(condition):
            bucket = by_value.get(value)
            if bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del by_value[value]
        if not by_value:
            del self._by_value[condition.field]

    def candidates(self, event: ChangeEvent) -> list[T]:
        """The items whose conditions the change's row or previous row may meet, each once,
        as a list (delivering may remove items)."""
        keys: dict[str, None] = {}
        for name, by_value in self._by_value.items():
            info = self.fields[name]
            for row in (event.before, event.row):
                raw = None if row is None else row.get(name)
                if raw is None:
                    continue
                try:
                    value = sortable(info, raw)
                except (TypeError, ValueError):  # not of the field's type: let them all judge
                    for bucket in by_value.values():
                        keys.update(bucket)
                    continue
                keys.update(by_value.get(value, ()))
        keys.update(self._unanchored)
        return [self._items[k] for k in keys]

    def _values(self, condition: Condition) -> set[Any]:
        info = self.fields[condition.field]
        values = condition.value if condition.op == "in" else (condition.value,)
        return {sortable(info, v) for v in values}
