"""The engine benchmark group, tiny, against the session's Kafka, Redis and Spark: it must
produce every figure (checked for being there and positive, never against a time)."""

from __future__ import annotations

import pytest

from viewgate.bench import engine, results
from viewgate.bench.report import save_plot
from viewgate.bench.runner import BenchContext, Sizes

pytestmark = pytest.mark.integration

TINY = Sizes(
    engine_events=6_000,
    engine_batch=1_500,
    freshness_rate=150,
    freshness_s=3,
    freshness_warmup_s=0.5,
)


def test_engine_group_reports_every_figure(spark, settings, tmp_path):
    # Redis databases 8 and up: no other test uses them.
    ctx = BenchContext(settings, TINY, tmp_path / "work", next_redis_db=8, spark_session=spark)
    outcome = engine.run(ctx)

    path = tmp_path / "bench" / "results.json"
    merged = results.merge({}, results.run_meta("tiny"), {"engine": (outcome.figures, {})})
    results.write(path, merged)
    written = results.load(path)
    for figure in engine.FIGURES:
        value = written[figure.key]
        assert isinstance(value, int | float) and value > 0, (figure.key, value)
    assert written["engine_events"] == TINY.engine_events
    assert written["engine_freshness_samples"] >= 100
    assert written["engine_profile_ms"]["CustomerStats"]["delta_ms"] > 0
    assert set(written["engine_freshness_by_view"]) == {
        "Customer",
        "Order",
        "CustomerStats",
        "ProductSales",
    }
    assert written["groups"]["engine"]["keys"]
    for plot in outcome.plots:
        assert save_plot(plot, tmp_path / "bench").stat().st_size > 0
