"""The views over views of a batch computed by Spark's tasks (issue 16's stage B:
docs/engine-plan.md, "The executors' design, corrected").

Stage A's tasks (engine.task_read, engine.task_upsert) compute the upsert views of a
batch from the Kafka partitions as the source gives them. Their change events that views
over views read leave stage A *routed*: tagged with the value of the column the graph is
partitioned by (in the demo `customer_id`: OrderRecord's and Customer's join column,
Order's and CustomerStats' group), once for the previous row's value and once for the new
one's. The job then repartitions them by that value, and each task of stage B computes
the views over views, in dependency order, for the values it holds, as the driver would:
- a join's affected keys, its gathered rows (Redis, with the partition's changes laid
  over them: engine.current_rows) and its new rows (engine.projected_join);
- an aggregate's groups from their states in Redis (engine.aggregates);
- the stored rows compared, the change events with their previous rows, and the Redis
  writes (the rows, their indexes, an aggregate's states) as the apply script takes them.

A value's rows and changes are all in one task, so each task answers for its values what
the driver would for the whole batch, as long as no row moves from one value to another:
a change whose previous and new rows have different values (an order given to another
customer) would be half in one task and half in another. A task that meets one, or
anything else the driver would answer differently (a row without a key, which the driver
dead-letters; a read Redis cannot answer, which the driver takes from Delta; a value
outside the SQL the driver evaluates, which Spark computes), hands the views back
(`TaskTable.ok` False) and the driver computes them from stage A's changes, as it did
before: no second read.

Tasks write nothing the readers see (with `engine_task_delta`, Delta files that only the
driver's commit names: engine.task_delta). They read Redis as the previous batch left it,
so a retried task returns the same, and the fences, outboxes and graph's marks stay the
driver's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.aggregates import AggregateStep, State
from engine.current_rows import RedisRows, StoredTable
from engine.driver_sql import OutsideSubset
from engine.incremental import (
    Change,
    Evaluate,
    Key,
    Row,
    StoredRows,
    TableView,
    json_value,
    view_changes,
)
from engine.lineage import Lineage
from engine.projected_join import ProjectedJoin
from engine.sinks.redis_sink import Before, RowWrites, read_before, read_states
from engine.task_delta import DeltaInTask
from engine.task_upsert import batch_events, redis_client, route_value, task_partition
from schema.storage import (
    ChangeEvent,
    Op,
    events_from_bytes,
    key_of,
    state_key,
)


class HandBack(Exception):
    """The task cannot answer as the driver would: the driver computes the views."""


class _NoSpark:
    """The Spark session a task does not have: the SQL the driver cannot evaluate needs
    one, so the views go back to the driver."""

    def __getattr__(self, name: str) -> Any:
        raise HandBack("the view's SQL needs Spark")


class _NoFallback:
    """Rows Redis cannot answer (by a column it does not index, a null value, a Redis
    that lost its complete mark): the driver reads them from Delta."""

    def rows_where(self, table: str, column: str, values: set[Any]) -> list[Row]:
        raise HandBack(f"{table}'s rows by {column} are not in Redis")

    def close(self) -> None:
        pass


def _moves(change: Change, column: str) -> bool:
    before, after = change
    return (before is not None and after is not None
            and route_value(before, column) != route_value(after, column))


@dataclass(frozen=True)
class TaskTable:
    """One task's share of one view over views. `ok` False: the driver computes them."""

    ok: bool
    writes: bytes = b"[]"  # schema.storage.BatchWrites.encoded()
    events: tuple[bytes, ...] = ()  # ChangeEvent.to_bytes()
    keys: tuple[str, ...] = ()  # each event's key
    handed_back: str | None = None  # why the task handed the views back (for the log)
    files: bytes | None = None  # as TaskUpsert.files


@dataclass(frozen=True)
class TableInTask:
    """A view over views as a task computes it; pickled to the tasks. `route`: its column
    the graph is partitioned by (its rows' group, or its join column)."""

    view: str
    generation: int
    key: tuple[str, ...]
    route: str
    table: TableView
    lineage: Lineage
    join: ProjectedJoin | None
    aggregate: AggregateStep | None
    writes: RowWrites
    delta: DeltaInTask | None = None  # its table, when the task writes its files too

    def compute(self, changes: Mapping[str, Sequence[ChangeEvent]], routes: Mapping[str, str],
                rows: RedisRows, client: Any, batch_id: int, now_ms: int
                ) -> tuple[list[ChangeEvent], bytes]:
        """The view's change events and Redis writes (BatchWrites.encoded) for this task's
        routing values, from its inputs' `changes` (theirs in this task). Raises HandBack
        when the driver must compute it. `routes`: each input's routing column."""
        pairs = {name: [(e.before, e.row) for e in events]
                 for name, events in changes.items() if name in self.table.inputs and events}
        if not pairs:
            return [], b"[]"
        if any(_moves(c, routes[name]) for name, found in pairs.items() for c in found):
            raise HandBack("a row moved to another routing value")
        rows.start_batch({name: {e.key: e.row for e in changes[name]} for name in pairs})
        read: list[Before] = []

        def stored(keys: set[Key]) -> StoredRows:
            if any(None in k for k in keys):  # before key_of, which refuses a null
                raise HandBack("a row without a key")  # the driver dead-letters it
            texts = {self._text(k): k for k in keys}
            before = read_before(client, self.view, self.generation, list(texts))
            if before.fence != batch_id - 1 or not before.complete:
                raise HandBack("Redis is not at the previous batch")
            read.append(before)
            return StoredRows({texts[t]: row for t, row in before.rows.items()},
                              {texts[t]: text for t, text in before.encoded.items()})

        ops: list[Op] = []
        if self.aggregate is not None:
            found = self._aggregated(self.aggregate, pairs, read, stored, rows, client, ops)
        else:
            found = view_changes(_NoSpark(), self.table, self.lineage, pairs, rows,  # type: ignore[arg-type]
                                 stored, None, self._evaluate())
        if any(_moves(c, self.route) for c in found.values()):
            raise HandBack("a row moved to another routing value")
        before = read[-1] if read else Before({}, batch_id - 1, True, {})
        upserts = {key_of(new, self.key): new for _, new in found.values() if new is not None}
        deletes = [key_of(old, self.key) for old, new in found.values()
                   if new is None and old is not None]
        events = batch_events(self.view, self.generation, upserts, deletes, before, batch_id,
                              now_ms)
        writes = self.writes.batch_writes(self.generation, upserts, deletes, before.rows, ops)
        return events, writes.encoded()

    def _text(self, key: Key) -> str:
        return key_of(dict(zip(self.key, key, strict=True)), self.key)

    def _evaluate(self) -> Evaluate:
        join = self.join
        if join is None:
            raise HandBack("the view's SQL needs Spark")

        def evaluate(gathered: Mapping[str, list[Row]], keys: set[Key]) -> dict[Key, Row]:
            try:
                return join.rows(gathered, keys)
            except OutsideSubset as exc:  # a value Spark answers (or fails on)
                raise HandBack(str(exc)) from exc
        return evaluate

    def _aggregated(self, step: AggregateStep, pairs: Mapping[str, list[Change]],
                    read: list[Before], stored: Any, rows: RedisRows, client: Any,
                    ops: list[Op]) -> dict[Key, Change]:
        """As the driver's aggregate step (engine.graph), with the states read here."""
        plan = step.plan

        def states(texts: list[str]) -> tuple[dict[str, State], bool]:
            found, complete = read_states(client, self.view, self.generation, texts)
            return {k: step.codec.decode(v) for k, v in found.items()}, complete

        def group_rows(keys: set[Key]) -> list[Row]:
            found = rows.rows_where(plan.table, plan.group[0], {k[0] for k in keys})
            return [r for r in found if tuple(json_value(r[g]) for g in plan.group) in keys]

        found, new_states = step.changes(_NoSpark(), pairs.get(plan.table, []),  # type: ignore[arg-type]
                                         self._text, states, stored, group_rows)
        ops += step.state_ops(state_key(self.view, self.generation), new_states)
        return found


@dataclass(frozen=True)
class TablesInTasks:
    """What the read's second stage computes (engine.task_read.TablesFold): the views over
    views in dependency order, every view's routing column, what Redis holds of the views
    they read, and where Redis is."""

    tables: tuple[TableInTask, ...]
    routes: Mapping[str, str]
    stored: Mapping[str, StoredTable]
    redis_url: str


def compute_tables(tables: Sequence[TableInTask], routes: Mapping[str, str],
                   stored: Mapping[str, StoredTable], routed: Sequence[bytes],
                   redis_url: str, batch_id: int, now_ms: int) -> list[TaskTable]:
    """One task's share of every view over views (`tables`, in dependency order) from the
    change events routed to it (`routed`: their bytes; an event routed here twice, for
    its two values, counts once). `routes`: every view's routing column; `stored`: what
    Redis holds of the views they read (engine.current_rows)."""
    unique = {bytes(e): None for e in routed}
    changes: dict[str, list[ChangeEvent]] = {}
    for event in events_from_bytes(list(unique)):
        changes.setdefault(event.view, []).append(event)
    client = redis_client(redis_url)
    rows = RedisRows(client, stored, _NoFallback())
    computed = []
    try:
        for table in tables:
            events, writes = table.compute(changes, routes, rows, client, batch_id, now_ms)
            changes[table.view] = events
            computed.append((events, writes))
    except HandBack as exc:
        return [TaskTable(False, handed_back=f"{table.view}: {exc}") for _ in tables]
    # Files only once every view is computed: a hand-back leaves none to delete.
    partition = task_partition()
    return [TaskTable(True, writes, tuple(e.to_bytes() for e in events),
                      tuple(e.key for e in events),
                      files=table.delta.write(events, partition) if table.delta else None)
            for table, (events, writes) in zip(tables, computed, strict=True)]


def plan_routes(tables: Sequence[tuple[TableView, Lineage, ProjectedJoin | None,
                                       AggregateStep | None]]) -> dict[str, str] | None:
    """The column each view of the graph is routed by, for every view over views
    (`tables`, in dependency order: each with its lineage and its join or aggregate as
    the driver evaluates it) and every view they read; None when the views over views are
    not all partitioned by one value (a view that is neither a join evaluated in the
    driver nor an aggregate over one group column, or two readers routing one view by two
    columns): then the driver computes them."""
    routes: dict[str, str] = {}

    def route(view: str, column: str) -> bool:
        return routes.setdefault(view, column) == column

    for table, lineage, join, aggregate in tables:
        if join is not None:
            sides = ((join.left, join.left_on), (join.right, join.right_on))
        elif aggregate is not None and len(aggregate.plan.group) == 1:
            sides = ((aggregate.plan.table, aggregate.plan.group[0]),)
        else:
            return None
        if not all(route(view, column) for view, column in sides):
            return None
        own = [out for out, found in lineage.outputs.items()
               if found is not None and (found.table, found.name) in sides]
        if not own or not route(table.name, own[0]):
            return None
    return routes
