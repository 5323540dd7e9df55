"""The graph query: one Structured Streaming query for every UPSERT view and every view over
views (TABLE), whose batch evaluates them in dependency order.

One Kafka read covers every topic those views stream. Each batch:
1. reads its records into the driver, fetched from Kafka by the driver itself when the
   batch is small (engine.driver_fetch: no Spark job), else in one Spark job, and sends
   the bad ones to their source's dead-letter topic (the same pass, no query of their own).
   The query streams the records as Kafka holds them; a batch parses them in Spark
   (engine.sources.classify_sources) only when Spark reads them;
2. computes the views in dependency order, nothing written yet:
   - an UPSERT view keeps the last record per key of its source, deletes tombstoned keys
     and runs its SQL over the rest (its dimensions are their latest rows);
   - a TABLE view turns its inputs' changes in this batch into its own changes
     (engine.incremental: the affected keys recomputed with its own SQL over its inputs'
     current rows, compared with its stored rows). An input's current rows are Redis's
     overlaid with the input's changes of this batch (engine.current_rows);
   with `engine_task_read`, a large batch's Spark job computes them instead where it
   can: the upsert views in the tasks that read the records (engine.task_upsert) and,
   with `engine_task_tables`, the views over views in a second stage partitioned by the
   value they join or group by (engine.task_tables); the driver receives their writes
   and change events;
3. applies every view to Redis in one round trip, between the graph's `applying` and
   `version` marks (schema.storage.graph_key), so Redis never shows a reader two versions
   of the graph for longer than that round trip, and a reader can tell;
4. publishes each view's change events, and commits each view's MERGE into Delta, only
   once Redis holds the batch (a large batch's MERGEs write their files while Redis
   applies it).
Every view is committed under the batch's one id, which is therefore one version across
all of them: a reader that sees version N of one view can ask every other for N.

Exactly once is the scheme of engine.commit, per view, under the shared batch id: after a
crash Spark replays the batch; views whose Redis holds it already are not computed again:
their stored change events (Redis's outbox) are published again, merged into Delta (a
no-op if there already) and handed to the views that read them. When every view holds it,
the batch's records are not even read.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from engine.aggregates import (
    AggregateStep,
    State,
    StateCodec,
    partial_schema,
    plan_aggregate,
    supported_types,
)
from engine.analysis import dependency_order
from engine.analyzer import analysed, struct_of
from engine.batch_offsets import read_batch_offsets, read_initial_offsets, records_between
from engine.batch_records import ByTopic, SourceRecords, take_rows, take_table
from engine.collector import keep_collector_out_of_batches
from engine.commit import IN_FLIGHT, Pending, ViewCommitter, offsets_fields
from engine.current_rows import DeltaRows, RedisRows, StoredTable
from engine.deadletter import DeadLetterWriter
from engine.dimensions import Dimensions
from engine.driver_fetch import DriverFetch
from engine.errors import GraphChanged
from engine.failpoints import failpoint
from engine.frames import frame_of, rows_of, spark_rows
from engine.incremental import (
    Change,
    Evaluate,
    Key,
    StoredRows,
    TableView,
    json_value,
    projected_rows,
    view_changes,
)
from engine.lineage import Lineage
from engine.malloc import FreeMemoryTrim
from engine.metrics import (
    observe_graph_read,
    observe_graph_steps,
    observe_rows_changed,
    observe_stream,
    observe_view_by_tasks,
)
from engine.projected_join import ProjectedJoin
from engine.query_resources import held, release_stopped, start_holding
from engine.read_ahead import ReadAhead
from engine.sinks.redis_sink import Before
from engine.sources import (
    CORRUPT,
    classify_sources,
    read_kafka,
    source_columns,
    value_column,
)
from engine.stream_aggregates import (
    META_MAX_EVENT_TIME,
    Partial,
    Seen,
    StreamAggregate,
    StreamBatch,
)
from engine.task_delta import DeltaInTask
from engine.task_read import TaskRead, TopicLayout
from engine.task_tables import TableInTask, TablesInTasks, TaskTable, plan_routes
from engine.task_upsert import TaskUpsert, UpsertInTask
from engine.threads import started_threads
from engine.views import register_query_views, scheduler_pool
from schema.catalog import Catalog, Source, View, ViewKind, parse_duration_ms
from schema.object_store import read_text, replace_text, s3_environment, subfolders
from schema.redis_client import connect as connect_redis
from schema.redis_client import is_cluster
from schema.settings import Settings
from schema.storage import (
    GRAPH_APPLYING,
    GRAPH_VERSION,
    META_LATE_EVENTS,
    META_WATERMARK,
    REPLAYED,
    RETIRED,
    Op,
    complete_field,
    delta_app_id,
    delta_table_path,
    fence_field,
    generation_field,
    graph_key,
    key_of,
    meta_key,
    op_del,
    op_set,
    parse_key,
    state_key,
    states_complete_key,
)

log = logging.getLogger("viewgate.engine.graph")
GRAPH_TIMINGS = "graph"  # the `view` of the graph's per-batch timings in its debug log
STREAM_KINDS = (ViewKind.AGGREGATE, ViewKind.WINDOW)  # in the graph: engine.stream_aggregates

def graph_views(catalog: Catalog) -> list[View]:
    """The views the graph query runs (View.in_graph), in dependency order."""
    return [v for v in dependency_order(catalog) if v.in_graph]


def graph_sources(catalog: Catalog) -> list[Source]:
    """The sources the graph query streams (those its views over topics read)."""
    names = dict.fromkeys(v.source for v in graph_views(catalog) if v.kind is not ViewKind.TABLE)
    return [catalog.sources[n] for n in names]


def graph_generation(generations: Mapping[str, int], catalog: Catalog) -> int:
    """The graph's generation: its views move to a new one together (engine.rebuild)."""
    return max((generations[v.name] for v in graph_views(catalog)), default=0)


def graph_query_name(generation: int) -> str:
    return f"graph:g{generation}"


def graph_checkpoint(settings: Settings, generation: int) -> str:
    return f"{settings.checkpoint_location}/_graph/g{generation}"


@dataclass
class _Read:
    """A batch's records per source, and what Spark's tasks folded of each stream
    aggregate's events (engine.task_read), with the largest event time they started from."""

    records: dict[str, SourceRecords]
    partials: dict[str, list[Partial]] = field(default_factory=dict)
    seen: dict[str, Seen] = field(default_factory=dict)
    # The views Spark's tasks computed (engine.task_upsert, engine.task_tables), ready to
    # commit.
    prepared: dict[str, Pending] = field(default_factory=dict)


class GraphBatch:
    """The foreachBatch function of the graph query."""

    def __init__(self, spark: SparkSession, settings: Settings, catalog: Catalog,
                 generations: Mapping[str, int], schemas: Mapping[str, StructType],
                 checkpoint: str, *, dead_letters: bool = True) -> None:
        self.catalog = catalog
        self.checkpoint = checkpoint
        self.views = graph_views(catalog)
        self.sources = graph_sources(catalog)
        self.committers = {
            v.name: ViewCommitter(
                settings, v, generations[v.name],
                # Only upsert views delete, by the source key a tombstone carries.
                (catalog.sources[v.source].key,) if v.kind is ViewKind.UPSERT else v.key,
                checkpoint, source=catalog.source_of(v).name,
                # One view's table maintenance at a time, not all in one batch.
                maintenance_phase=i / len(self.views))
            for i, v in enumerate(self.views)}
        self.dimensions = {v.name: Dimensions(settings, v.dimensions)
                           for v in self.views if v.kind is ViewKind.UPSERT}
        self.tables = {v.name: TableView(v.name, v.sql, v.key, {n: schemas[n] for n in v.reads})
                       for v in self.views if v.kind is ViewKind.TABLE}
        self.lineages = {name: _lineage(spark, table) for name, table in self.tables.items()}
        # Table views whose SQL the driver answers, with no Spark query: a join of two
        # inputs on one's key (a lookup: engine.projected_join), or columns of one input
        # picked, computed and filtered (engine.incremental.projected_rows).
        self.in_driver: dict[str, Evaluate] = {}
        self.joins: dict[str, ProjectedJoin] = {}
        for name, table in self.tables.items():
            join = ProjectedJoin.plan(table, self.lineages[name], {
                n: catalog.views[n].key for n in table.inputs if n in catalog.views})
            if join is not None:
                self.joins[name] = join
            evaluate = join.rows if join is not None else projected_rows(table)
            if evaluate is not None:
                self.in_driver[name] = evaluate
        # Each view its own session (temporary views are per session) and its own reader
        # of current rows, so that the views of one level run at once.
        self.sessions = {v.name: spark.newSession() for v in self.views}
        for session in self.sessions.values():
            # Their queries are small, over rows in the driver, with one shuffle partition:
            # adaptive execution has nothing to adapt and costs each query its re-planning
            # (an aggregate over 10 rows: 180 -> 135 ms without it, measured on 2 cores).
            session.conf.set("spark.sql.adaptive.enabled", "false")
        self.source_schemas = {s.name: struct_of(spark, s.schema) for s in self.sources}
        self.streams = {v.name: StreamAggregate(v, catalog.sources[v.source],
                                                self.source_schemas[v.source])
                        for v in self.views if v.kind in STREAM_KINDS}
        # Upsert views whose SQL only picks columns of their source: output column ->
        # source column. Their rows are taken from the batch as read, without a Spark
        # job of their own (one job fewer a batch on the path to every view after them).
        self.projections = {
            v.name: {out: column.name for out, column in found.outputs.items()
                     if column is not None}
            for v in self.views if v.kind is ViewKind.UPSERT and not v.dimensions
            for found in [_lineage(spark, TableView(
                v.name, v.sql, v.key, {v.source: self.source_schemas[v.source]}))]
            if found.plain_projection}
        by_name = {v.name: v for v in self.views}

        def delta_path(view: str) -> str:
            return delta_table_path(settings.delta_location, view, generations[view])

        self.current = {v.name: RedisRows.for_views(settings.redis_url, by_name, generations,
                                                    DeltaRows(delta_path))
                        for v in self.views if v.kind is ViewKind.TABLE}
        self.aggregates = {v.name: step for v in self.views if v.kind is ViewKind.TABLE
                           for step in [_aggregate_step(self.sessions[v.name],
                                                        self.tables[v.name], schemas[v.name])]
                           if step is not None}
        in_driver = sorted([*self.in_driver,
                            *(n for n, s in self.streams.items() if s.in_driver is not None),
                            *(n for n, s in self.aggregates.items() if s.evaluated_in_driver)])
        if in_driver:
            log.info("evaluated in the driver, without a Spark query: %s", ", ".join(in_driver))
        self.timings: dict[str, float] = {}  # of the last batch, for the debug log
        self.trim_free_memory = FreeMemoryTrim()
        self.stream_batches: dict[str, StreamBatch] = {}  # of the last batch, for metrics
        self.generation = graph_generation(generations, catalog)
        # Threads that live as long as the query, started once with deep stacks (above),
        # not ten new ones a second at the demo's pace.
        self.compute_threads = started_threads(len(self.views), "graph-view")
        self.delta_threads = started_threads(len(self.views), "graph-delta")
        self.redis = connect_redis(settings.redis_url, large_arguments=True)  # the applies, marks
        self._layout = self._value_layout()
        # The read in Spark's tasks when every stream aggregate is evaluated without Spark
        # (engine.task_read); else the batch's records all come to the driver.
        # The tasks also compute the upsert views that pick columns of their source.
        # So are the views over views, when the setting asks and the graph is partitioned
        # by one value (engine.task_tables).
        tables_in_tasks = (self._tables_in_tasks(settings, generations)
                           if settings.engine_task_tables else None)
        self.task_read = (TaskRead(list(self.streams.values()), schemas,
                                   self._upserts_in_tasks(settings, generations,
                                                          tables_in_tasks),
                                   tables_in_tasks)
                          if settings.engine_task_read
                          and all(s.in_driver is not None for s in self.streams.values())
                          else None)
        self.task_read_min_records = settings.engine_task_read_min_records
        self.early_merge_changes = settings.engine_early_merge_changes
        # Batches' records fetched from Kafka with no Spark job: read ahead by a process of
        # their own (engine.read_ahead), else by the driver itself when the batch comes.
        fetch = DriverFetch.for_settings(settings, self.sources)
        self.driver_fetch: ReadAhead | DriverFetch | None = (
            ReadAhead.for_settings(settings, fetch) or fetch)
        # The last batch's id and end offsets: where the next one's records start.
        self._ends: tuple[int, dict[str, dict[str, int]]] | None = None
        if self.task_read:
            log.info("a batch of %d Kafka records or more is folded by Spark's tasks",
                     self.task_read_min_records)
        self.dead_letters = {
            s.name: DeadLetterWriter(settings.kafka_bootstrap, settings.redis_url, catalog, s,
                                     fence=f"{s.name}/graph{self.generation}")
            for s in self.sources} if dead_letters else {}

    def _upserts_in_tasks(self, settings: Settings, generations: Mapping[str, int],
                          tables: TablesInTasks | None) -> list[tuple[str, UpsertInTask]]:
        """(topic, view) of the upsert views Spark's tasks can compute: those whose SQL
        picks columns of their source (self.projections), each routing its changes by
        its column in `tables`' routes when views over views computed there read it."""
        found = []
        for view in self.views:
            columns = self.projections.get(view.name)
            if columns is None:
                continue
            source = self.catalog.sources[view.source]
            found.append((source.topic, UpsertInTask(
                view.name, generations[view.name], view.key, source.key,
                tuple(columns.items()), self.committers[view.name].redis.writes,
                settings.redis_url, tables.routes.get(view.name) if tables else None,
                self._delta_in_tasks(settings, view))))
        return found

    def _delta_in_tasks(self, settings: Settings, view: View) -> DeltaInTask | None:
        """The view's table as the tasks that compute it write its files, when the setting
        asks and the table allows (engine.task_delta); None: the driver writes it."""
        committer = self.committers[view.name]
        if not settings.engine_task_delta or committer.delete_on != view.key:
            return None
        return committer.delta.task_writer(s3_environment(settings))

    def _tables_in_tasks(self, settings: Settings, generations: Mapping[str, int]
                         ) -> TablesInTasks | None:
        """The views over views as Spark's tasks compute them after the upsert views
        (engine.task_tables): when each is a join or an aggregate the driver evaluates
        without Spark, every view they read is one of them or an upsert view the tasks
        compute, and all are partitioned by one value (plan_routes); else None."""
        tables = [v for v in self.views if v.kind is ViewKind.TABLE]
        if not tables or any(self.aggregates.get(v.name) is not None
                             and not self.aggregates[v.name].evaluated_in_driver
                             for v in tables):
            return None
        inputs = {n for v in tables for n in v.reads} - {v.name for v in tables}
        if not inputs <= set(self.projections):
            return None
        routes = plan_routes([(self.tables[v.name], self.lineages[v.name],
                               self.joins.get(v.name), self.aggregates.get(v.name))
                              for v in tables])
        if routes is None:
            return None
        read = {n for v in tables for n in v.reads}
        return TablesInTasks(
            tuple(TableInTask(v.name, generations[v.name], v.key, routes[v.name],
                              self.tables[v.name], self.lineages[v.name],
                              self.joins.get(v.name), self.aggregates.get(v.name),
                              self.committers[v.name].redis.writes,
                              self._delta_in_tasks(settings, v)) for v in tables),
            routes,
            {n: StoredTable.of(self.catalog.views[n], generations[n]) for n in read},
            settings.redis_url)

    def close(self) -> None:
        """Release what the batch function holds beside its query, once the query has
        stopped (engine.query_resources): the read ahead (engine.read_ahead), the views'
        producers, Redis clients and Delta state, its threads."""
        if self.driver_fetch is not None:
            self.driver_fetch.close()
        for committer in self.committers.values():
            committer.close()
        for writer in self.dead_letters.values():
            writer.close()
        for rows in self.current.values():
            rows.close()
        self.redis.close()
        self.compute_threads.shutdown(wait=False)
        self.delta_threads.shutdown(wait=False)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        fences = self._fences(batch_id)
        if fences is None:
            # A rebuild switched the graph's views to a new generation: the engine
            # restarts the query on it (engine.runner.follow_rebuilds).
            return
        held, current = fences
        read = _Read({})
        covers: dict[str, Any] = {}
        by_fetch = by_tasks = False
        if len(held) < len(self.views):
            # What the batch covers, recorded by every view it commits: read once, not once
            # a view (in a bucket, a GET each).
            covers = offsets_fields(self.checkpoint, batch_id)
            ends = covers.get("offsets")
            starts = self._starts(batch_id, ends)
            fetched = (self.driver_fetch.read(starts, ends)
                       if self.driver_fetch is not None else None)
            by_fetch = fetched is not None
            by_tasks = not by_fetch and self._by_tasks(starts, ends)
            read = self._read(batch, {n: self._seen(self.committers[n])
                                      for n in self.streams if n not in held},
                              by_tasks, fetched, batch_id, held, covers, current)
            observe_graph_read("fetch" if by_fetch else "tasks" if by_tasks else "spark")
            for name, writer in self.dead_letters.items():
                writer.publish(read.records[name].bad, batch_id)
        self.timings = {"read_ms": (time.perf_counter() - started) * 1000}
        if by_tasks:
            self.timings["read_in_tasks"] = 1.0  # a batch folded by its tasks (profiles)
        if by_fetch:
            self.timings["read_by_fetch"] = 1.0  # fetched by the driver from Kafka
        self.stream_batches = {}
        try:
            # Each view is computed as soon as the views it reads are (Order does not wait
            # for ProductSales); views that do not depend on each other run at once.
            computing: dict[str, Future[Pending]] = {}
            for view in self.views:  # in dependency order: its inputs are submitted
                inputs = {n: computing[n] for n in view.reads if n in computing}
                computing[view.name] = self.compute_threads.submit(
                    self._compute, view, read, covers, batch_id, held, inputs)
            wait(computing.values())  # every view done, also when one failed
            pending = {name: f.result() for name, f in computing.items()}
            if not self._commit(batch_id, pending):
                return  # as above: the engine restarts the query on the new generation
            for name, prepared in pending.items():
                if prepared.delta_by_tasks:
                    self.timings[f"{name}_delta_in_tasks"] = 1.0
        finally:
            for view in self.views:
                IN_FLIGHT.pop(view.name, None)
            for name, prepared in read.prepared.items():
                self.committers[name].discard(prepared)  # files of a batch that failed
        self.timings["batch_ms"] = (time.perf_counter() - started) * 1000
        lap = time.perf_counter()
        if self.trim_free_memory():  # what a batch far larger than the usual left (malloc)
            self.timings["trim_ms"] = (time.perf_counter() - lap) * 1000
        observe_graph_steps(self.timings)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("graph batch %d: %s", batch_id,
                      ", ".join(f"{k} {v:.0f}" for k, v in self.timings.items()),
                      extra={"view": GRAPH_TIMINGS, "batch_id": batch_id,
                             "timings": self.timings})

    def _commit(self, batch_id: int, pending: Mapping[str, Pending]) -> bool:
        """Redis, then the change feeds, with Delta's MERGEs committed beside the feeds;
        False if a rebuild retired the generation meanwhile.

        Each view's MERGE commits once its gate opens: once Redis holds the view's batch as
        computed. A gate left closed (the batch failed before, or a rebuild retired it)
        commits nothing. A large batch's MERGEs start writing their files once its Redis
        apply is built, as it is sent: Redis then runs the writes for a few hundred
        milliseconds while the driver's interpreter would wait. A small batch's start after
        Redis answered: its apply takes a few milliseconds, and the MERGEs' Python (rows to
        Arrow, the key lookup) would hold the interpreter when Redis answers, delaying the
        change feeds (measured 2026-11-29: a live batch's round trip 6-7 -> 20-24 ms). The
        batch waits for every MERGE, also when a step failed."""
        gates: dict[str, Future[None]] = {name: Future() for name in pending}
        merges: dict[str, Future[None]] = {}

        def start_merges() -> None:
            merges.update({n: self.delta_threads.submit(self.committers[n].to_delta, p,
                                                        gates[n].result)
                           for n, p in pending.items()})
        try:
            lap = time.perf_counter()
            early = sum(len(p.events) for p in pending.values()) >= self.early_merge_changes
            statuses = self._apply(batch_id, pending, start_merges if early else None)
            if statuses is None:
                return False
            self.timings["apply_ms"] = (time.perf_counter() - lap) * 1000
            for name, prepared in pending.items():
                observe_rows_changed(name, len(prepared.events))
            for name, done in self.stream_batches.items():
                observe_stream(name, done.late, done.meta.get(META_WATERMARK))
            for view in self.views:
                failpoint("after_redis", view.name)
            lap = time.perf_counter()
            if not early:
                start_merges()  # from what Redis holds (REPLAYED: the stored changes)
            for name, gate in gates.items():
                if early and statuses.get(name) == REPLAYED:
                    # Redis held the batch already (another writer's): its stored changes
                    # replaced the computed ones, and the MERGE starts again from them.
                    gate.cancel()
                    wait([merges[name]])  # its files written, nothing committed
                    merges[name] = self.delta_threads.submit(self.committers[name].to_delta,
                                                             pending[name])
                else:
                    gate.set_result(None)
            # The views with the fewest changes first: a subscriber's gateway reads the
            # feeds in the order they arrive, so one view's thousands of changes (Order,
            # when a tier changes) no longer hold back a view of a few (CustomerStats).
            by_size = sorted(pending.items(), key=lambda item: len(item[1].events))
            sent = [self.committers[n].send(p) for n, p in by_size]
            for delivered in sent:  # the feeds' deliveries overlap
                delivered()
            self.timings["feed_ms"] = (time.perf_counter() - lap) * 1000
            wait(merges.values())
            for merge in merges.values():
                merge.result()  # a failed MERGE fails the batch, which Spark replays
            # Delta's time after Redis: what of the MERGEs the batch still waits for.
            self.timings["delta_ms"] = (time.perf_counter() - lap) * 1000
            return True
        finally:
            for gate in gates.values():
                gate.cancel()  # the gates not opened: nothing of theirs is committed
            wait(merges.values())

    def _fences(self, batch_id: int) -> tuple[set[str], set[str]] | None:
        """In one round trip: the views whose Redis holds `batch_id` already (a replay
        after a crash past their apply), and those it holds whole at the previous batch
        (only theirs may Spark's tasks compute, engine.task_upsert); None if a rebuild
        retired the graph's generation."""
        pipe = self.redis.pipeline(transaction=False)
        for view in self.views:
            generation = self.committers[view.name].generation
            pipe.hmget(meta_key(view.name), fence_field(generation), "generation",
                       complete_field(generation))
        held, current = set(), set()
        for view, (fence, live, complete) in zip(self.views, pipe.execute(), strict=True):
            if live is not None and int(live) > self.committers[view.name].generation:
                return None
            if fence is not None and int(fence) >= batch_id:
                held.add(view.name)
            if fence is not None and int(fence) == batch_id - 1 and complete is not None:
                current.add(view.name)
        return held, current

    def _compute(self, view: View, read: _Read, covers: Mapping[str, Any],
                 batch_id: int, held: set[str], inputs: Mapping[str, Future[Pending]]
                 ) -> Pending:
        """The view's batch, ready to commit: computed from the records and its inputs'
        pending changes (once they are computed), or as Redis holds it already. `covers`:
        what the batch covers (engine.commit.offsets_fields), recorded with its rows."""
        pending = {name: computed.result() for name, computed in inputs.items()}
        committer = self.committers[view.name]
        if view.name in held:
            return committer.stored(batch_id)
        started = time.perf_counter()
        if view.name in read.prepared:  # computed by Spark's tasks (engine.task_read)
            IN_FLIGHT[view.name] = batch_id
            prepared = read.prepared[view.name]
            self.timings[f"{view.name}_in_tasks"] = 1.0
        elif view.kind is ViewKind.UPSERT:
            rows, deleted = self._upsert(view, read.records[view.source].latest)
            prepared = committer.prepare(batch_id, rows, deleted, covers=covers)
        elif view.kind in STREAM_KINDS:
            done = self.streams[view.name].batch(
                self.sessions[view.name], read.records[view.source].events,
                read.seen[view.name], lambda keys: self._before(committer, keys),
                read.partials.get(view.name, ()))
            prepared = committer.prepare(batch_id, done.rows, (), done.before, meta=done.meta,
                                         covers=covers)
            self.stream_batches[view.name] = done
        else:
            rows, deleted, before, ops = self._table(view, batch_id, pending)
            prepared = committer.prepare(batch_id, rows, deleted, before, ops,
                                         covers=covers)
        self.timings[f"{view.name}_compute_ms"] = (time.perf_counter() - started) * 1000
        return prepared

    def _apply(self, batch_id: int, pending: Mapping[str, Pending],
               while_redis_applies: Callable[[], None] | None = None
               ) -> dict[str, int] | None:
        """Every view's Redis apply in one pipeline, between the graph's marks: what each
        view's apply said (schema.storage APPLIED, REPLAYED), views Redis held before left
        out; None if a rebuild retired the generation meanwhile. `while_redis_applies` is
        called once every apply is built, just before they are sent."""
        todo = [(name, p) for name, p in pending.items() if not p.applied]
        marker = graph_key(self.generation)
        # One pipeline: the mark, the applies, the mark. A cluster pipeline sends each master
        # its share apart, in no order between masters, so there the three go one by one.
        apart = is_cluster(self.redis)
        applying = self.redis.pipeline(transaction=False).hset(marker, GRAPH_APPLYING, batch_id)
        applies = self.redis.pipeline(transaction=False) if apart else applying
        for name, prepared in todo:
            self.committers[name].queue_apply(prepared, applies)
        landed = self.redis.pipeline(transaction=False) if apart else applies
        landed.hset(marker, GRAPH_VERSION, batch_id).hdel(marker, GRAPH_APPLYING)
        if while_redis_applies is not None:
            while_redis_applies()
        sent = time.perf_counter()
        if apart:
            applying.execute()
            statuses = [int(s) for s in applies.execute()]
            landed.execute()
        else:
            statuses = [int(s) for s in applies.execute()[1:-2]]
        self.timings["redis_ms"] = (time.perf_counter() - sent) * 1000
        if RETIRED in statuses:
            return None
        for (name, prepared), status in zip(todo, statuses, strict=True):
            self.committers[name].applied(prepared, status)
        return {name: status for (name, _), status in zip(todo, statuses, strict=True)}

    def _before(self, committer: ViewCommitter, keys: list[str]) -> Before:
        """What Redis holds of `keys`; Delta fills in rows Redis lost (a flush) and the
        gateway has not re-warmed yet."""
        before = committer.redis.before(committer.generation, keys)
        if not before.complete:
            missing = [k for k in keys if k not in before.rows]
            before.rows.update(committer.delta.rows(missing))
        return before

    def _seen(self, committer: ViewCommitter) -> Seen:
        """A stream aggregate's largest event time and late events so far (its meta)."""
        generation = committer.generation
        latest, late = self.redis.hmget(
            meta_key(committer.view.name), generation_field(META_MAX_EVENT_TIME, generation),
            generation_field(META_LATE_EVENTS, generation))
        moment = None if latest is None else datetime.datetime.fromisoformat(
            latest.decode().replace("Z", "+00:00"))
        return Seen(moment, int(late or 0))

    def _starts(self, batch_id: int, ends: dict[str, dict[str, int]] | None
                ) -> dict[str, dict[str, int]] | None:
        """Where the batch's records start: the previous batch's end offsets (kept from it,
        or read from the checkpoint), or for the first batch the source's starting offsets;
        None when the checkpoint has neither."""
        if ends is None:
            return None
        previous = None
        if self._ends is not None and self._ends[0] == batch_id - 1:
            previous = self._ends[1]
        elif batch_id > 0 and self.checkpoint:
            covered = read_batch_offsets(self.checkpoint, batch_id - 1)
            previous = covered.offsets if covered is not None else None
        elif self.checkpoint:
            # The first batch starts where the source's starting offsets were resolved to,
            # so it too is fetched without a Spark job (the first job of a new query costs
            # seconds: the executors' Python workers and classes started cold).
            previous = read_initial_offsets(self.checkpoint)
        self._ends = (batch_id, ends)
        return previous

    def _by_tasks(self, starts: dict[str, dict[str, int]] | None,
                  ends: dict[str, dict[str, int]] | None) -> bool:
        """Whether the batch's tasks fold its records (engine.task_read): when the setting
        asks and the batch covers engine_task_read_min_records records or more, counted
        from its offsets; a batch whose size is unknown is folded. Either way the records
        are the same, so a replay may take the other path."""
        if self.task_read is None:
            return False
        if ends is None:
            return True
        count = records_between(starts, ends)
        return count is None or count >= self.task_read_min_records

    def _read(self, batch: DataFrame, seen: Mapping[str, Seen], by_tasks: bool,
              fetched: list[dict[str, Any]] | None = None, batch_id: int = 0,
              held: set[str] = frozenset(), covers: Mapping[str, Any] | None = None,
              current: set[str] = frozenset()) -> _Read:
        """The batch's records per source: `fetched` by the driver (engine.driver_fetch),
        or in one Spark job, folded by its tasks (engine.task_read, which also compute the
        upsert views of `self.task_read` that Redis holds whole at the previous batch,
        `current`, as batch `batch_id` covering `covers`) or all of them collected.
        `batch`: the Kafka records as they are, parsed here only when Spark reads them
        (engine.sources.classify_sources; building its columns takes dozens of py4j
        calls). `seen`: the stream aggregates' meta before the batch."""
        records = {s.name: SourceRecords({}, []) for s in self.sources}
        by_topic = {topic: (records[layout.source], layout, stream)
                    for topic, (layout, stream) in self._layout.items()}
        if fetched is not None:
            take_rows(fetched, by_topic)
            return _Read(records, {}, dict(seen))
        batch = classify_sources(batch, self.sources)
        if by_tasks and self.task_read is not None:
            read = self._read_by_tasks(self.task_read, batch, seen, records, by_topic,
                                       batch_id, held, covers or {}, current)
            if read is not None:
                return read
            # A task handed a view back, and the others kept its records, or a record holds
            # a text that is not UTF-8: the batch is read again, all of it into the driver
            # (a second Spark job; rare: a row without a key, a key's records in two tasks).
        try:
            take_table(batch.toArrow(), by_topic)
        except UnicodeDecodeError:  # a Kafka key of raw bytes: Spark's rows decode it
            take_rows(spark_rows(batch), by_topic)
        return _Read(records, {}, dict(seen))

    def _read_by_tasks(self, task_read: TaskRead, batch: DataFrame, seen: Mapping[str, Seen],
                       records: dict[str, SourceRecords], by_topic: ByTopic, batch_id: int,
                       held: set[str], covers: Mapping[str, Any], current: set[str]
                       ) -> _Read | None:
        """The batch read by Spark's tasks (engine.task_read), which also compute the upsert
        views of theirs in `current` (engine.task_upsert) and, when all they need is in
        `current`, the views over views (engine.task_tables); None if the driver must read
        the batch itself (a task handed an upsert view back, a text that is not UTF-8)."""
        in_tasks = {u.view for _, u in task_read.upserts}
        now_ms = int(time.time() * 1000)
        # The views over views too, when every view they read or compute is held whole
        # at the previous batch (their inputs' changes then come from the tasks too).
        tables = task_read.tables
        with_tables = tables is not None and all(
            name in current and name not in held
            for name in (*tables.routes, *(t.view for t in tables.tables)))
        folded = task_read.fold(
            batch, {t: layout for t, (layout, _) in self._layout.items()},
            {n: s.max_event_time for n, s in seen.items()}, batch_id, now_ms,
            [v.name for v in self.views if v.name in current],
            # The last records of the upsert views the driver computes.
            {self.catalog.sources[v.source].topic for v in self.views
             if v.kind is ViewKind.UPSERT and v.name not in held
             and (v.name not in in_tasks or v.name not in current)},
            with_tables)
        prepared = self._prepared_by_tasks(batch_id, folded.upserts, now_ms, covers)
        if prepared is not None and with_tables:
            prepared.update(self._tables_by_tasks(batch_id, folded.tables, now_ms, covers))
        rows = None
        if prepared is not None:
            try:
                rows = folded.records
            except UnicodeDecodeError:  # a text not UTF-8: Spark's rows decode it
                pass
        for name in folded.upserts:
            observe_view_by_tasks(name, rows is not None)
        if rows is None or prepared is None:
            for name, found in (prepared or {}).items():
                self.committers[name].discard(found)
            return None
        take_rows(rows, by_topic, by_tasks=True)
        return _Read(records, folded.partials, dict(seen), prepared)

    def _prepared_by_tasks(self, batch_id: int, upserts: Mapping[str, list[TaskUpsert]],
                           now_ms: int, covers: Mapping[str, Any]) -> dict[str, Pending] | None:
        """The upsert views the tasks computed, ready to commit; None when a task handed one
        back (then the driver computes them all from the batch's records)."""
        prepared = {name: self.committers[name].prepared_by_tasks(batch_id, shares, now_ms,
                                                                   covers)
                    for name, shares in upserts.items()}
        handed = sorted(name for name, found in prepared.items() if found is None)
        if handed:
            for name, found in prepared.items():
                self.committers[name].discard(found)
            log.debug("batch %d: %s handed back by a task: the driver computes the upsert "
                      "views", batch_id, ", ".join(handed), extra={"batch_id": batch_id})
            return None
        log.debug("batch %d: %s computed by Spark's tasks", batch_id, ", ".join(prepared),
                  extra={"batch_id": batch_id})
        return {name: found for name, found in prepared.items() if found is not None}

    def _tables_by_tasks(self, batch_id: int, shares: Mapping[str, list[TaskTable]],
                         now_ms: int, covers: Mapping[str, Any]) -> dict[str, Pending]:
        """The views over views the tasks computed, ready to commit; none when a task
        handed them back (then the driver computes them from the upsert views' changes,
        as it does without the tasks)."""
        prepared = {name: self.committers[name].prepared_by_tasks(batch_id, found, now_ms,
                                                                   covers)
                    for name, found in shares.items()}
        computed = all(found is not None for found in prepared.values())
        for name in prepared:
            observe_view_by_tasks(name, computed)
        if not computed:
            for name, found in prepared.items():
                self.committers[name].discard(found)
            why = sorted({s.handed_back for found in shares.values() for s in found
                          if s.handed_back})
            log.debug("batch %d: the views over views handed back by a task (%s): the "
                      "driver computes them", batch_id, "; ".join(why),
                      extra={"batch_id": batch_id})
            return {}
        log.debug("batch %d: %s computed by Spark's tasks", batch_id, ", ".join(prepared),
                  extra={"batch_id": batch_id})
        return {name: found for name, found in prepared.items() if found is not None}

    def _value_layout(self) -> dict[str, tuple[TopicLayout, bool]]:
        """Per topic: where its records are in the parsed batch
        (engine.task_read.TopicLayout), and whether a stream aggregate reads the source's
        events. A source's parsed value has the fields of its schema as Spark reads the
        DDL (source_schemas), and Spark's corrupt-record field."""
        streamed = {self.catalog.view(v).source for v in self.streams}
        layout = {}
        for i, source in enumerate(self.sources):
            column, wanted = value_column(i), source_columns(source)
            parsed = self.source_schemas[source.name].fieldNames()
            same = [f for f in parsed if f != CORRUPT] == wanted
            layout[source.topic] = (TopicLayout(source.name, column, tuple(wanted), same,
                                                source.key),
                                    source.name in streamed)
        return layout

    def _upsert(self, view: View, latest: Mapping[str, dict[str, Any] | None]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        source = self.catalog.sources[view.source]
        deleted = [{source.key: key} for key, value in latest.items() if value is None]
        live = [value for value in latest.values() if value is not None]
        if not live:
            return [], deleted
        picked = self.projections.get(view.name)
        if picked is not None:
            return [{out: value[column] for out, column in picked.items()}
                    for value in live], deleted
        session = self.sessions[view.name]
        frame_of(session, live, self.source_schemas[source.name]).createOrReplaceTempView(
            source.name)
        self.dimensions[view.name].register(session)
        return rows_of(session.sql(view.sql), len(live)), deleted

    def _table(self, view: View, batch_id: int, pending: Mapping[str, Pending]
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Before | None, list[Op]]:
        """The view's new rows, deleted keys, what Redis held for every key it compared
        (the commit needs it too: read once), and the Redis writes of its states."""
        changes = {name: [(e.before, e.row) for e in pending[name].events]
                   for name in view.reads}
        changes = {name: pairs for name, pairs in changes.items() if pairs}
        if not changes:
            return [], [], None, []
        committer = self.committers[view.name]
        # Its inputs' rows as this batch leaves them: Redis does not hold the batch yet.
        self.current[view.name].start_batch({name: pending[name].new_rows() for name in changes})
        read: list[Before] = []

        def stored(keys: set[Key]) -> StoredRows:
            # A key with a null has no stored row: its new row is dead-lettered (commit).
            texts = {key_text(k): k for k in keys if None not in k}
            before = self._before(committer, list(texts))
            read.append(before)
            return StoredRows({texts[t]: row for t, row in before.rows.items()},
                              {texts[t]: text for t, text in before.encoded.items()})

        def key_text(key: Key) -> str:
            return key_of(dict(zip(view.key, key, strict=True)), view.key)

        started = time.perf_counter()
        ops: list[Op] = []
        aggregate = self.aggregates.get(view.name)
        if aggregate is not None:
            found, ops = self._aggregate(view, aggregate, changes, batch_id, read, stored,
                                         key_text)
            self.timings[f"{view.name}_aggregate_ms"] = (time.perf_counter() - started) * 1000
            self.timings.update({f"{view.name}_{k}": v for k, v in aggregate.timings.items()})
        else:
            steps: dict[str, float] = {}
            found = view_changes(self.sessions[view.name], self.tables[view.name],
                                 self.lineages[view.name], changes, self.current[view.name],
                                 stored, steps, self.in_driver.get(view.name))
            self.timings.update({f"{view.name}_{step}_ms": ms for step, ms in steps.items()})
        rows = [new for _, new in found.values() if new is not None]
        # Deleted by key, typed as the view's fields (stored rows are in JSON form).
        deleted = [dict(zip(view.key, parse_key(view, key_of(old, view.key)), strict=True))
                   for old, new in found.values() if new is None and old is not None]
        log.debug("%s batch %d: %d keys changed", view.name, batch_id, len(found),
                  extra={"view": view.name, "batch_id": batch_id})
        return rows, deleted, read[-1] if read else None, ops

    def _aggregate(self, view: View, step: AggregateStep, changes: Mapping[str, list[Change]],
                   batch_id: int, read: list[Before],
                   stored: Callable[[set[Key]], dict[Key, dict[str, Any]]],
                   key_text: Callable[[Key], str]) -> tuple[dict[Key, Change], list[Op]]:
        """An aggregate view's changes from its input's changes and its groups' states
        (engine.aggregates), and the Redis writes of the new states."""
        committer = self.committers[view.name]
        plan = step.plan
        state_hash = state_key(view.name, committer.generation)
        states_complete = states_complete_key(view.name, committer.generation)
        ops: list[Op] = []

        def states(texts: list[str]) -> tuple[dict[str, State], bool]:
            before = read[-1]  # the rows were read first: their fence says if states hold
            if before.fence is None and batch_id == 0:
                # The generation's first batch: from here every group keeps a state.
                ops.append(op_set(states_complete, "1"))
                return {}, True
            if before.fence is None or before.fence < batch_id - 1 or not before.complete:
                # Redis lost batches (restored from an older snapshot, flushed): states
                # may be behind the rows. Drop them all; each group affected from now on
                # is recomputed from its rows once.
                ops.extend([op_del(state_hash), op_del(states_complete)])
                return {}, False
            found, complete = committer.redis.states(committer.generation, texts)
            return {k: step.codec.decode(v) for k, v in found.items()}, complete

        def group_rows(keys: set[Key]) -> list[dict[str, Any]]:
            found = self.current[view.name].rows_where(plan.table, plan.group[0],
                                                       {k[0] for k in keys})
            return [r for r in found
                    if tuple(json_value(r[g]) for g in plan.group) in keys]

        found, new_states = step.changes(self.sessions[view.name], changes.get(plan.table, []),
                                         key_text, states, stored, group_rows)
        return found, ops + step.state_ops(state_hash, new_states)


def _aggregate_step(session: SparkSession, table: TableView, schema: StructType
                    ) -> AggregateStep | None:
    """The aggregate step of a view over views whose SQL is one grouped aggregate of its
    one input (engine.aggregates); None: the view recomputes its affected keys."""
    plan = plan_aggregate(table.sql, table.key)
    if plan is None or set(table.inputs) != {plan.table}:
        return None
    input_schema = table.inputs[plan.table]
    try:
        partial = partial_schema(session, plan, input_schema)
        step = AggregateStep(plan, StateCodec(plan, partial), input_schema)
        final = step.final_schema(session)
    except Exception as exc:  # noqa: BLE001 - Spark's analysis errors come in many kinds
        log.warning("%s: kept as a recompute, its aggregate could not be split: %s",
                    table.name, exc, extra={"view": table.name})
        return None
    # The split must give the view's own columns and types, or it is not the view.
    same = [(f.name, f.dataType) for f in final.fields] == [
        (f.name, f.dataType) for f in schema.fields]
    return step if same and supported_types(partial) else None


def _lineage(spark: SparkSession, table: TableView) -> Lineage:
    return analysed(spark, table.sql, table.inputs).lineage


def start_graph_query(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    generations: Mapping[str, int],
    schemas: Mapping[str, StructType],
    *,
    available_now: bool = False,
    max_offsets: int | None = None,
    dead_letters: bool = True,
) -> StreamingQuery:
    """Start the graph query of `generations` (every graph view's generation)."""
    sources = graph_sources(catalog)
    generation = graph_generation(generations, catalog)
    name = graph_query_name(generation)
    checkpoint = graph_checkpoint(settings, generation)
    claim_checkpoint(settings, catalog, generations)
    topics = ",".join(s.topic for s in sources)
    # The records as Kafka holds them: each batch parses them only when Spark reads them
    # (GraphBatch.__call__). Spark plans a streaming query's every batch, and parsing
    # every source in the plan cost 35 ms a batch of its planning and its foreachBatch
    # call (a no-op batch function: 75 ms a trigger against 39, 2 cores, 2026-11-30).
    records = read_kafka(spark, settings, topics, max_offsets)
    # What the queries stopped since (this one's predecessor) held is released first: a
    # read ahead still running would compete with this query's for the same records.
    release_stopped()
    step = GraphBatch(spark, settings, catalog, generations, schemas, checkpoint,
                      dead_letters=dead_letters)
    register_query_views(name, [(v.name, generations[v.name]) for v in step.views])
    trigger = ({"availableNow": True} if available_now
               else {"processingTime": graph_trigger(catalog)})
    keep_collector_out_of_batches()  # the batches' rows go by reference counting
    with scheduler_pool(spark, name):
        return start_holding(step, lambda: (
            records.writeStream.foreachBatch(step).queryName(name)
            .option("checkpointLocation", checkpoint).trigger(**trigger).start()))


def read_ahead_pids() -> list[int]:
    """The read-ahead processes of the graph queries this process runs (their CPU is the
    driver's in the bench's shares)."""
    return [b.driver_fetch.pid for b in held(GraphBatch)
            if isinstance(b.driver_fetch, ReadAhead) and b.driver_fetch.pid is not None]

# The graph's views, recorded in its checkpoint when it is created.
VIEWS_FILE = "viewgate-views.json"


def claim_checkpoint(settings: Settings, catalog: Catalog, generations: Mapping[str, int]
                     ) -> None:
    """Check that the graph's checkpoint belongs to the catalog's graph views, recording
    them when it is new. A view added to the graph, or one committed by another query (an
    engine from before views over views), would start from where the checkpoint stands
    and miss every earlier event: refused, with the fix."""
    checkpoint = graph_checkpoint(settings, graph_generation(generations, catalog))
    names = sorted(v.name for v in graph_views(catalog))
    fix = (f"run `viewgate rebuild {names[0]}`: it recomputes the graph's views together "
           "into a new generation while the current one keeps serving")
    recorded = f"{checkpoint.rstrip('/')}/{VIEWS_FILE}"  # on a local disk or in a bucket
    text = read_text(recorded)
    if text is not None:
        had = json.loads(text)
        if had != names:
            added = sorted(set(names) - set(had)) or ["(none)"]
            raise GraphChanged(f"the graph query's checkpoint runs {', '.join(had)}; the "
                               f"catalog adds {', '.join(added)}: {fix}")
        return
    committed = [n for n in names
                 if DeltaTable(delta_table_path(settings.delta_location, n, generations[n]))
                 .transaction_version(delta_app_id(n, generations[n])) is not None]
    if committed or "offsets" in subfolders(checkpoint):
        raise GraphChanged(f"{', '.join(committed) or 'the graph'} were committed by another "
                           f"query than this graph query's checkpoint ({checkpoint}): {fix}")
    replace_text(recorded, json.dumps(names))


def graph_trigger(catalog: Catalog) -> str:
    """The shortest trigger interval its views declare."""
    return f"{min(parse_duration_ms(v.trigger) for v in graph_views(catalog))} milliseconds"
