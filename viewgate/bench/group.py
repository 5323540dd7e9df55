"""What a benchmark group is, gets and returns: `Group` (its name, its figures and its
`run`), `BenchContext` (settings pointing at the run's services, the `Sizes`, a work
folder, a way to talk, a SparkSession on first use), `GroupResult` (figures and plots) and
`BenchError`. The groups (engine.py, gateway.py, subscriptions.py) and the runner import
them from here, so the runner may import every group and no group imports the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from viewgate.bench.report import Figure, Plot

Say = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does; runner.MODES has the modes, overridable per
    option."""

    engine_events: int  # order events preloaded for the throughput runs
    engine_batch: int  # maxOffsetsPerTrigger of the throughput runs
    freshness_rate: float  # demo events per second while freshness is measured
    freshness_s: float  # how long the producer writes at that rate
    freshness_warmup_s: float  # events produced in the first seconds are not counted
    gateway_customers: int  # demo customers the engine writes for the gateway's reads
    gateway_events: int  # demo events after them (orders mostly), through the engine
    gateway_seconds: float  # each saturation run, after gateway_warmup_s
    gateway_rounds: int  # interleaved saturation rounds (baseline, gateway, stock)
    gateway_latency_s: float  # each fixed-rate run, after gateway_warmup_s
    gateway_warmup_s: float  # load before each run's measured window
    engine_freshness: bool  # also measure produced -> visible in Redis (engine group)
    fanout: int  # live subscriptions one change is fanned out to
    fanout_connections: int  # websockets holding them
    storage_rows_small: int  # rows of the storage group's small table (the large: 100x)
    storage_batches: int  # demo-shaped batches the storage group times on each table
    engine_restarts: int = 3  # SIGKILLs and restarts of the engine the engine group times
    browser_tabs: int = 10_000  # the browsers group's tabs (a websocket, 3 subscriptions)
    browser_churn_s: float = 60.0  # how long tabs come and go in the browsers group
    browser_workers: int = 1  # uvicorn workers of the browsers group's gateway


class BenchError(RuntimeError):
    """A measurement could not be taken or its run was wrong (then it is not reported)."""


@dataclass
class GroupResult:
    figures: dict[str, Any]
    plots: list[Plot] = field(default_factory=list)


@dataclass(frozen=True)
class Group:
    name: str
    description: str
    figures: tuple[Figure, ...]
    run: Callable[[BenchContext], GroupResult]
    # Run without --only (quick and full modes); the rest run only when named.
    by_default: bool = True


@dataclass
class BenchContext:
    """What a group gets: settings pointing at the run's services, the sizes, a work
    folder, a way to talk, and a SparkSession built on first use."""

    settings: Settings
    sizes: Sizes
    workdir: Path
    say: Say = print
    next_redis_db: int = 1  # isolated() hands out Redis databases from here on
    spark_session: Any = None  # built on first use of spark(), or given

    def spark(self):
        if self.spark_session is None:
            from engine.spark import build_spark

            self.say("starting Spark")
            self.spark_session = build_spark(self.settings, app_name="viewgate-bench")
        return self.spark_session

    def isolated(self, name: str, **updates: Any) -> Settings:
        """Settings with a data folder and an emptied Redis database of their own, so two
        measurements of the same view never see each other's rows or checkpoints."""

        db, self.next_redis_db = self.next_redis_db, self.next_redis_db + 1
        if db > 15:
            raise BenchError("more isolated measurements than Redis has databases (15)")
        url = f"{self.settings.redis_url.rsplit('/', 1)[0]}/{db}"
        client = connect_redis(url)
        try:
            client.flushdb()
        finally:
            client.close()
        return self.settings.model_copy(
            update={"data_dir": self.workdir / name, "redis_url": url, **updates}
        )

    def close(self) -> None:
        if self.spark_session is not None:
            self.spark_session.stop()
            self.spark_session = None
