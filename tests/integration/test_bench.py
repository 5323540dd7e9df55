"""The benchmark groups, tiny, against the session's Kafka, Redis and
Spark: each must produce every figure (checked for being there and positive, never
against a time)."""

from __future__ import annotations

import pytest

from viewgate.bench import engine, gateway, results, storage, subscriptions
from viewgate.bench.group import BenchContext, Sizes
from viewgate.bench.report import save_plot

pytestmark = pytest.mark.integration

TINY = Sizes(
    engine_events=6_000,
    engine_batch=1_500,
    freshness_rate=150,
    freshness_s=3,
    freshness_warmup_s=0.5,
    gateway_customers=200,
    gateway_events=2_500,
    gateway_seconds=1,
    gateway_rounds=1,
    gateway_latency_s=1.5,
    gateway_warmup_s=0.3,
    engine_freshness=True,
    fanout=200,
    fanout_connections=20,
    storage_rows_small=500,
    storage_batches=5,
    engine_restarts=1,
)


def run_group(group, spark, settings, tmp_path, redis_db: int) -> dict:
    """Run a group tiny, write and read back its results.json, check that every figure
    it lists is a positive number and every plot a file; returns what was written."""
    ctx = BenchContext(
        settings, TINY, tmp_path / "work", next_redis_db=redis_db, spark_session=spark
    )
    outcome = group.run(ctx)
    path = tmp_path / "bench" / "results.json"
    merged = results.merge({}, results.run_meta("tiny"), {group.name: (outcome.figures, {})})
    results.write(path, merged)
    written = results.load(path)
    for figure in group.figures:
        value = written[figure.key]
        assert isinstance(value, int | float) and value > 0, (figure.key, value)
    assert written["groups"][group.name]["keys"]
    for plot in outcome.plots:
        assert save_plot(plot, tmp_path / "bench").stat().st_size > 0
    return written


def test_engine_group_reports_every_figure(spark, settings, tmp_path):
    # Redis databases 8 and up: no other test uses them.
    written = run_group(engine.GROUP, spark, settings, tmp_path, redis_db=8)
    assert written["engine_events"] == TINY.engine_events
    assert written["engine_freshness_samples"] >= 100
    # The graph's batch, step by step: its read, each view's computation, Redis, feeds, Delta.
    graph = written["engine_profile_ms"]["graph"]
    assert all(graph[step] > 0 for step in ("read_ms", "Order_compute_ms", "apply_ms",
                                            "feed_ms", "delta_ms", "batch_ms")), graph
    assert written["engine_live_profile_ms"]["graph"]["CustomerStats_compute_ms"] > 0
    # The tail: the slowest batches' steps, in the graph and in each view's Delta step.
    tail = written["engine_live_tail_ms"]
    mean = written["engine_live_profile_ms"]["graph"]["triggerExecution_ms"]
    assert tail["slowest"]["triggerExecution_ms"] >= mean
    assert tail["views"]["Order"]["delta_ms"] > 0
    assert "maintenance_wait_ms" in tail["views"]["Order"]
    assert set(written["engine_freshness_by_view"]) == {
        "Customer", "OrderRecord", "Order", "CustomerStats", "ProductSales"}
    assert written["engine_restart_to_commit_max_s"] >= written["engine_restart_to_commit_s"]


def test_gateway_group_reports_every_figure(spark, settings, tmp_path):
    # Redis databases 12 and up: no other test uses them.
    written = run_group(gateway.GROUP, spark, settings, tmp_path, redis_db=12)
    assert set(written["query_point_rounds"]) == {"baseline", "gateway", "stock"}
    assert written["query_point_latency_ms"]["count"] == 1_500  # 1.5 s at 1,000/s
    assert written["query_data"]["customer_rows"] >= 200
    assert written["query_data"]["list_pages"] >= 1
    assert written["rebuild_rows"] == written["query_data"]["order_rows"]


def test_subscriptions_group_reports_every_figure(spark, settings, tmp_path):
    # Redis database 14: no other test uses it.
    written = run_group(subscriptions.GROUP, spark, settings, tmp_path, redis_db=14)
    assert written["freshness_samples"] >= 100
    assert written["subscriptions_open"] == TINY.fanout
    assert written["fanout_subscriptions"] == TINY.fanout
    assert set(written["freshness_by_view"]) == {"Customer", "OrderRecord", "Order",
                                                 "CustomerStats", "ProductSales"}


def test_storage_group_reports_every_figure(settings, tmp_path):
    written = run_group(storage.GROUP, None, settings, tmp_path, redis_db=15)
    assert written["delta_rows_large_table"] >= 100 * TINY.storage_rows_small
    # Maintenance leaves fewer bytes per row than the MERGEs had left.
    assert written["delta_bytes_per_row"] < written["delta_bytes_per_row_before_maintenance"]


def test_the_soak_runs_end_to_end_tiny(spark, settings, tmp_path):
    """`viewgate bench --soak` in a tiny configuration: the stack, the probe, live
    subscriptions, load at half the probe's rate, memory samples, soak.json and its plot."""
    from rich.console import Console

    from viewgate.bench.soak import SoakSizes, measure, write_report
    from viewgate.stack.process import free_port
    from viewgate.stack.redis_server import RedisServer

    # A Redis of its own: the soak takes a database like the groups, and the session's
    # databases are all taken by other tests.
    redis = RedisServer(tmp_path / "redis", free_port()).start()
    try:
        ctx = BenchContext(settings.model_copy(update={"redis_url": redis.url}), TINY,
                           tmp_path / "work", spark_session=spark)
        sizes = SoakSizes(minutes=0.25, probe_s=1, probe_warmup_s=0.3, subscriptions=40,
                          connections=4, demo_rate=20, sample_s=1, storage_sample_s=1,
                          history="30 seconds")
        report = write_report(measure(ctx, sizes), tmp_path / "bench", Console())
    finally:
        redis.stop()
    written = results.load(tmp_path / "bench" / "soak.json")
    assert written["capacity_rps"] > 0
    assert abs(written["rate"] - max(1, written["capacity_rps"] / 2)) <= 1  # half
    assert written["answered"] == written["requests"] > 0
    assert written["subscriptions"] == 40
    assert written["subscription_current"] + written["subscriptions_not_found"] == 40
    assert set(written["errors"]) >= {"http_wrong_answers", "websocket_closes",
                                      "stale_versions", "engine_queries_stopped"}
    assert len(written["rss_kb"]["gateway"]) >= 10  # every second for 15 s
    assert written["memory_growth"]["gateway"]["window_s"] == 3.75
    assert written["latency_over_time"]
    # What the engine keeps, sampled with the memory: Delta and Redis grow with the rows.
    held = [sample for _, sample in written["engine_storage"]]
    assert len(held) >= 10 and held[-1]["delta_rows"] > 0 and held[-1]["delta_bytes"] > 0
    assert held[-1]["redis_used_bytes"] > 0 and held[-1]["checkpoint_bytes"] > 0
    assert set(written["engine_flatness"]) == {
        "delta_bytes_per_row", "delta_live_data_bytes_per_row", "checkpoint_bytes",
        "redis_bytes_per_row", "batch_ms"}
    # The latest version's data files hold every live row: a few bytes a row at least.
    assert held[-1]["delta_live_data_bytes_per_row"] > 1
    assert set(written["engine_per_changed_row"]) == {"rows_per_batch",
                                                      "batch_ms_per_1000_rows"}
    # The graph's steps, from the engine's histogram in the soak's process.
    assert {"read", "apply", "delta", "batch"} <= set(written["engine_graph_steps"])
    # Every view kept the run's history; the slowest batches are named with when they ran.
    assert written["history"] == "30 seconds"
    assert isinstance(written["engine_maintenance"], list)
    assert written["engine_slowest_batches"][0]["batch_ms"] > 0
    # The driver's memory by allocator, from the soak's own process (the engine's driver).
    memory = written["engine_driver_memory"]
    assert len(memory) >= 10 and memory[-1][1]["python_blocks"] > 0
    assert written["engine_driver_memory_change"]["rss_kb"]["end"] > 0
    assert written["passed"] == (not report["problems"])
    assert (tmp_path / "bench" / "soak.png").stat().st_size > 0
