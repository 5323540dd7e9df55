"""The graph's read done by Spark's tasks: each task folds its Kafka partitions' records
before they reach the driver (issue 16's stage A: docs/engine-plan.md).

A task keeps, per source, the last record of each key (a key lives in one partition, in
order), passes bad records through for the dead-letter topics, folds the events the
stream aggregates read into what they add (engine.stream_aggregates.Partial), and computes
the upsert views that pick columns of their source, ready to apply (engine.task_upsert).
For a throughput batch of 20,000 orders the driver receives OrderRecord's Redis writes and
change events and a few hundred partial rows, not the 13,500 last records (unless a task
hands the view back).

When the views over views can be computed in tasks too (engine.task_tables), the upsert
views' changes also leave the first stage as ROUTED rows, tagged with the value those
views join or group by; the job repartitions the first stage's output by that value, and
a second stage (TablesFold) computes the views over views from the changes each task
holds, passing every other row through.

Off by default (the setting `engine_task_read`): on two local cores a Python task's round
trip costs about 110 ms more a job than the driver's own collect, even for 500 records,
and a 20,000-event batch's read took 1,104 ms against 732 while the driver's views saved
about 170 ms (docs/engine-plan.md). It is for executors on other hosts than the driver's.

Tasks write nothing the readers see (with `engine_task_delta`, Delta files that only the
driver's commit names: engine.task_delta), and read only their records and (for the views
they compute) the rows Redis holds as the previous batch left them, so a retried task
returns the same answer and exactly once rests on the graph's commit as before. What a
task cannot fold without Spark (a sum past BIGINT) it hands over as events, which the
driver aggregates as it does on its own path.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from engine.collector import keep_collector_out_of_batches
from engine.driver_sql import OutsideSubset
from engine.sources import CORRUPT
from engine.stream_aggregates import EventFold, Partial, StreamAggregate
from engine.task_tables import TablesInTasks, TaskTable, compute_tables
from engine.task_upsert import TaskUpsert, UpsertInTask
from schema.arrow_rows import arrow_rows

Row = dict[str, Any]

FOLD = "_fold"  # what an output row is: one of the six below
RECORD, PARTIAL, STATS, UPSERTED, ROUTED, TABLED = 0, 1, 2, 3, 4, 5
EVENT = "_event"  # a record whose event the driver aggregates (its task could not)
# A ROUTED row: an upsert view's change event for the views over views, and its routing
# value (engine.task_tables); the job's second stage takes them, the driver never sees them.
ROUTE, ROUTED_EVENT = "_route", "_routed_event"


def agg_column(stream: int) -> str:
    return f"_agg{stream}"  # a row the stream-th aggregate's events add (PARTIAL rows)


def late_column(stream: int) -> str:
    return f"_late{stream}"  # its late events in the task (the STATS row)


def latest_column(stream: int) -> str:
    return f"_latest{stream}"  # its largest event time after the task (the STATS row)


def table_columns(view: int) -> tuple[str, str, str, str, str, str]:
    """The view-th view over views' share of a task of the second stage (the TABLED row):
    whether the task computed it, its Redis writes, its change events and their keys, why
    it handed them back, the Delta files it wrote (engine.task_tables.TaskTable)."""
    return (f"_tb{view}_ok", f"_tb{view}_writes", f"_tb{view}_events", f"_tb{view}_keys",
            f"_tb{view}_back", f"_tb{view}_files")


def upsert_columns(view: int) -> tuple[str, str, str, str, str]:
    """The view-th upsert view's share of the task (the UPSERTED row): whether the task
    computed it, its Redis writes, its change events and their keys, the Delta files it
    wrote (engine.task_upsert.TaskUpsert)."""
    return (f"_up{view}_ok", f"_up{view}_writes", f"_up{view}_events", f"_up{view}_keys",
            f"_up{view}_files")


@dataclass(frozen=True)
class TopicLayout:
    """Where a topic's records are in the batch: its source, the column of their parsed
    value, the source's columns, whether that struct holds exactly them (then it is the
    event as it is, less Spark's corrupt-record field), and the source's key column."""

    source: str
    column: str
    wanted: tuple[str, ...]
    same: bool
    key: str

    def event(self, value: Row) -> Row:
        """A good record's parsed value as the source's event."""
        if self.same:
            value.pop(CORRUPT, None)
            return value
        return {c: value[c] for c in self.wanted}


@dataclass(frozen=True)
class Folded:
    """What the tasks returned: the records (the last per key, the bad ones, the events
    left to the driver, each flagged EVENT) in the batch's order, per stream aggregate what
    its events added, and per upsert view each task's share (engine.task_upsert)."""

    table: pa.Table  # the records, with the batch's columns and EVENT
    partials: dict[str, list[Partial]]
    upserts: dict[str, list[TaskUpsert]] = field(default_factory=dict)
    tables: dict[str, list[TaskTable]] = field(default_factory=dict)

    @property
    def records(self) -> list[Row]:
        """The records as Python rows."""
        try:
            return arrow_rows(self.table)
        except UnicodeDecodeError:  # a Kafka key of raw bytes: decoded leniently, as Spark's
            return arrow_rows(_lenient_keys(self.table))  # rows do on the driver's own path


class TaskRead:
    """The graph query's read in Spark's tasks, for `streams` (the graph's stream
    aggregates, each evaluated without Spark)."""

    def __init__(self, streams: Sequence[StreamAggregate], view_schemas: Mapping[str, StructType],
                 upserts: Sequence[tuple[str, UpsertInTask]] = (),
                 tables: TablesInTasks | None = None) -> None:
        """`upserts`: (topic, view) of the upsert views the tasks compute
        (engine.task_upsert); `tables`: the views over views they can compute after them
        (engine.task_tables)."""
        self.streams = list(streams)
        self.view_schemas = view_schemas
        self.upserts = list(upserts)
        self.tables = tables

    def fold(self, batch: DataFrame, layout: Mapping[str, TopicLayout],
             seen: Mapping[str, datetime.datetime | None], batch_id: int = 0,
             now_ms: int = 0, upserts: Collection[str] = (),
             needed: Collection[str] = (), with_tables: bool = False) -> Folded:
        """Run the batch's read as tasks and collect what they folded. `seen`: each stream
        aggregate's largest event time before the batch (its watermark's base). `upserts`:
        the upsert views to compute in the tasks, as batch `batch_id`
        committed at `now_ms`; `needed`: the topics whose last records the driver needs
        even so (an upsert view it computes reads them). `with_tables`: the views over
        views computed too, in a second stage of the job over the upsert views' changes
        repartitioned by their routing value (engine.task_tables)."""
        schema = self.output_schema(batch.schema)
        arrow_schema = to_arrow_schema(schema, timezone="UTC")
        routed = with_tables and self.tables is not None
        fold = TaskFold(layout, [(s.source.topic, s.fold, seen.get(s.view.name))
                                 for s in self.streams],
                        arrow_schema,
                        [(t, u, u.view in upserts) for t, u in self.upserts],
                        batch_id, now_ms, needed, routed)
        folded = batch.mapInArrow(fold, schema)
        if routed:
            assert self.tables is not None
            stage_b = self.tables_schema(schema)
            folded = folded.repartition(batch.sparkSession.sparkContext.defaultParallelism,
                                        ROUTE).mapInArrow(
                TablesFold(self.tables, to_arrow_schema(stage_b, timezone="UTC"), batch_id,
                           now_ms), stage_b)
        return self.collected(folded.toArrow(), len(batch.columns))

    def tables_schema(self, folded: StructType) -> StructType:
        """The second stage's output: the first's, with each view over views' share."""
        assert self.tables is not None
        fields = list(folded.fields)
        for i in range(len(self.tables.tables)):
            ok, writes, events, keys, back, files = table_columns(i)
            fields += [StructField(ok, BooleanType(), True),
                       StructField(writes, BinaryType(), True),
                       StructField(events, ArrayType(BinaryType(), False), True),
                       StructField(keys, ArrayType(StringType(), False), True),
                       StructField(back, StringType(), True),
                       StructField(files, BinaryType(), True)]
        return StructType(fields)

    def output_schema(self, batch: StructType) -> StructType:
        # Every column may be null: a partial row has no record, a record no partial.
        fields = [*_nullable(batch).fields, StructField(FOLD, ByteType(), False),
                  StructField(EVENT, BooleanType(), True)]
        for i, stream in enumerate(self.streams):
            fields += [StructField(agg_column(i), _nullable(self.view_schemas[stream.view.name]),
                                   True),
                       StructField(late_column(i), LongType(), True),
                       StructField(latest_column(i), TimestampType(), True)]
        for i in range(len(self.upserts)):
            ok, writes, events, keys, files = upsert_columns(i)
            fields += [StructField(ok, BooleanType(), True),
                       StructField(writes, BinaryType(), True),
                       StructField(events, ArrayType(BinaryType(), False), True),
                       StructField(keys, ArrayType(StringType(), False), True),
                       StructField(files, BinaryType(), True)]
        if self.tables is not None:
            fields += [StructField(ROUTE, BinaryType(), True),
                       StructField(ROUTED_EVENT, BinaryType(), True)]
        return StructType(fields)

    def collected(self, table: pa.Table, inputs: int) -> Folded:
        """The tasks' output as the driver reads it; `inputs`: the batch's own columns,
        which come first."""
        kinds = table.column(FOLD)
        records = table.filter(pc.equal(kinds, RECORD)).select(
            [*table.column_names[:inputs], EVENT])
        partials: dict[str, list[Partial]] = {}
        stats = arrow_rows(table.filter(pc.equal(kinds, STATS)).select(
            [c for i in range(len(self.streams)) for c in (late_column(i), latest_column(i))]))
        added = table.filter(pc.equal(kinds, PARTIAL))
        for i, stream in enumerate(self.streams):
            rows = [r for r in arrow_rows(added.select([agg_column(i)]))
                    if r[agg_column(i)] is not None]
            # One partial per task that folded; its rows with the first (any order does).
            parts = [Partial([], s[late_column(i)], s[latest_column(i)]) for s in stats]
            if parts:
                parts[0].rows = [r[agg_column(i)] for r in rows]
            partials[stream.view.name] = parts
        upserts: dict[str, list[TaskUpsert]] = {}
        shares = table.filter(pc.equal(kinds, UPSERTED))
        for i, (_, view) in enumerate(self.upserts):
            columns = upsert_columns(i)
            found = [TaskUpsert(r[columns[0]], r[columns[1]], tuple(r[columns[2]]),
                                tuple(r[columns[3]]), files=r[columns[4]])
                     for r in arrow_rows(shares.select(list(columns)))
                     if r[columns[0]] is not None]
            if found:
                upserts[view.view] = found
        tables: dict[str, list[TaskTable]] = {}
        if self.tables is not None and table_columns(0)[0] in table.column_names:
            tabled = table.filter(pc.equal(kinds, TABLED))
            for i, view in enumerate(self.tables.tables):
                columns = table_columns(i)
                tables[view.view] = [
                    TaskTable(r[columns[0]], r[columns[1]], tuple(r[columns[2]]),
                              tuple(r[columns[3]]), r[columns[4]], r[columns[5]])
                    for r in arrow_rows(tabled.select(list(columns)))]
        return Folded(records, partials, upserts, tables)


def _lenient_keys(table: pa.Table) -> pa.Table:
    """The table with its Kafka keys' bytes that are not UTF-8 replaced (U+FFFD)."""
    keys = table.column("_kafka_key").cast(pa.binary()).to_pylist()
    text = pa.array([None if k is None else k.decode("utf-8", "replace") for k in keys],
                    pa.string())
    return table.set_column(table.column_names.index("_kafka_key"), "_kafka_key", text)


def _nullable(schema: StructType) -> StructType:
    return StructType([StructField(f.name, f.dataType, True) for f in schema.fields])


class TaskFold:
    """mapInArrow's function: one task's records folded (see the module docstring).
    Pickled to the tasks; it holds no client, no Spark session and no catalog class (a
    view's GraphQL type may live in a module the executors cannot import)."""

    def __init__(self, layout: Mapping[str, TopicLayout],
                 streams: Sequence[tuple[str, EventFold, datetime.datetime | None]],
                 schema: pa.Schema,
                 upserts: Sequence[tuple[str, UpsertInTask, bool]] = (),
                 batch_id: int = 0, now_ms: int = 0, needed: Collection[str] = (),
                 routed: bool = False) -> None:
        """`routed`: the upsert views' changes also go to the views over views (ROUTED)."""
        self.routed = routed
        self.layout = dict(layout)
        self.streams = list(streams)  # (topic, the aggregate's fold, its largest event time)
        self.schema = schema
        # (topic, view, whether to compute it in this batch), in the output's column order
        self.upserts = list(upserts)
        self.batch_id, self.now_ms = batch_id, now_ms
        self.needed = set(needed)  # topics whose last records the driver needs

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        keep_collector_out_of_batches()  # a task's rows go by reference counting too
        read = list(batches)
        if not read:
            return
        table = pa.Table.from_batches(read)
        keep: list[int] = []  # bad records, in order
        last: dict[tuple[str, bytes], int] = {}  # (topic, key) -> its last record
        events: dict[str, list[int]] = {topic: [] for topic, _, _ in self.streams}
        # Keys as bytes: a key that is not UTF-8 is still one key (the driver decodes it).
        keys = table.column("_kafka_key").cast(pa.binary()).to_pylist()
        columns = zip(table.column("_topic").to_pylist(), keys,
                      table.column("_error").is_null().to_pylist(),
                      table.column("_tombstone").to_pylist(), strict=True)
        value_keys: dict[str, list[Any]] = {}  # per topic, its values' key field
        unkeyed: set[str] = set()  # topics with a good record produced without a key
        for i, (topic, key, good, tombstone) in enumerate(columns):
            if not good:
                keep.append(i)
                continue
            if key is None:  # produced without one: as engine.sources.record_key, in bytes
                unkeyed.add(topic)
                key = str(self._value_keys(table, topic, value_keys)[i]).encode()
            last[(topic, key)] = i
            if not tombstone and topic in events:
                events[topic].append(i)
        partials = self._partials(table, events)
        handed = set() if partials is not None else {i for e in events.values() for i in e}
        upserted, withheld = (self._upserted(table, last, unkeyed) if self.upserts
                              else (None, set()))
        kept = sorted({*keep, *(i for (topic, _), i in last.items() if topic not in withheld),
                       *handed})
        records = table.take(pa.array(kept, pa.int64()))
        yield from self._records(records, [i in handed for i in kept]).to_batches()
        if partials is not None:
            yield from self._partial_rows(partials).to_batches()
        if upserted is not None:
            yield from upserted[0].to_batches()
            if upserted[1] is not None:
                yield from upserted[1].to_batches()

    def _value_keys(self, table: pa.Table, topic: str, found: dict[str, list[Any]]
                    ) -> list[Any]:
        """The key field of every record's value, for `topic`'s layout (read once)."""
        if topic not in found:
            layout = self.layout[topic]
            found[topic] = pc.struct_field(table.column(layout.column), [layout.key]).to_pylist()
        return found[topic]

    def _partials(self, table: pa.Table, events: Mapping[str, list[int]]
                  ) -> list[Partial] | None:
        """What each stream aggregate's events in this task add; None when one of them
        needs Spark (then the driver aggregates this task's events)."""
        values: dict[str, list[Row]] = {}
        for topic, at in events.items():
            layout = self.layout[topic]
            picked = table.take(pa.array(at, pa.int64())).select([layout.column])
            try:
                values[topic] = [layout.event(r[layout.column]) for r in arrow_rows(picked)]
            except UnicodeDecodeError:  # a text that is not UTF-8: the driver's, as Spark's rows
                return None
        try:
            return [stream.partial(values[topic], seen) for topic, stream, seen in self.streams]
        except OutsideSubset:
            return None

    def _upserted(self, table: pa.Table, last: Mapping[tuple[str, bytes], int],
                  unkeyed: set[str]) -> tuple[tuple[pa.Table, pa.Table | None], set[str]]:
        """One UPSERTED row: each upsert view's share of the batch computed from this
        task's last record per key (engine.task_upsert), and the ROUTED rows of their
        changes for the views over views when they are computed too (None if not); and the
        topics whose last records the driver does not need from this task: every view of
        theirs computed here, and none that the driver computes (`needed`). A task that
        hands a view back returns its topic's records, and the driver reads the batch
        again (engine.graph)."""
        latest: dict[str, dict[str, Row | None] | None] = {}  # None: the task cannot
        for topic in {t for t, _, wanted in self.upserts if wanted}:
            latest[topic] = None if topic in unkeyed else self._latest(table, topic, last)
        columns: dict[str, pa.Array] = {FOLD: pa.array([UPSERTED], pa.int8())}
        withheld = set(latest) - self.needed
        routed: list[tuple[bytes, bytes]] = []
        for i, (topic, view, wanted) in enumerate(self.upserts):
            if not wanted:
                continue
            rows = latest[topic]
            share = (TaskUpsert.refused() if rows is None
                     else view.compute(rows, self.batch_id, self.now_ms,
                                       self.routed and view.route is not None))
            if not share.ok:
                withheld.discard(topic)
            routed += share.routed
            ok, writes, events, keys, files = upsert_columns(i)
            columns[ok] = pa.array([share.ok])
            columns[writes] = pa.array([share.writes], pa.binary())
            columns[events] = pa.array([list(share.events)], self.schema.field(events).type)
            columns[keys] = pa.array([list(share.keys)], self.schema.field(keys).type)
            columns[files] = pa.array([share.files], pa.binary())
        shares = pa.Table.from_arrays(
            [columns.get(f.name, pa.nulls(1, f.type)) for f in self.schema],
            schema=self.schema)
        return (shares, self._routed_rows(routed) if self.routed else None), withheld

    def _routed_rows(self, routed: Sequence[tuple[bytes, bytes]]) -> pa.Table:
        count = len(routed)
        columns = {FOLD: pa.array([ROUTED] * count, pa.int8()),
                   ROUTE: pa.array([r for r, _ in routed], pa.binary()),
                   ROUTED_EVENT: pa.array([e for _, e in routed], pa.binary())}
        return pa.Table.from_arrays(
            [columns.get(f.name, pa.nulls(count, f.type)) for f in self.schema],
            schema=self.schema)

    def _latest(self, table: pa.Table, topic: str, last: Mapping[tuple[str, bytes], int]
                ) -> dict[str, Row | None] | None:
        """`topic`'s last record per key in this task, as the driver keys them
        (engine.batch_records: None for a tombstone); None if a key or a text is not UTF-8
        (the driver decodes those leniently, as Spark's rows do, and two keys may become
        one)."""
        at = sorted(i for (t, _), i in last.items() if t == topic)
        if not at:
            return {}
        layout = self.layout[topic]
        picked = table.take(pa.array(at, pa.int64())).select(
            ["_kafka_key", "_tombstone", layout.column])
        latest: dict[str, Row | None] = {}
        try:
            for record in arrow_rows(picked.set_column(
                    0, "_kafka_key", picked.column("_kafka_key").cast(pa.binary()))):
                key = record["_kafka_key"].decode()
                latest[key] = (None if record["_tombstone"]
                               else layout.event(record[layout.column]))
        except UnicodeDecodeError:
            return None
        return latest

    def _records(self, records: pa.Table, handed: list[bool]) -> pa.Table:
        count = records.num_rows
        columns = list(records.columns)
        columns += [pa.array([RECORD] * count, pa.int8()), pa.array(handed, pa.bool_())]
        columns += [pa.nulls(count, f.type) for f in list(self.schema)[len(columns):]]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _partial_rows(self, partials: Sequence[Partial]) -> pa.Table:
        """One PARTIAL row per row a stream aggregate's events add, then one STATS row."""
        count = sum(len(p.rows) for p in partials) + 1
        columns: dict[str, pa.Array] = {
            FOLD: pa.array([PARTIAL] * (count - 1) + [STATS], pa.int8())}
        start = 0
        for i, partial in enumerate(partials):
            kind = self.schema.field(agg_column(i)).type
            rows: list[Row | None] = [None] * count
            rows[start:start + len(partial.rows)] = partial.rows
            start += len(partial.rows)
            columns[agg_column(i)] = pa.array(rows, kind)
            columns[late_column(i)] = pa.array([None] * (count - 1) + [partial.late], pa.int64())
            columns[latest_column(i)] = pa.array(
                [None] * (count - 1) + [partial.latest], self.schema.field(latest_column(i)).type)
        return pa.Table.from_arrays(
            [columns.get(f.name, pa.nulls(count, f.type)) for f in self.schema],
            schema=self.schema)


class TablesFold:
    """mapInArrow's function of the read's second stage (engine.task_tables): the views
    over views computed from the ROUTED changes this task holds; every other row of the
    first stage passes through."""

    def __init__(self, tables: TablesInTasks, schema: pa.Schema, batch_id: int,
                 now_ms: int) -> None:
        self.tables = tables
        self.schema = schema
        self.batch_id, self.now_ms = batch_id, now_ms

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        keep_collector_out_of_batches()
        routed: list[bytes] = []
        for batch in batches:
            is_routed = pc.equal(batch.column(FOLD), ROUTED)
            rest = batch.filter(pc.invert(is_routed))
            if rest.num_rows:
                yield pa.RecordBatch.from_arrays(
                    [*rest.columns, *(pa.nulls(rest.num_rows, f.type)
                                      for f in list(self.schema)[rest.num_columns:])],
                    schema=self.schema)
            routed += batch.filter(is_routed).column(ROUTED_EVENT).to_pylist()
        if not routed:
            return
        shares = compute_tables(self.tables.tables, self.tables.routes, self.tables.stored,
                                routed, self.tables.redis_url, self.batch_id, self.now_ms)

        columns: dict[str, pa.Array] = {FOLD: pa.array([TABLED], pa.int8())}
        for i, share in enumerate(shares):
            ok, writes, events, keys, back, files = table_columns(i)
            columns[ok] = pa.array([share.ok])
            columns[writes] = pa.array([share.writes], pa.binary())
            columns[events] = pa.array([list(share.events)], self.schema.field(events).type)
            columns[keys] = pa.array([list(share.keys)], self.schema.field(keys).type)
            columns[back] = pa.array([share.handed_back], pa.string())
            columns[files] = pa.array([share.files], pa.binary())
        yield pa.RecordBatch.from_arrays(
            [columns.get(f.name, pa.nulls(1, f.type)) for f in self.schema],
            schema=self.schema)
