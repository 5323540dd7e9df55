"""Stream aggregates in the view graph: a batch's new events aggregated by the view's own
SQL, added to the view's stored rows (schema.stream_aggregates says which views and how
each column combines).

Stream semantics: every event counts once and forever. For a view with a watermark (a
`WINDOW` over a source with `event_time` and `watermark`), the graph keeps the largest event
time seen in the view's meta (written with its rows, so a replayed batch sees what the
first attempt saw); the watermark of a batch is that time less the source's delay, and an
event older than it is late: dropped and counted in `late_events`, as Spark's own
streaming aggregation does. A window's row stays as its last batch left it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from engine.driver_groups import GroupedQuery, grouped_query
from engine.driver_sql import driver_or_spark
from engine.sinks.redis_sink import Before
from schema.catalog import FieldInfo, Source, View, ViewKind, graphql_fields, parse_duration_ms
from schema.storage import META_LATE_EVENTS, META_WATERMARK, from_json_value, iso_utc, key_of
from schema.stream_aggregates import GROUP, combine_plan

Row = dict[str, Any]
META_MAX_EVENT_TIME = "max_event_time"  # the largest event time a view has seen


@dataclass(frozen=True)
class Seen:
    """What a stream aggregate's meta says before a batch."""

    max_event_time: datetime.datetime | None
    late_events: int


@dataclass
class StreamBatch:
    """A stream aggregate's batch: the rows it changes (each the stored row combined with
    what the batch adds), what Redis held for them, and the meta to write with them."""

    rows: list[Row]
    before: Before | None
    meta: dict[str, Any]
    late: int = 0  # events of the batch behind the watermark


@dataclass
class Partial:
    """What some of a batch's events add to a stream aggregate: the view's rows over those
    on time (not yet combined with the stored rows), how many were late, and the largest
    event time seen after them."""

    rows: list[Row]
    late: int
    latest: datetime.datetime | None


@dataclass(frozen=True)
class EventFold:
    """What a part of a batch's events adds to a stream aggregate, without Spark: the part
    a Spark task runs (engine.task_read), so it holds no catalog class, only the event-time
    column, the watermark's delay and the view's SQL as engine.driver_groups compiled it."""

    event_time: str | None
    delay_ms: int | None  # None: no watermark (every event counts)
    query: GroupedQuery | None  # None: only Spark answers the view's SQL

    def partial(self, events: Sequence[Row], max_event_time: datetime.datetime | None
                ) -> Partial:
        """The view's SQL over the events on time. Raises OutsideSubset where only Spark
        can answer (a BIGINT overflow); needs `query`."""
        assert self.query is not None
        kept, late, latest = self.on_time(events, max_event_time)
        return Partial(self.query.rows(kept) if kept else [], late, latest)

    def watermark(self, latest: datetime.datetime) -> datetime.datetime:
        assert self.delay_ms is not None
        return latest - datetime.timedelta(milliseconds=self.delay_ms)

    def on_time(self, events: Sequence[Row], latest: datetime.datetime | None
                ) -> tuple[list[Row], int, datetime.datetime | None]:
        """The events to aggregate, how many were late, and the largest event time seen
        after them. The watermark is the one before the batch, so parts of a batch are
        judged alike wherever they run."""
        if self.delay_ms is None:
            return list(events), 0, latest
        column = self.event_time
        assert column is not None
        watermark = None if latest is None else self.watermark(latest)
        kept = []
        for event in events:
            moment = _utc(event.get(column))
            if moment is not None and watermark is not None and moment < watermark:
                continue
            kept.append(event)
            if moment is not None and (latest is None or moment > latest):
                latest = moment
        return kept, len(events) - len(kept), latest


class StreamAggregate:
    def __init__(self, view: View, source: Source, schema: StructType) -> None:
        plan = combine_plan(view.sql, view.key)
        if plan is None:
            raise ValueError(f"{view.name} is not a stream aggregate kept from its rows")
        self.view = view
        self.source = source
        self.schema = schema  # the source's columns, as the SQL reads them
        self.combines = {c: kind for c, kind in plan.items() if kind != GROUP}
        self.fields: Mapping[str, FieldInfo] = graphql_fields(view)
        delay_ms = (parse_duration_ms(source.watermark)
                    if view.kind is ViewKind.WINDOW and source.event_time
                    and source.watermark else None)
        # The view's SQL evaluated in the driver when it can be (engine.driver_groups):
        # a Spark job of about 200 ms a batch saved on two cores.
        self.fold = EventFold(source.event_time, delay_ms, grouped_query(view.sql, schema))

    @property
    def in_driver(self) -> GroupedQuery | None:
        """The view's SQL as evaluated without Spark; None: only Spark answers it."""
        return self.fold.query

    def batch(self, session: SparkSession, events: Sequence[Row], seen: Seen,
              stored: Callable[[list[str]], Before],
              partials: Sequence[Partial] = ()) -> StreamBatch:
        """`events`: the source's valid records of the batch that no task folded;
        `partials`: what Spark's tasks folded of the others (engine.task_read); `stored`
        reads what Redis holds for keys (rows in JSON form)."""
        if events or not partials:
            kept, late, latest = self.fold.on_time(events, seen.max_event_time)
            added = driver_or_spark(session, self.in_driver, self.view.sql, kept,
                                    self.schema, self.source.name) if kept else []
            partials = [*partials, Partial(added, late, latest)]
        return self.finish(partials, seen, stored)

    def finish(self, partials: Sequence[Partial], seen: Seen,
               stored: Callable[[list[str]], Before]) -> StreamBatch:
        """The batch from what each part of its events added: their rows of one key
        combined, then with the stored row."""
        late = sum(p.late for p in partials)
        latest = max((p.latest for p in partials if p.latest is not None),
                     default=seen.max_event_time)
        meta: dict[str, Any] = {}
        if self.fold.delay_ms is not None:
            meta[META_LATE_EVENTS] = seen.late_events + late
            if latest is not None:
                meta[META_MAX_EVENT_TIME] = iso_utc(latest)
                meta[META_WATERMARK] = iso_utc(self.fold.watermark(latest))
        added: dict[str, Row] = {}
        for part in partials:
            for row in part.rows:
                key = key_of(row, self.view.key)
                known = added.get(key)
                added[key] = row if known is None else self._added(known, row)
        if not added:
            return StreamBatch([], None, meta, late)
        before = stored(list(added))
        rows = [self._combined(row, before.rows.get(key)) for key, row in added.items()]
        return StreamBatch(rows, before, meta, late)

    def _combined(self, added: Row, stored: Row | None) -> Row:
        """The stored row (JSON form) with what the batch added (Python values)."""
        if stored is None:
            return added
        return self._added({c: from_json_value(self.fields[c].python_type, stored.get(c))
                            for c in self.combines}, added)

    def _added(self, old: Row, new: Row) -> Row:
        """`new` with each combined column of `old` (Python values) added to it."""
        row = dict(new)
        for column, kind in self.combines.items():
            before, now = old.get(column), new[column]
            if before is None or now is None:
                row[column] = now if before is None else before
            elif kind == "sum":
                row[column] = before + now
            else:
                row[column] = min(before, now) if kind == "min" else max(before, now)
        return row


def _utc(value: Any) -> datetime.datetime | None:
    """An event time as an aware UTC datetime (Arrow gives aware ones; text is parsed)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=datetime.UTC)
    return value
