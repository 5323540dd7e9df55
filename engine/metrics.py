"""The engine's Prometheus metrics, per view, from Spark's query progress (engine.progress)
and the dead-letter writer; `viewgate engine` serves them at /metrics on
`engine_metrics_port`."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

VERSION = Gauge("viewgate_view_version", "The view's last committed batch id.", ["view"])
INPUT_RATE = Gauge("viewgate_view_input_rows_per_second",
                   "Source rows arriving per second, over the view's last batch.", ["view"])
PROCESSING_RATE = Gauge("viewgate_view_processed_rows_per_second",
                        "Source rows processed per second, over the view's last batch.",
                        ["view"])
BATCH_SECONDS = Histogram(
    "viewgate_view_batch_duration_seconds", "Trigger execution time of the view's batches.",
    ["view"], buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64))
KAFKA_LAG = Gauge("viewgate_view_kafka_lag_events",
                  "Source events in Kafka past the view's last batch.", ["view"])
WATERMARK = Gauge("viewgate_view_watermark_timestamp_seconds",
                  "The view's event-time watermark (Unix seconds); 0 without one.", ["view"])
FRESHNESS_LAG = Gauge(
    "viewgate_view_freshness_lag_seconds",
    "Seconds since the view's last batch began while source events wait for it; 0 when "
    "it has caught up.", ["view"])
LATE_EVENTS = Counter("viewgate_view_late_events",
                      "Events behind the view's watermark, dropped.", ["view"])
QUERY_FAILURES = Counter("viewgate_view_query_failures",
                         "Times the view's streaming query stopped with an error.", ["view"])
REJECTED_ROWS = Counter("viewgate_view_rejected_rows",
                        "View rows left out because their key is null (dead-lettered).",
                        ["view"])
MAINTENANCE_SECONDS = Histogram(
    "viewgate_engine_maintenance_seconds",
    "Time a view's Delta maintenance or compaction took (beside the batches: "
    "engine.maintenance).", ["view"], buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60))
MAINTENANCE_WAIT_SECONDS = Histogram(
    "viewgate_engine_maintenance_wait_seconds",
    "Time a view's MERGE waited for the view's maintenance to end, when one was running.",
    ["view"], buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30))
GRAPH_STEP_SECONDS = Histogram(
    "viewgate_graph_step_seconds",
    "Time each step of the view graph's batches took: `read` (the batch's records), "
    "`<View>_compute` and its parts, `apply` (Redis), `feed` (the change feeds), `delta` "
    "(the MERGEs, overlapping the feeds), `batch` (the whole).", ["step"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8))
GRAPH_READS = Counter("viewgate_graph_batch_reads",
                      "View graph batches by how their records were read: `fetch` (by the "
                      "driver from Kafka, no Spark job), `spark` (a Spark job collected into "
                      "the driver) or `tasks` (folded by Spark's tasks).", ["path"])
VIEWS_BY_TASKS = Counter("viewgate_graph_views_by_tasks",
                         "Views the tasks of a batch were asked to compute, by who "
                         "computed them: `tasks` (upsert views: engine.task_upsert; views "
                         "over views: engine.task_tables) or `driver` (a task handed them "
                         "back: a row without a key, a record without a Kafka key, a text "
                         "not UTF-8, a row moved to another routing value).",
                         ["view", "by"])
DELTA_BY_TASKS = Counter("viewgate_graph_delta_commits_by_tasks",
                         "Delta commits of views whose files the batch's tasks wrote "
                         "(engine.task_delta), by who wrote the committed files: `tasks`, or "
                         "`driver` (the tasks' previous rows were not Delta's, or the batch "
                         "was replayed).", ["view", "by"])
ROWS_CHANGED = Counter("viewgate_graph_rows_changed",
                       "Rows the view graph's batches changed, each view's change events "
                       "counted: what a batch's cost should follow.", ["view"])
DEAD_LETTERS = Counter("viewgate_dead_letters",
                       "Malformed source records sent to the dead-letter topic.", ["source"])


def observe_graph_steps(timings: Mapping[str, float]) -> None:
    """One graph batch's step timings: the `<step>_ms` entries (the others are counts)."""
    for name, ms in timings.items():
        if name.endswith("_ms"):
            GRAPH_STEP_SECONDS.labels(name.removesuffix("_ms")).observe(ms / 1000)


def observe_graph_read(path: str) -> None:
    GRAPH_READS.labels(path).inc()


def observe_view_by_tasks(view: str, by_tasks: bool) -> None:
    VIEWS_BY_TASKS.labels(view, "tasks" if by_tasks else "driver").inc()


def observe_delta_by_tasks(view: str, by_tasks: bool) -> None:
    DELTA_BY_TASKS.labels(view, "tasks" if by_tasks else "driver").inc()


def observe_rows_changed(view: str, rows: int) -> None:
    ROWS_CHANGED.labels(view).inc(rows)


def rows_changed_total() -> int:
    """Rows the graph's batches changed so far, every view's together (a sampler in this
    process differences it, with graph_step_totals' batch count)."""
    return int(sum(sample.value for metric in ROWS_CHANGED.collect()
                   for sample in metric.samples if sample.name.endswith("_total")))


def graph_step_totals() -> dict[str, tuple[float, int]]:
    """Per step: seconds spent and batches observed so far (the histogram's sum and
    count), for a sampler in this process to difference."""
    return _histogram_totals(GRAPH_STEP_SECONDS, "step")


def maintenance_totals() -> dict[str, tuple[float, int]]:
    """Per view: seconds its Delta maintenance and compactions took so far, and how many
    ran (for a sampler in this process, as graph_step_totals)."""
    return _histogram_totals(MAINTENANCE_SECONDS, "view")


def _histogram_totals(histogram: Histogram, label: str) -> dict[str, tuple[float, int]]:
    totals: dict[str, list[float]] = {}
    for metric in histogram.collect():
        for sample in metric.samples:
            kind = sample.name.rsplit("_", 1)[-1]
            if kind in ("sum", "count"):
                entry = totals.setdefault(sample.labels[label], [0.0, 0])
                entry[0 if kind == "sum" else 1] = sample.value
    return {name: (total, int(count)) for name, (total, count) in totals.items()}


def _lag(sources: list[Any]) -> int:
    """Events between each source's end offset for the batch and the latest in Kafka."""
    total = 0
    for source in sources:
        # Either may be JSON null (a replayed batch after a restart has no latest).
        latest, done = _offsets(source.latestOffset), _offsets(source.endOffset)
        for topic, partitions in latest.items():
            for partition, offset in partitions.items():
                total += max(0, int(offset) - int(done.get(topic, {}).get(partition, 0)))
    return total


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    """A source's offsets as a progress gives them: JSON text (PySpark's objects), already
    parsed (the progress's JSON), or null."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def records_read(progress: Mapping[str, Any]) -> int:
    """The Kafka records a batch covered (`progress`: a StreamingQueryProgress or its JSON):
    Spark's numInputRows; or, for a batch whose records the graph's driver fetched itself
    (engine.driver_fetch: Spark then ran no read and counted none), its sources' end offsets
    less their start offsets (an upper bound on a compacted topic)."""
    if progress["numInputRows"]:
        return int(progress["numInputRows"])
    # Unlike engine.batch_offsets.records_between, a partition without a start (new in
    # the batch) counts none but leaves the others counted: this is a rate, not a bound.
    total = 0
    for source in progress.get("sources") or ():
        start, end = _offsets(source["startOffset"]), _offsets(source["endOffset"])
        for topic, partitions in end.items():
            for partition, offset in partitions.items():
                total += max(0, int(offset) - int(start.get(topic, {}).get(partition, offset)))
    return total


@dataclass(frozen=True)
class BatchRates:
    """A batch's records and rates, as Spark's progress gives them, or made from its
    offsets when Spark counted none (records_read)."""

    records: int
    input_per_s: float  # over the time since the previous batch began
    processed_per_s: float  # over the batch's own time

    @classmethod
    def of(cls, progress: Any, since_previous_s: float | None) -> BatchRates:
        if progress.numInputRows:
            return cls(progress.numInputRows, progress.inputRowsPerSecond or 0.0,
                       progress.processedRowsPerSecond or 0.0)
        records = records_read(progress)
        seconds = (progress.durationMs or {}).get("triggerExecution", 0) / 1000
        return cls(records, records / since_previous_s if since_previous_s else 0.0,
                   records / seconds if seconds else 0.0)


def epoch_seconds(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def observe_progress(view: str, progress: Any, rates: BatchRates) -> None:
    VERSION.labels(view).set(progress.batchId)
    INPUT_RATE.labels(view).set(rates.input_per_s)
    PROCESSING_RATE.labels(view).set(rates.processed_per_s)
    if rates.records:
        BATCH_SECONDS.labels(view).observe((progress.batchDuration or 0) / 1000)
    lag = _lag(progress.sources)
    KAFKA_LAG.labels(view).set(lag)
    watermark = (progress.eventTime or {}).get("watermark")
    if watermark:  # a query of its own; the graph's stream aggregates: observe_stream
        WATERMARK.labels(view).set(epoch_seconds(watermark))
    started = epoch_seconds(progress.timestamp)
    FRESHNESS_LAG.labels(view).set(max(0.0, time.time() - started) if lag else 0.0)
    late = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
    if late:
        LATE_EVENTS.labels(view).inc(late)


def observe_stream(view: str, late: int, watermark: str | None) -> None:
    """A stream aggregate of the view graph after a batch (engine.stream_aggregates)."""
    if late:
        LATE_EVENTS.labels(view).inc(late)
    if watermark:
        WATERMARK.labels(view).set(epoch_seconds(watermark))


def observe_failure(view: str) -> None:
    QUERY_FAILURES.labels(view).inc()


def observe_dead_letters(source: str, count: int) -> None:
    DEAD_LETTERS.labels(source).inc(count)


def observe_rejected(view: str, count: int) -> None:
    REJECTED_ROWS.labels(view).inc(count)
