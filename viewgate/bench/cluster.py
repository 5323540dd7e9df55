"""The cluster group: who does the engine's work, and what a second Spark worker buys.

The engine group's throughput run (order events preloaded into a topic, the graph query
reading them from the earliest offset in batches of `engine_batch`, CustomerStats checked
exact in Redis and Delta afterwards) runs three times on the same events:
- on `local[2]` (Spark's executors are threads of the driver's JVM);
- on a Spark standalone master with two workers of one core each (viewgate.stack.
  spark_standalone), with `spark.cores.max` 1: one executor;
- the same with `spark.cores.max` 2: an executor on each worker;
- on `local[2]` and on the two workers again with the batch's read folded by Spark's
  tasks (the setting `engine_task_read`, engine.task_read, with no batch fetched from
  Kafka beside Spark): Python tasks, not the driver, keep each key's last record, fold
  ProductSales's events and compute OrderRecord's Redis writes and change events
  (engine.task_upsert);
- on both once more with the views over views computed by the same job too (the setting
  `engine_task_tables`, engine.task_tables): Order's join and CustomerStats' aggregate in
  a second stage partitioned by customer;
- on both once more with the tasks writing the Delta files of the views they compute too
  (the setting `engine_task_delta`, engine.task_delta): the driver only marks the rows
  they replace and commits. This is the cluster profile's path (viewgate.stack.local.
  CLUSTER_ENGINE_PATH), so it also runs on one worker (`spark.cores.max` 1).

Meanwhile the CPU of the engine's processes is sampled from /proc every half second: the
driver (this process: Python, and its JVM; and its read-ahead process, engine.read_ahead,
which fetches the batches' records from Kafka beside it) against the executors (the JVMs the workers
launched; on `local[2]` the JVM's task threads, "Executor task launch worker"; and the
Python workers of either, which run the tasks' Python). The driver's share is the driver's
CPU over all of it, over the graph query's run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from schema import demo
from viewgate.bench.engine import (
    VIEW,
    _preload,
    _run_to_end,
    _verify,
    catalog_on_topics,
    throughput,
    with_first_start,
)
from viewgate.bench.group import BenchContext, BenchError, Group, GroupResult
from viewgate.bench.load import cpu_seconds
from viewgate.bench.report import Figure

FIGURES = (
    Figure("engine_events_per_s_local", "events/s into CustomerStats, local[2]", "events/s"),
    Figure("engine_events_per_s_1_worker", "the same, Spark standalone, one worker", "events/s"),
    Figure("engine_events_per_s_2_workers", "the same, two workers", "events/s"),
    Figure("engine_driver_cpu_share_local", "driver CPU / all engine CPU, local[2]", "share"),
    Figure("engine_driver_cpu_share_cluster", "the same, two workers", "share"),
    Figure("engine_executor_cores_cluster", "executor CPU, two workers", "cores"),
    Figure("engine_events_per_s_local_task_read", "events/s, local[2], read folded in tasks",
           "events/s"),
    Figure("engine_events_per_s_2_workers_task_read", "the same, two workers", "events/s"),
    Figure("engine_driver_cpu_share_local_task_read", "driver CPU share, local[2], read in "
           "tasks", "share"),
    Figure("engine_driver_cpu_share_cluster_task_read", "the same, two workers", "share"),
    Figure("engine_events_per_s_local_task_tables", "events/s, local[2], views over views "
           "in tasks too", "events/s"),
    Figure("engine_events_per_s_2_workers_task_tables", "the same, two workers", "events/s"),
    Figure("engine_driver_cpu_share_local_task_tables", "driver CPU share, local[2], views "
           "over views in tasks too", "share"),
    Figure("engine_driver_cpu_share_cluster_task_tables", "the same, two workers", "share"),
    Figure("engine_events_per_s_local_task_delta", "events/s, local[2], Delta files written "
           "by the tasks too", "events/s"),
    Figure("engine_events_per_s_1_worker_task_delta", "the same, one worker", "events/s"),
    Figure("engine_events_per_s_2_workers_task_delta", "the same, two workers", "events/s"),
    Figure("engine_driver_cpu_share_local_task_delta", "driver CPU share, local[2], Delta "
           "files written by the tasks too", "share"),
    Figure("engine_driver_cpu_share_cluster_task_delta", "the same, two workers", "share"),
)

_SAMPLE_S = 0.5
_TASK_THREAD = "Executor task"  # a JVM thread's name is cut to 15 characters in /proc


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _descendants(pid: int) -> list[int]:
    out, todo = [], _children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        try:
            todo += _children(child)
        except OSError:
            continue  # ended while we looked
    return out


def _python_workers(jvm: int) -> list[int]:
    """The PySpark daemon a JVM started and the workers it forked (they keep its command
    line): where tasks run Python (mapInArrow)."""
    return [p for p in _descendants(jvm) if b"pyspark" in _cmdline(p)]


def _thread_cpu(pid: int, wanted: Callable[[str], bool]) -> dict[int, float]:
    """CPU seconds of each of `pid`'s threads whose name `wanted` takes."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if not wanted((task / "comm").read_text().strip()):
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


class CpuSampler:
    """The driver's and the executors' CPU seconds, sampled until stopped. Processes and
    threads come and go (an executor killed, a task thread retired), so each one's latest
    reading is kept, and the totals are the sums of the increases over the run."""

    def __init__(self, worker_pids: list[int]) -> None:
        self.worker_pids = worker_pids
        self.jvm = next(p for p in _children(os.getpid()) if b"java" in _cmdline(p))
        self.first: dict[tuple[str, int], float] = {}
        self.last: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _readings(self) -> dict[tuple[str, int], float]:
        from engine.graph import read_ahead_pids

        out = {("driver", os.getpid()): cpu_seconds(os.getpid())}
        out[("driver", self.jvm)] = cpu_seconds(self.jvm)
        for pid in read_ahead_pids():  # the next batch's read, beside the driver
            out[("driver", pid)] = cpu_seconds(pid)
        executors = []
        if self.worker_pids:
            for worker in self.worker_pids:
                for pid in _children(worker):
                    if b"CoarseGrainedExecutorBackend" in _cmdline(pid):
                        executors.append(pid)
                        out[("executor", pid)] = cpu_seconds(pid)
        else:  # local: the executors are the driver JVM's task threads
            executors.append(self.jvm)
            for tid, seconds in _thread_cpu(self.jvm, lambda n: n.startswith(_TASK_THREAD)).items():
                out[("executor", -tid)] = seconds
        for jvm in executors:
            for pid in _python_workers(jvm):
                out[("python", pid)] = cpu_seconds(pid)
        return out

    def _sample(self) -> None:
        try:
            readings = self._readings()
        except (OSError, StopIteration):
            return  # a process ended between listing and reading it: the next sample counts
        for key, seconds in readings.items():
            self.first.setdefault(key, seconds)
            self.last[key] = seconds

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            self._sample()

    @contextmanager
    def running(self) -> Iterator[CpuSampler]:
        self._sample()
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            self._sample()

    def _role(self, role: str) -> float:
        return sum(self.last[k] - self.first[k] for k in self.last if k[0] == role)

    def seconds(self, role: str) -> float:
        """The driver's or the executors' CPU seconds. On local[2] the task threads' CPU
        counts as the executors', not twice (the JVM's total holds them); the Python
        workers' counts as the executors' everywhere."""
        if role == "driver":
            local_tasks = 0.0 if self.worker_pids else self._role("executor")
            return self._role("driver") - local_tasks
        return self._role("executor") + self._role("python")

    def driver_share(self) -> float:
        driver = self.seconds("driver")
        return driver / (driver + self.seconds("executor"))


def _graph_run(ctx: BenchContext, spark: Any, name: str, catalog: Any, events: int,
               placed: int, worker_pids: list[int], **updates: Any) -> dict[str, Any]:
    from engine.graph import graph_checkpoint, graph_generation, start_graph_query
    from engine.runner import prepare

    settings = ctx.isolated(name, max_offsets_per_trigger=ctx.sizes.engine_batch, **updates)
    generations, schemas = prepare(spark, settings, catalog)
    sampler = CpuSampler(worker_pids)
    started = time.monotonic()
    with sampler.running():
        query = start_graph_query(spark, settings, catalog, generations, schemas,
                                  available_now=True)
        progress = with_first_start(_run_to_end(query, events / 1_000 + 300), graph_checkpoint(
            settings, graph_generation(generations, catalog)))
    seconds = time.monotonic() - started
    result = throughput(progress)
    if result["input_events"] != events:
        raise BenchError(f"{name}: read {result['input_events']:,} of {events:,} events")
    _verify(settings, generations[VIEW], placed, progress[-1]["batchId"])
    ctx.say(f"{name}: {result['events_per_s']:,.0f} events/s, driver "
            f"{sampler.seconds('driver'):.1f} s CPU, executors "
            f"{sampler.seconds('executor'):.1f} s over {seconds:.0f} s")
    return {"events_per_s": round(result["events_per_s"]),
            "driver_share": round(sampler.driver_share(), 3),
            "executor_cores": round(sampler.seconds("executor") / seconds, 2),
            # The run's profile: where its CPU went and its batches' phases (Spark's ms).
            "driver_cpu_s": round(sampler.seconds("driver"), 1),
            "executor_cpu_s": round(sampler.seconds("executor"), 1),
            "seconds": round(seconds, 1), "batches": result["batches"],
            "phase_ms": {k: round(v, 1) for k, v in result["phase_ms"].items()}}


def _stop_session(ctx: BenchContext) -> None:
    if ctx.spark_session is not None:
        ctx.spark_session.stop()
        ctx.spark_session = None


def _session(ctx: BenchContext, master: str, conf: dict[str, str]) -> Any:
    """A SparkSession on `master`; the one before it (another master) is stopped first."""
    from engine.spark import build_spark

    _stop_session(ctx)
    settings = ctx.settings.model_copy(update={"spark_master": master,
                                               "spark_conf": {**ctx.settings.spark_conf,
                                                              **conf}})
    ctx.spark_session = build_spark(settings, app_name=f"viewgate-bench-{master[:5]}")
    return ctx.spark_session


def run(ctx: BenchContext) -> GroupResult:
    from engine.topics import ensure_topics
    from viewgate.stack.spark_standalone import SparkStandalone

    catalog = catalog_on_topics(demo.CATALOG, "bench-cluster")
    topic = catalog.source_of(catalog.view(VIEW)).topic
    ensure_topics(ctx.settings.kafka_bootstrap, catalog)
    ctx.say(f"preloading {ctx.sizes.engine_events:,} order events into {topic}")
    workers = _preload(ctx, ctx.settings, topic)
    try:
        loaded = [w.result(timeout_s=ctx.sizes.engine_events / 1_000 + 300) for w in workers]
    finally:
        for worker in workers:
            worker.stop()
    events = sum(r["events"] for r in loaded)
    placed = sum(r["current"] for r in loaded)

    local = _graph_run(ctx, _session(ctx, "local[2]", {}), "local", catalog, events, placed, [])
    # The task read folds batches Spark reads: none is fetched from Kafka in these runs.
    task_read = {"engine_task_read": True, "engine_driver_fetch_max_records": 0}
    local_tasks = _graph_run(ctx, ctx.spark_session, "local-task-read", catalog, events, placed,
                             [], **task_read)
    task_tables = {**task_read, "engine_task_tables": True}
    local_tables = _graph_run(ctx, ctx.spark_session, "local-task-tables", catalog, events,
                              placed, [], **task_tables)
    task_delta = {**task_tables, "engine_task_delta": True}
    local_delta = _graph_run(ctx, ctx.spark_session, "local-task-delta", catalog, events,
                             placed, [], **task_delta)
    standalone = SparkStandalone(ctx.workdir / "spark", workers=2, cores_per_worker=1,
                                 memory_per_worker="1g")
    standalone.start()
    try:
        worker_pids = [p.pid for p in standalone.processes[1:]]
        runs, runs_one_delta = {}, {}
        for cores in (1, 2):
            spark = _session(ctx, standalone.master_url, {
                "spark.cores.max": str(cores), "spark.executor.cores": "1",
                "spark.executor.memory": "768m"})
            runs[cores] = _graph_run(ctx, spark, f"standalone-{cores}", catalog, events,
                                     placed, worker_pids)
            if cores == 1:
                runs_one_delta = _graph_run(ctx, spark, "standalone-1-task-delta", catalog,
                                            events, placed, worker_pids, **task_delta)
        runs_tasks = _graph_run(ctx, spark, "standalone-2-task-read", catalog, events, placed,
                                worker_pids, **task_read)
        runs_tables = _graph_run(ctx, spark, "standalone-2-task-tables", catalog, events,
                                 placed, worker_pids, **task_tables)
        runs_delta = _graph_run(ctx, spark, "standalone-2-task-delta", catalog, events,
                                placed, worker_pids, **task_delta)
    finally:
        _stop_session(ctx)  # before its workers go
        standalone.stop()
    return GroupResult({
        "engine_events_per_s_local": local["events_per_s"],
        "engine_events_per_s_1_worker": runs[1]["events_per_s"],
        "engine_events_per_s_2_workers": runs[2]["events_per_s"],
        "engine_driver_cpu_share_local": local["driver_share"],
        "engine_driver_cpu_share_cluster": runs[2]["driver_share"],
        "engine_executor_cores_cluster": runs[2]["executor_cores"],
        "engine_events_per_s_local_task_read": local_tasks["events_per_s"],
        "engine_events_per_s_2_workers_task_read": runs_tasks["events_per_s"],
        "engine_driver_cpu_share_local_task_read": local_tasks["driver_share"],
        "engine_driver_cpu_share_cluster_task_read": runs_tasks["driver_share"],
        "engine_events_per_s_local_task_tables": local_tables["events_per_s"],
        "engine_events_per_s_2_workers_task_tables": runs_tables["events_per_s"],
        "engine_driver_cpu_share_local_task_tables": local_tables["driver_share"],
        "engine_driver_cpu_share_cluster_task_tables": runs_tables["driver_share"],
        "engine_events_per_s_local_task_delta": local_delta["events_per_s"],
        "engine_events_per_s_1_worker_task_delta": runs_one_delta["events_per_s"],
        "engine_events_per_s_2_workers_task_delta": runs_delta["events_per_s"],
        "engine_driver_cpu_share_local_task_delta": local_delta["driver_share"],
        "engine_driver_cpu_share_cluster_task_delta": runs_delta["driver_share"],
        "engine_cluster_events": events,
        "engine_cluster_profile": {"local": local, "1_worker": runs[1], "2_workers": runs[2],
                                   "local_task_read": local_tasks,
                                   "2_workers_task_read": runs_tasks,
                                   "local_task_tables": local_tables,
                                   "2_workers_task_tables": runs_tables,
                                   "local_task_delta": local_delta,
                                   "1_worker_task_delta": runs_one_delta,
                                   "2_workers_task_delta": runs_delta},
    })


GROUP = Group(
    name="cluster",
    description="the engine on local[2] and on a Spark standalone cluster of one and two "
                "workers: events/s and the driver's share of the CPU",
    figures=FIGURES,
    run=run,
    by_default=False,
)
