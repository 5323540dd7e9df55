"""The engine group: how many events per second the engine carries through the demo's view
graph into `CustomerStats`, against the same Kafka source and parsing into a no-op sink,
and how soon after its production an event is visible in Redis while the demo views run
live.

Throughput: order events are preloaded (in worker processes) into a topic of their own;
then the no-op query and the engine's graph query (engine.graph.start_graph_query: every
UPSERT and TABLE view, OrderRecord -> Order -> CustomerStats, each committed to Redis, the
change feed and Delta) each read it from the earliest offset in batches of `engine_batch`
events. The rate is the events of every batch but the first (warm-up) over the sum of
their trigger durations, from Spark's query progress. The run counts only if
CustomerStats ends up exactly right: its order counts in Redis and in Delta add up to the
current orders that are not cancelled.

Freshness: every demo view runs as `viewgate engine` runs them (engine.runner.start_all);
a producer process writes demo traffic at a steady rate and records each event's Kafka
partition, offset and create time; a watcher process polls the views' meta hashes in
Redis, noting when each batch (version) became visible and which offsets it covered. An
event is visible when the first batch whose end offset is past it is.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from engine.batch_offsets import read_initial_offsets
from engine.metrics import records_read
from schema import demo
from schema.catalog import Catalog
from schema.delta_read import live_rows
from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from viewgate.bench.group import BenchContext, BenchError, Group, GroupResult
from viewgate.bench.report import Figure, Plot
from viewgate.bench.stats import distribution
from viewgate.bench.workers import (
    Worker,
    new_event,
    preload_orders,
    produce_paced,
    watch_meta,
)

VIEW = "CustomerStats"
# Views whose SQL counts only orders with status 'placed': only those events change them.
_PLACED_ONLY = {"ProductSales"}
# The deepest view of the demo's graph (Customer, OrderRecord -> Order -> CustomerStats).
CHAINED_VIEW = "CustomerStats"
# Demo events per generator in the preload: keeps the demo's customer list short and fast.
_CHUNK_EVENTS = 50_000
_WATCH_INTERVAL_S = 0.005
_STARTUP_TIMEOUT_S = 300

FIGURES = (
    Figure("engine_events_per_s", "events/s into CustomerStats", "events/s", at_least=20_000),
    Figure("engine_noop_events_per_s", "same source and parsing, no-op sink", "events/s"),
    Figure("engine_events_ratio", "CustomerStats rate / no-op rate", "x"),
    Figure("engine_events", "events per throughput run", "events"),
    Figure("engine_batch_events", "events per batch (maxOffsetsPerTrigger)", "events"),
    Figure("engine_restart_to_commit_s", "SIGKILL -> first new commit after a restart, median",
           "s", below=15),
    Figure("engine_freshness_p50_ms", "produced -> visible in Redis, p50", "ms", below=500),
    Figure("engine_freshness_p99_ms", "produced -> visible in Redis, p99", "ms", below=1_500),
    Figure("engine_chained_freshness_p99_ms", "the same for CustomerStats, view over views "
           "over views, p99", "ms", below=1_000),
    Figure("engine_freshness_samples", "events measured for freshness", "events"),
    Figure("engine_freshness_rate_per_s", "producer rate during freshness", "events/s"),
)


def catalog_on_topics(catalog: Catalog, prefix: str) -> Catalog:
    """The catalog with every source reading `<prefix>.<topic>`, so a measurement has its
    own topics (the view names, and so Redis keys and Delta paths, stay the same)."""
    sources = [
        dataclasses.replace(s, topic=f"{prefix}.{s.topic}") for s in catalog.sources.values()
    ]
    return Catalog.of(sources, catalog.views.values())


# --- Progress and commit timings ----------------------------------------------------------


def progress_dicts(query: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in query.recentProgress]


def with_first_start(progress: list[dict[str, Any]], checkpoint: str) -> list[dict[str, Any]]:
    """`progress` with the query's first batch's start filled in from its checkpoint (the
    source's starting offsets, engine.batch_offsets.read_initial_offsets). Spark's progress
    names no start for a first batch, so when the graph's driver fetched that batch (no
    Spark read: numInputRows 0) records_read could not count it."""
    starts = read_initial_offsets(checkpoint)
    if starts is None:
        return progress
    return [{**p, "sources": [{**s, "startOffset": s["startOffset"] or json.dumps(starts)}
                              for s in p["sources"]]}
            if p["batchId"] == 0 else p for p in progress]


def steady_batches(progress: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The batches with input, less the first (warm-up) and a last one of leftovers."""
    batches = [p for p in progress if records_read(p) > 0]
    steady = batches[1:]
    largest = max((records_read(p) for p in batches), default=0)
    if steady and records_read(steady[-1]) < largest / 2:
        steady = steady[:-1]
    return steady


def throughput(progress: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Sustained events/s from a query's progress: the events of every batch with input
    but the first (JIT, state store and Delta snapshot warm-up) and a last one holding
    only the remainder (under half the largest batch: mostly fixed cost) over the sum of
    their trigger durations; plus each batch's rate and the mean of each phase's duration."""
    batches = [p for p in progress if records_read(p) > 0]
    steady = steady_batches(progress)
    if not steady:
        raise BenchError(
            f"only {len(batches)} batch(es) had input: preload more events (--engine-events) "
            "or make batches smaller (--engine-batch)"
        )
    rows = sum(records_read(p) for p in steady)
    ms = sum(p["durationMs"]["triggerExecution"] for p in steady)
    phases = sorted({k for p in steady for k in p["durationMs"]})
    return {
        "events_per_s": rows / (ms / 1000),
        "input_events": sum(records_read(p) for p in batches),
        "batches": len(steady),
        "batch_events_per_s": [
            records_read(p) / max(p["durationMs"]["triggerExecution"], 1) * 1000 for p in batches
        ],
        "phase_ms": {
            k: sum(p["durationMs"].get(k, 0) for p in steady) / len(steady) for k in phases
        },
    }


class _CommitTimings(logging.Handler):
    """Collects the per-batch timings engine.commit and engine.graph log at DEBUG, by view
    (the graph's own, for the whole batch, under engine.graph.GRAPH_TIMINGS)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.by_view: dict[str, dict[int, dict[str, float]]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        timings = getattr(record, "timings", None)
        if timings is not None:
            # The Delta step logs apart (it may run while the next views compute).
            self.by_view.setdefault(record.view, {}).setdefault(record.batch_id, {}).update(
                timings)


@contextlib.contextmanager
def commit_timings() -> Iterator[_CommitTimings]:
    handler = _CommitTimings()
    loggers = [logging.getLogger(n) for n in ("viewgate.engine.commit", "viewgate.engine.graph")]
    before = [(logger.level, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # collected here, not printed: lines per batch
    try:
        yield handler
    finally:
        for logger, (level, propagate) in zip(loggers, before, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


def profile(
    progress: Sequence[Mapping[str, Any]],
    commits: Mapping[int, Mapping[str, float]],
    batches: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, float]:
    """Mean ms per batch of Spark's phases and of the timings logged for it (batches with
    input, but the first, unless `batches` names them): a view query's commit steps
    (`compute_ms` is then addBatch less the commit: running the view's plan), or the graph's
    steps (engine.graph)."""
    if batches is None:
        batches = steady_batches(progress) or [p for p in progress if records_read(p) > 0]
    if not batches:
        return {}
    out: dict[str, float] = {"batches": len(batches)}
    for phase in (
        "triggerExecution",
        "addBatch",
        "latestOffset",
        "queryPlanning",
        "walCommit",
        "commitOffsets",
        "getBatch",
    ):
        out[f"{phase}_ms"] = sum(p["durationMs"].get(phase, 0) for p in batches) / len(batches)
    state_commit = [
        sum(op.get("commitTimeMs", 0) for op in p.get("stateOperators", [])) for p in batches
    ]
    if any(state_commit):
        out["state_commit_ms"] = sum(state_commit) / len(batches)
    logged = [commits[p["batchId"]] for p in batches if p["batchId"] in commits]
    for step in sorted({k for timings in logged for k in timings}):
        values = [t[step] for t in logged if step in t]
        out[step] = sum(values) / len(values)
    commit_steps = ("redis_ms", "feed_ms", "delta_ms")
    if all(step in out for step in commit_steps) and "read_ms" not in out:
        out["compute_ms"] = out["addBatch_ms"] - sum(out[s] for s in commit_steps)
    return {k: round(v, 1) for k, v in out.items()}


def tail_profile(
    progress: Sequence[Mapping[str, Any]], commits: Mapping[int, Mapping[str, float]],
    share: float = 0.05,
) -> dict[str, Any]:
    """What the slowest batches spend: the profile of the slowest `share` of the steady
    batches by trigger time, beside the distribution of every batch's trigger time and of
    the idle gap before it (from the previous batch's end to its start: the trigger's
    wait, or the driver busy between batches)."""
    batches = steady_batches(progress)
    if len(batches) < 2:
        return {}
    trigger = [p["durationMs"]["triggerExecution"] for p in batches]
    starts = {p["batchId"]: _epoch_ms(p["timestamp"]) for p in progress}
    ends = {p["batchId"]: starts[p["batchId"]] + p["durationMs"]["triggerExecution"]
            for p in progress}
    gaps = [starts[p["batchId"]] - ends[p["batchId"] - 1]
            for p in batches if p["batchId"] - 1 in ends]
    slowest = _slowest(batches, share)
    return {
        "trigger_ms": {k: round(v, 1) for k, v in distribution(trigger).items()},
        "gap_ms": {k: round(v, 1) for k, v in distribution(gaps).items()} if gaps else {},
        "slowest_batches": [
            {"batch_id": p["batchId"], "started": p["timestamp"],
             **{f"{k}_ms": v for k, v in p["durationMs"].items()},
             **{k: round(v, 1) for k, v in commits.get(p["batchId"], {}).items()}}
            for p in slowest],
        "slowest": profile(progress, commits, slowest),
    }


def live_tail(progress: Sequence[Mapping[str, Any]], views: Sequence[str],
              commits: Mapping[str, Mapping[int, Mapping[str, float]]]) -> dict[str, Any]:
    """The freshness's tail: what the graph query's slowest batches spend (`progress`: the
    graph query's), as a whole and in each of its `views`' commits (their Delta step, a
    wait for maintenance included)."""
    from engine.graph import GRAPH_TIMINGS

    tail = tail_profile(progress, commits.get(GRAPH_TIMINGS, {}))
    if not tail:
        return {}
    slowest = _slowest(steady_batches(progress))
    return {**tail, "views": {name: profile(progress, commits.get(name, {}), slowest)
                              for name in sorted(views)}}


def _slowest(batches: Sequence[Mapping[str, Any]], share: float = 0.05
             ) -> list[Mapping[str, Any]]:
    """The slowest `share` of `batches` by trigger time (at least one)."""
    ordered = sorted(batches, key=lambda p: p["durationMs"]["triggerExecution"])
    return ordered[-max(1, round(len(batches) * share)):]


def _epoch_ms(timestamp: str) -> float:
    """Spark's progress timestamp (ISO 8601 in UTC, millisecond precision) in epoch ms."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000


def _run_to_end(query: Any, timeout_s: float) -> list[dict[str, Any]]:
    if not query.awaitTermination(timeout_s):
        query.stop()
        raise BenchError(f"query {query.name} did not finish within {timeout_s:.0f} s")
    if query.exception() is not None:
        raise BenchError(f"query {query.name} failed: {query.exception()}")
    return progress_dicts(query)


# --- Throughput ---------------------------------------------------------------------------


def _preload(ctx: BenchContext, settings: Settings, topic: str) -> list[Worker]:
    events = ctx.sizes.engine_events
    parallel = max(1, min(4, _cores()))
    per_worker = [events // parallel + (i < events % parallel) for i in range(parallel)]
    # Enough chunks that each worker reaches its share although ~2% of demo events are
    # customer events, which do not go to the orders topic.
    chunks_each = math.ceil(max(per_worker) / (_CHUNK_EVENTS * 0.9)) + 1
    return [
        Worker(
            f"preload {i + 1}/{parallel}",
            preload_orders,
            settings.kafka_bootstrap,
            topic,
            1000,
            per_worker[i],
            [i + parallel * c for c in range(chunks_each)],
            _CHUNK_EVENTS,
        )
        for i in range(parallel)
    ]


def _cores() -> int:
    from viewgate.bench.results import cpu_cores

    return cpu_cores()


def _start_noop(spark: Any, settings: Settings, catalog: Catalog) -> Any:
    from engine.sources import classify, read_kafka, source_events

    source = catalog.source_of(catalog.view(VIEW))
    events = source_events(classify(read_kafka(spark, settings, source.topic), source), source)
    return (
        events.writeStream.format("noop")
        .queryName("bench:noop")
        .option("checkpointLocation", f"{settings.checkpoint_location}/_bench_noop")
        .trigger(availableNow=True)
        .start()
    )


def _verify(settings: Settings, generation: int, placed: int, last_batch: int) -> None:
    """CustomerStats must count every current order that is not cancelled (`placed`)
    exactly once, in Redis and in Delta."""
    from deltalake import DeltaTable

    from schema.storage import ViewMeta, decode_row, delta_table_path, meta_key, row_key

    client = connect_redis(settings.redis_url)
    try:
        keys = list(client.scan_iter(match=row_key(VIEW, generation, "*"), count=1000))
        rows = [decode_row(v) for v in client.mget(keys)] if keys else []
        meta = ViewMeta.from_fields(client.hgetall(meta_key(VIEW)))
    finally:
        client.close()
    path = delta_table_path(settings.delta_location, VIEW, generation)
    table = live_rows(DeltaTable(path)).to_pandas()
    in_redis = sum(r["order_count"] for r in rows)
    in_delta = int(table["order_count"].sum())
    problems = []
    if in_redis != placed:
        problems.append(f"Redis counts {in_redis:,} orders, {placed:,} are current")
    if in_delta != placed:
        problems.append(f"Delta counts {in_delta:,} orders, {placed:,} are current")
    if len(table) != len(rows):
        problems.append(f"Delta has {len(table)} customers, Redis {len(rows)}")
    if meta.version != last_batch:
        problems.append(f"Redis holds version {meta.version}, the last batch was {last_batch}")
    if problems:
        raise BenchError(f"{VIEW} is wrong after the throughput run: {'; '.join(problems)}")


def measure_throughput(ctx: BenchContext) -> tuple[dict[str, Any], list[Plot]]:
    from engine.graph import graph_checkpoint, graph_generation, start_graph_query
    from engine.runner import prepare
    from engine.topics import ensure_topics

    sizes = ctx.sizes
    settings = ctx.isolated("throughput", max_offsets_per_trigger=sizes.engine_batch)
    catalog = catalog_on_topics(demo.CATALOG, "bench-throughput")
    topic = catalog.source_of(catalog.view(VIEW)).topic
    ensure_topics(settings.kafka_bootstrap, catalog)
    ctx.say(f"preloading {sizes.engine_events:,} order events into {topic}")
    started = time.monotonic()
    workers = _preload(ctx, settings, topic)
    try:
        spark = ctx.spark()
        generations, schemas = prepare(spark, settings, catalog)  # while the preload runs
        loaded = [w.result(timeout_s=sizes.engine_events / 1_000 + 300) for w in workers]
    finally:
        for worker in workers:
            worker.stop()
    events = sum(r["events"] for r in loaded)
    placed = sum(r["current"] for r in loaded)
    ctx.say(
        f"preloaded {events:,} events ({placed:,} current orders not cancelled) in "
        f"{time.monotonic() - started:.0f} s"
    )
    timeout_s = events / 1_000 + 300

    ctx.say(f"no-op sink: reading {topic} in batches of {sizes.engine_batch:,}")
    noop_progress = _run_to_end(_start_noop(spark, settings, catalog), timeout_s)
    noop = throughput(noop_progress)

    ctx.say(f"the graph query into {VIEW}: the same, through the engine's query and commits")
    generation = generations[VIEW]
    with commit_timings() as timings:
        query = start_graph_query(spark, settings, catalog, generations, schemas,
                                     available_now=True)
        real_progress = with_first_start(_run_to_end(query, timeout_s), graph_checkpoint(
            settings, graph_generation(generations, catalog)))
    real = throughput(real_progress)
    for name, result in (("no-op", noop), (VIEW, real)):
        if result["input_events"] != events:
            raise BenchError(f"the {name} run read {result['input_events']:,} of {events:,} events")
    _verify(settings, generation, placed, real_progress[-1]["batchId"])

    figures = {
        "engine_events_per_s": round(real["events_per_s"]),
        "engine_noop_events_per_s": round(noop["events_per_s"]),
        "engine_events_ratio": round(real["events_per_s"] / noop["events_per_s"], 3),
        "engine_events": events,
        "engine_batch_events": sizes.engine_batch,
        "engine_batches": real["batches"],
        "engine_profile_ms": {
            **{name: profile(real_progress, commits)
               for name, commits in timings.by_view.items()},
            "noop": profile(noop_progress, {}),
        },
    }
    plot = Plot(
        "engine_throughput.png",
        f"Events/s per batch of {sizes.engine_batch:,} (the first is warm-up)",
        {f"{VIEW} (engine)": real["batch_events_per_s"], "no-op sink": noop["batch_events_per_s"]},
        kind="series",
        xlabel="batch",
        ylabel="events/s",
    )
    return figures, [plot]


# --- Freshness ----------------------------------------------------------------------------

Delivery = tuple[str, int, int, int, bool]  # topic, partition, offset, produced ms, placed


def visibility_ms(
    deliveries: Sequence[Delivery],
    seen: Sequence[tuple[int, float]],
    batch_offsets: Mapping[int, Mapping[str, Mapping[str, int]]],
) -> tuple[list[float], int]:
    """Per event: ms from its production until the first batch past its offset was seen
    in Redis (or a later version, when the watcher did not see that one by itself).
    Returns (latencies, how many events no seen batch covers)."""
    ends: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for batch in sorted(batch_offsets):
        for topic, partitions in batch_offsets[batch].items():
            for partition, end in partitions.items():
                offsets, batches = ends.setdefault((topic, int(partition)), ([], []))
                offsets.append(int(end))
                batches.append(batch)
    seen_sorted = sorted(seen)
    versions = [v for v, _ in seen_sorted]
    latencies: list[float] = []
    unresolved = 0
    for topic, partition, offset, produced_ms, _placed in deliveries:
        offsets, batches = ends.get((topic, partition), ([], []))
        i = bisect.bisect_right(offsets, offset)  # first batch whose end is past the offset
        j = bisect.bisect_left(versions, batches[i]) if i < len(batches) else len(versions)
        if j == len(versions):
            unresolved += 1
            continue
        latencies.append(seen_sorted[j][1] - produced_ms)
    return latencies, unresolved


def freshness_by_view(
    deliveries: Sequence[Delivery],
    view_topics: Mapping[str, str],
    seen: Mapping[str, Sequence[tuple[int, float]]],
    offsets: Mapping[str, Mapping[int, Mapping[str, Mapping[str, int]]]],
    warmup_s: float,
) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """Per view, the distribution of produced -> seen (ms) over the events after the
    warm-up, and the samples: (summaries, latencies). The views that count placed orders
    only count those."""
    counted_from = min(d[3] for d in deliveries) + warmup_s * 1000
    by_view: dict[str, dict[str, float]] = {}
    samples: dict[str, list[float]] = {}
    for view, topic in view_topics.items():
        mine = [
            d
            for d in deliveries
            if d[0] == topic and d[3] >= counted_from and (view not in _PLACED_ONLY or d[4])
        ]
        latencies, unresolved = visibility_ms(mine, seen[view], offsets[view])
        if latencies:
            samples[view] = latencies
            summary = distribution(latencies)
            by_view[view] = {
                **{k: round(v, 1) for k, v in summary.items()},
                "unresolved": unresolved,
            }
    return by_view, samples


def wait_started(queries: Sequence[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(q.lastProgress is None for q in queries):
        for query in queries:
            if not query.isActive:
                raise BenchError(f"query {query.name} stopped: {query.exception()}")
        if time.monotonic() > deadline:
            waiting = [q.name for q in queries if q.lastProgress is None]
            raise BenchError(f"queries {waiting} made no progress within {timeout_s:.0f} s")
        time.sleep(0.2)


def produced_then_caught_up(producer: Worker, bootstrap: str, redis_url: str,
                            topics: Mapping[str, str], timeout_s: float) -> list[Delivery]:
    """Wait for the producer to finish, then for every view to cover its topic's last
    offset, and only then take the producer's deliveries; raises if a view did not catch
    up within `timeout_s`. The deliveries (tens of thousands of tuples) come over in this
    process, where the engine runs: taken after the catch-up, they cannot load the engine
    while it still works on the events measured."""
    if not producer.done(timeout_s):
        raise BenchError(f"the producer did not finish within {timeout_s:.0f} s")
    behind = wait_caught_up(redis_url, topics, last_offsets(bootstrap, set(topics.values())),
                            timeout_s)
    if behind:
        raise BenchError(f"views {behind} did not catch up within {timeout_s:.0f} s "
                         "of the last event")
    deliveries: list[Delivery] = producer.result(timeout_s=60)
    if not deliveries:
        raise BenchError("the producer delivered no events")
    return deliveries


def last_offsets(bootstrap: str, topics: set[str]) -> dict[tuple[str, int], int]:
    """The offset of the last record in each partition of `topics` that has one, now."""
    from engine.rebuild import log_range

    return {(topic, partition): end - 1 for topic in topics
            for partition, (_, end) in log_range(bootstrap, topic).items() if end > 0}


def wait_caught_up(
    redis_url: str, topics: Mapping[str, str], last: Mapping[tuple[str, int], int],
    timeout_s: float
) -> list[str]:
    """Wait until each view's recorded offsets cover the `last` offset of each partition of
    its topic; returns the views that did not catch up in time."""

    from schema.storage import META_OFFSETS, meta_key

    client = connect_redis(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            behind = []
            for view, topic in topics.items():
                raw = client.hget(meta_key(view), META_OFFSETS)
                ends = json.loads(raw).get(topic, {}) if raw else {}
                if any(
                    int(ends.get(str(p), 0)) <= off for (t, p), off in last.items() if t == topic
                ):
                    behind.append(view)
            if not behind or time.monotonic() > deadline:
                return behind
            time.sleep(0.1)
    finally:
        client.close()


def measure_freshness(ctx: BenchContext) -> tuple[dict[str, Any], list[Plot]]:
    from engine.graph import GRAPH_TIMINGS
    from engine.runner import start_all
    from engine.views import query_views

    sizes = ctx.sizes
    settings = ctx.isolated("freshness")
    catalog = catalog_on_topics(demo.CATALOG, "bench-freshness")
    renamed = {demo.CATALOG.sources[n].topic: s.topic for n, s in catalog.sources.items()}
    view_topics = {name: catalog.source_of(v).topic for name, v in catalog.views.items()}
    spark = ctx.spark()
    ctx.say(f"starting the engine on the demo views ({', '.join(catalog.views)})")
    stop = new_event()
    workers: list[Worker] = []
    with commit_timings() as timings:
        queries = start_all(spark, settings, catalog)
        try:
            wait_started(queries, _STARTUP_TIMEOUT_S)
            watcher = Worker(
                "meta watcher",
                watch_meta,
                settings.redis_url,
                list(catalog.views),
                stop,
                _WATCH_INTERVAL_S,
            )
            workers.append(watcher)
            ctx.say(
                f"producing demo events at {sizes.freshness_rate:,.0f}/s for "
                f"{sizes.freshness_s:.0f} s (the first {sizes.freshness_warmup_s:.0f} s "
                "are warm-up)"
            )
            producer = Worker(
                "producer",
                produce_paced,
                settings.kafka_bootstrap,
                renamed,
                sizes.freshness_rate,
                sizes.freshness_s,
                7,
            )
            workers.append(producer)
            deliveries = produced_then_caught_up(producer, settings.kafka_bootstrap,
                                                 settings.redis_url, view_topics,
                                                 sizes.freshness_s + 120)
            stop.set()
            observed = watcher.result(timeout_s=60)
            # Each view's query's progress; the graph query's under each of its views and
            # under the name its own timings are logged with.
            live = {name: progress_dicts(q) for q in queries
                    for name in ([v for v, _ in query_views(q.name)] or [q.name])
                    + ([GRAPH_TIMINGS] if q.name.startswith("graph:") else [])}
            graph_views = [v for q in queries if q.name.startswith("graph:")
                           for v, _ in query_views(q.name)]
        finally:
            stop.set()
            for worker in workers:
                worker.stop()
            for query in queries:
                query.stop()
    seen = {view: observed[view]["seen"] for view in view_topics}
    offsets = {view: observed[view]["offsets"] for view in view_topics}
    by_view, samples = freshness_by_view(deliveries, view_topics, seen, offsets,
                                         sizes.freshness_warmup_s)
    if VIEW not in samples:
        raise BenchError(f"no {VIEW} event could be matched to a batch seen in Redis")
    triggers = {name: v.trigger for name, v in catalog.views.items()}
    produced_s = (max(d[3] for d in deliveries) - min(d[3] for d in deliveries)) / 1000
    figures = {
        "engine_freshness_p50_ms": by_view[VIEW]["p50"],
        "engine_freshness_p99_ms": by_view[VIEW]["p99"],
        "engine_freshness_samples": by_view[VIEW]["count"],
        "engine_freshness_rate_per_s": round(len(deliveries) / max(produced_s, 1e-3)),
        "engine_freshness_by_view": by_view,
        "engine_chained_freshness_p99_ms": by_view.get(CHAINED_VIEW, {}).get("p99"),
        # Per view, and per dead-letter query (by query name), all running at once.
        "engine_live_profile_ms": {
            name: {
                **profile(progress, timings.by_view.get(name, {})),
                "trigger": triggers.get(name),
            }
            for name, progress in live.items()
            if progress
        },
        "engine_live_tail_ms": live_tail(live.get(GRAPH_TIMINGS, []), graph_views,
                                         timings.by_view),
    }
    ordered = {VIEW: samples.pop(VIEW), **samples}
    plot = Plot(
        "engine_freshness.png",
        f"Event produced -> visible in Redis, demo views live at "
        f"{figures['engine_freshness_rate_per_s']:,} events/s",
        ordered,
        notes=[f"{_cores()} cores", "histogram: CustomerStats; right: every view"],
    )
    return figures, [plot]


def run(ctx: BenchContext) -> GroupResult:
    from viewgate.bench.restart import measure_restart

    figures, plots = measure_throughput(ctx)
    figures |= measure_restart(ctx)
    if not ctx.sizes.engine_freshness:
        return GroupResult(figures, plots)
    fresh_figures, fresh_plots = measure_freshness(ctx)
    return GroupResult({**figures, **fresh_figures}, plots + fresh_plots)


GROUP = Group(
    name="engine",
    description="events/s into CustomerStats vs a no-op sink; produced -> visible in Redis",
    figures=FIGURES,
    run=run,
)
