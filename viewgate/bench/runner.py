"""Run benchmark groups against services started for the run, and record their figures.

A group is one module with a `GROUP` (see engine.py): its name, the figures it reports
(with goals, for the table) and a `run(ctx)` that measures and returns a GroupResult.
The runner starts Kafka and Redis on free ports in a temporary folder, builds Spark only
if a group asks for it, stops everything it started at the end (also on an error, Ctrl-C
or SIGTERM), merges the figures into <out>/results.json, prints the table and saves the
plots.
"""

from __future__ import annotations

import contextlib
import datetime
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from schema.settings import Settings
from viewgate.bench import results
from viewgate.bench.group import (
    BenchContext,
    BenchError,
    Group,
    GroupResult,
    Say,
    Sizes,
)
from viewgate.bench.report import print_table, save_plot
from viewgate.stack.kafka import KafkaBroker
from viewgate.stack.process import free_port
from viewgate.stack.redis_server import RedisServer

# The sizes of each mode, overridable per option (sizes_for).
MODES: dict[str, Sizes] = {
    # A batch of 20,000 events is one second of input at the engine's goal rate, with the
    # views' one-second trigger: sustaining the goal means finishing such a batch in 1 s.
    "quick": Sizes(
        engine_events=80_000,
        engine_batch=20_000,
        freshness_rate=500,
        freshness_s=7,
        freshness_warmup_s=2,
        gateway_customers=2_000,
        gateway_events=8_000,
        gateway_seconds=1.5,
        gateway_rounds=2,
        gateway_latency_s=3,
        gateway_warmup_s=0.5,
        # Quick mode leaves it to the subscriptions group, which measures freshness end to
        # end with the engine's profile, to stay under 3 minutes.
        engine_freshness=False,
        fanout=10_000,
        fanout_connections=1_000,
        storage_rows_small=10_000,
        storage_batches=10,
        engine_restarts=1,
    ),
    "full": Sizes(
        # Every event passes OrderRecord, Order and CustomerStats in the driver: 400,000
        # take about as long as 1,200,000 did through CustomerStats alone.
        engine_events=400_000,
        engine_batch=20_000,
        freshness_rate=1000,
        freshness_s=60,
        freshness_warmup_s=5,
        gateway_customers=20_000,
        gateway_events=100_000,
        gateway_seconds=8,
        gateway_rounds=5,
        gateway_latency_s=30,
        gateway_warmup_s=2,
        engine_freshness=True,
        fanout=20_000,
        fanout_connections=2_000,
        storage_rows_small=20_000,
        storage_batches=30,
        engine_restarts=3,
    ),
}


# A full run of the slowest group takes well under this; past it, something hangs.
_GROUP_TIMEOUT_S = 40 * 60


def run_in_child(name: str, settings: Settings, sizes: Sizes, workdir: Path) -> GroupResult:
    """Run a group in this (worker) process: its SparkSession, Kafka clients and threads
    end with the process, before the runner stops the services they talk to."""
    ctx = BenchContext(settings, sizes, workdir, say=lambda text: print(text, flush=True))
    try:
        return all_groups()[name].run(ctx)
    finally:
        ctx.close()


def all_groups() -> dict[str, Group]:
    from viewgate.bench import browsers, cluster, engine, gateway, storage, subscriptions

    return {g.name: g for g in (engine.GROUP, gateway.GROUP, subscriptions.GROUP,
                                storage.GROUP, browsers.GROUP, cluster.GROUP)}


def select_groups(only: Sequence[str] | None) -> list[Group]:
    groups = all_groups()
    if not only:
        return [g for g in groups.values() if g.by_default]
    unknown = [name for name in only if name not in groups]
    if unknown:
        raise BenchError(
            f"unknown benchmark group(s) {', '.join(unknown)}; choose from {', '.join(groups)}"
        )
    return [groups[name] for name in dict.fromkeys(only)]


def sizes_for(mode: str, overrides: Mapping[str, Any] | None = None) -> Sizes:
    if mode not in MODES:
        raise BenchError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return replace(MODES[mode], **given)


@contextlib.contextmanager
def bench_stack(base: Settings, workdir: Path, say: Say) -> Iterator[Settings]:
    """Kafka and Redis on free ports under `workdir`, stopped on the way out."""
    kafka = KafkaBroker(workdir / "kafka", free_port(), base.jar_dir / "kafka")
    redis = RedisServer(workdir / "redis", free_port())
    with contextlib.ExitStack() as stack:
        say("starting Kafka and Redis")
        kafka.start(timeout_s=base.startup_timeout_s)
        stack.callback(kafka.stop)
        redis.start(timeout_s=base.startup_timeout_s)
        stack.callback(redis.stop)
        say(f"kafka {kafka.bootstrap} (pid {kafka.process.pid}), redis {redis.url}")
        yield base.model_copy(
            update={
                "kafka_bootstrap": kafka.bootstrap,
                "redis_url": redis.url,
                "data_dir": workdir / "data",
                "delta_root": None,
                "checkpoint_root": None,
            }
        )


class _Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so every finally block runs."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    def handler(signum: int, _frame: object) -> None:
        raise _Terminated(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_group(
    group: Group, settings: Settings, sizes: Sizes, workdir: Path, mode: str, out_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one group in a process of its own and save its plots:
    (its figures, its record for results.json)."""
    from viewgate.bench.workers import Worker

    load_before, started = results.load_average(), time.monotonic()
    worker = Worker(
        f"bench group {group.name}",
        run_in_child,
        group.name,
        settings,
        sizes,
        workdir / group.name,
        daemon=False,  # it starts load generators of its own
    )
    try:
        outcome: GroupResult = worker.result(timeout_s=_GROUP_TIMEOUT_S)
    finally:
        worker.stop()
    for plot in outcome.plots:
        save_plot(plot, out_dir)
    record = {
        "mode": mode,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": results.load_average(),
        "sizes": vars(sizes),
        "plots": [str(out_dir / p.filename) for p in outcome.plots],
    }
    return outcome.figures, record


def run_bench(
    base: Settings,
    *,
    only: Sequence[str] | None = None,
    mode: str = "quick",
    overrides: Mapping[str, Any] | None = None,
    out_dir: Path = Path("bench"),
    console: Any = None,
) -> dict[str, Any]:
    """Start the services, run the groups, merge into <out_dir>/results.json and print
    the table. Groups that finished are written even when a later one fails."""
    groups = select_groups(only)
    sizes = sizes_for(mode, overrides)
    say: Say = console.print if console is not None else print
    meta = results.run_meta(mode)
    done: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    path = out_dir / "results.json"
    previous = results.load(path)  # fail on a broken file before measuring anything
    merged: dict[str, Any] = previous
    with _sigterm_raises(), tempfile.TemporaryDirectory(prefix="viewgate-bench-") as tmp:
        workdir = Path(tmp)
        try:
            with bench_stack(base, workdir, say) as settings:
                for group in groups:
                    say(f"{group.name} group: {group.description}")
                    done[group.name] = run_group(group, settings, sizes, workdir, mode, out_dir)
        finally:
            if done:
                merged = results.merge(previous, meta, done)
                results.write(path, merged)
                say(f"wrote {path}")
    print_table(console, merged, [g for g in groups if g.name in done])
    return merged
