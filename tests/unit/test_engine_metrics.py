"""The engine's progress metrics, without services."""

from __future__ import annotations

from types import SimpleNamespace

from engine.metrics import _lag


def _source(latest: str | None, end: str | None) -> SimpleNamespace:
    return SimpleNamespace(latestOffset=latest, endOffset=end)


def test_lag_counts_what_kafka_holds_past_each_batch():
    sources = [_source('{"orders": {"0": 100, "1": 40}}', '{"orders": {"0": 90, "1": 40}}')]
    assert _lag(sources) == 10


def test_a_batch_replayed_after_a_restart_has_no_latest_offset_and_no_lag():
    # Spark reports the replayed batch's latest offset as JSON null: the listener crashed
    # on it with a traceback in the engine's log at every restart.
    assert _lag([_source("null", '{"orders": {"0": 90}}'), _source(None, "null")]) == 0


def test_graph_step_timings_are_observed_and_totalled():
    from engine.metrics import graph_step_totals, observe_graph_steps

    before = graph_step_totals().get("test_step", (0.0, 0))
    observe_graph_steps({"test_step_ms": 250.0, "test_groups": 400})
    observe_graph_steps({"test_step_ms": 750.0})
    totals = graph_step_totals()
    spent, count = totals["test_step"]
    assert count == before[1] + 2 and abs(spent - before[0] - 1.0) < 1e-9
    assert "test_groups" not in totals  # a count, not a time


def test_rows_changed_are_totalled_over_views():
    from engine.metrics import observe_rows_changed, rows_changed_total

    before = rows_changed_total()
    observe_rows_changed("test_view_a", 120)
    observe_rows_changed("test_view_b", 30)
    observe_rows_changed("test_view_a", 0)
    assert rows_changed_total() - before == 150
