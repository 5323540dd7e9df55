"""Run the engine: check the catalog with Spark, create the tables, start one query
per view and one dead-letter query per source, and keep them running, moving a view
to its rebuilt generation when `viewgate rebuild` switches it."""

from __future__ import annotations

import logging
import threading
import time
import weakref

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from engine.analysis import analyse
from engine.failures import summarize
from engine.generations import reconcile_generation
from engine.graph import graph_sources, graph_views, start_graph_query
from engine.maintenance import configure_table
from engine.progress import ProgressRecorder
from engine.query_resources import release_stopped
from engine.sinks.delta_sink import ensure_table
from engine.topics import ensure_view_topics
from engine.views import start_deadletter_query, start_view_query
from schema.catalog import Catalog
from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from schema.storage import delta_table_path, read_current_generation

log = logging.getLogger("viewgate.engine")


# The progress listener each session has, so that starting queries again (tests, restarts
# in one process) does not stack listeners that each write every progress event.
_recorders: weakref.WeakKeyDictionary[SparkSession, ProgressRecorder] = weakref.WeakKeyDictionary()


def record_progress(spark: SparkSession, redis_url: str) -> None:
    current = _recorders.get(spark)
    if current is not None and current.redis_url == redis_url:
        return
    if current is not None:
        spark.streams.removeListener(current)
    recorder = ProgressRecorder(redis_url)
    spark.streams.addListener(recorder)
    _recorders[spark] = recorder


def prepare(spark: SparkSession, settings: Settings, catalog: Catalog
            ) -> tuple[dict[str, int], dict[str, StructType]]:
    """Analyse every view and make sure its current Delta table and meta exist.
    Returns each view's current generation and output schema."""
    warnings: list[str] = []
    schemas = analyse(spark, catalog, warnings)
    for warning in warnings:
        log.warning(warning)
    ensure_view_topics(settings, catalog)
    prepared: dict[str, int] = {}
    client = connect_redis(settings.redis_url)
    try:
        for name, schema in schemas.items():
            generation = reconcile_generation(settings, client, name)
            path = delta_table_path(settings.delta_location, name, generation)
            ensure_table(spark, path, schema)
            configure_table(path, catalog.view(name), settings.delta_target_file_bytes)
            prepared[name] = generation
    finally:
        client.close()
    return prepared, schemas


class Engine:
    """In one SparkSession: the graph query (every UPSERT and TABLE view, engine.graph), one
    query per stream aggregate (AGGREGATE, WINDOW), and a dead-letter query for each source
    only those read."""

    def __init__(
        self, spark: SparkSession, settings: Settings, catalog: Catalog, *, available_now=False
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.catalog = catalog
        self.available_now = available_now
        self.generations: dict[str, int] = {}
        self.schemas: dict[str, StructType] = {}
        self.graph: list[str] = [v.name for v in graph_views(catalog)]
        self.graph_query: StreamingQuery | None = None
        self.view_queries: dict[str, StreamingQuery] = {}
        self.other_queries: list[StreamingQuery] = []

    @property
    def queries(self) -> list[StreamingQuery]:
        graph = [self.graph_query] if self.graph_query is not None else []
        return [*self.other_queries, *graph, *self.view_queries.values()]

    def start(self) -> list[StreamingQuery]:
        started = time.monotonic()
        self.generations, self.schemas = prepare(self.spark, self.settings, self.catalog)
        prepared = time.monotonic()
        record_progress(self.spark, self.settings.redis_url)
        in_graph = {s.name for s in graph_sources(self.catalog)}
        self.other_queries = [
            start_deadletter_query(
                self.spark, self.settings, self.catalog, source, available_now=self.available_now
            )
            for source in self.catalog.sources.values()
            if self.catalog.views_reading(source.name) and source.name not in in_graph
        ]
        if self.graph:
            self._start_graph()
        for name in self.catalog.views:
            if name not in self.graph:
                self._start_view(name)
        log.info("views analysed and their tables checked in %.1f s, queries started in %.1f s",
                 prepared - started, time.monotonic() - prepared)
        return self.queries

    def _start_graph(self) -> None:
        self.graph_query = start_graph_query(
            self.spark, self.settings, self.catalog, self.generations, self.schemas,
            available_now=self.available_now)

    def _start_view(self, name: str) -> None:
        self.view_queries[name] = start_view_query(
            self.spark,
            self.settings,
            self.catalog,
            self.catalog.view(name),
            self.generations[name],
            available_now=self.available_now,
        )

    def follow_rebuilds(self) -> list[str]:
        """Restart the query of every view a rebuild switched to a new generation; its
        checkpoint carries on where the rebuild stopped. Returns the views moved."""
        moved = []
        for name, running in self.generations.items():
            current = read_current_generation(self.settings.delta_location, name)
            if current > running:
                self.generations[name] = current
                moved.append(name)
                if name not in self.graph:
                    self.view_queries[name].stop()
                    self._start_view(name)
                log.info("view %s now runs generation %d", name, current)
        if self.graph_query is not None and set(moved) & set(self.graph):
            self.graph_query.stop()  # its views moved together (engine.rebuild)
            self._start_graph()
        return moved

    def run_until_stopped(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Block until `stop` is set. A query that fails (Kafka unreachable, Redis down, a
        bug) is restarted from its checkpoint after a growing pause, so nothing is lost or
        counted twice; its error is in the view's meta and metrics meanwhile."""
        restarts = Restarts()
        try:
            while not stop.wait(poll_s):
                graph = self.graph_query
                if graph is not None and not graph.isActive and graph.exception() is not None:
                    if restarts.due(graph.name, str(graph.exception())):
                        self._start_graph()
                for name, query in list(self.view_queries.items()):
                    if not query.isActive and query.exception() is not None:
                        if restarts.due(query.name, str(query.exception())):
                            self._start_view(name)
                for i, query in enumerate(self.other_queries):
                    if not query.isActive and query.exception() is not None:
                        if restarts.due(query.name, str(query.exception())):
                            self.other_queries[i] = self._restart_other(query.name)
                self.follow_rebuilds()
        finally:
            self.stop_queries()

    def stop_queries(self, drain_s: float = 30.0) -> None:
        """Stop every query, each once its batch in flight is done (within `drain_s` for
        all): stopping a query interrupts its batch, and one interrupted inside its Python
        commit makes Spark's stream thread fail noisily (a StackOverflowError in its error
        handling). A JVM gone already (killed on its own) leaves nothing to stop."""
        deadline = time.monotonic() + drain_s
        try:
            for query in self.queries:
                # Spark offers no event for the end of a batch: poll its status.
                while (query.isActive and query.status["isTriggerActive"]
                       and time.monotonic() < deadline):
                    time.sleep(0.05)
                query.stop()
        except Exception:  # noqa: BLE001 - Py4J and PySpark errors of a dead JVM vary
            pass
        finally:
            release_stopped()  # what their batch functions held: read aheads, producers

    def _restart_other(self, name: str) -> StreamingQuery:
        source = self.catalog.sources[name.split(":", 1)[1]]
        return start_deadletter_query(self.spark, self.settings, self.catalog, source,
                                      available_now=self.available_now)


class Restarts:
    """When to restart a failed query: after 1 s, then twice as long each time it fails
    again within a minute of its restart, up to a minute."""

    FIRST_S, MAX_S, HEALTHY_S = 1.0, 60.0, 60.0

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.pause: dict[str, float] = {}
        self.failed_at: dict[str, float] = {}
        self.restarted_at: dict[str, float] = {}

    def due(self, name: str, error: str) -> bool:
        """Called while `name` is down; True once it should be started again."""
        now = self.clock()
        if name not in self.failed_at:
            self.failed_at[name] = now
            recently = now - self.restarted_at.get(name, -self.HEALTHY_S) < self.HEALTHY_S
            previous = self.pause.get(name, 0.0)
            self.pause[name] = min(previous * 2, self.MAX_S) if recently and previous \
                else self.FIRST_S
            log.warning("query %s failed, restarting in %.0f s: %s", name, self.pause[name],
                        summarize(error), extra={"query": name})
        if now - self.failed_at[name] < self.pause[name]:
            return False
        del self.failed_at[name]
        self.restarted_at[name] = now
        return True


def start_all(
    spark: SparkSession, settings: Settings, catalog: Catalog, *, available_now: bool = False
) -> list[StreamingQuery]:
    return Engine(spark, settings, catalog, available_now=available_now).start()
