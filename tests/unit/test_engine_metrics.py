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


def _progress(rows: int, start: object, end: object, ms: int = 500) -> dict:
    return {"numInputRows": rows, "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 0.0,
            "durationMs": {"triggerExecution": ms},
            "sources": [{"startOffset": start, "endOffset": end}]}


def test_a_batch_the_driver_fetched_counts_its_records_from_its_offsets():
    from engine.metrics import records_read

    # Spark counted the batch's rows: its figure stands.
    assert records_read(_progress(7, '{"orders": {"0": 0}}', '{"orders": {"0": 90}}')) == 7
    # Spark ran no read (engine.driver_fetch): the offsets say, as text or parsed JSON; a
    # partition new in the batch (no start) is not guessed.
    fetched = _progress(0, '{"orders": {"0": 100, "1": 40}}',
                        '{"orders": {"0": 130, "1": 45, "2": 9}}')
    assert records_read(fetched) == 35
    assert records_read(_progress(0, {"orders": {"0": 100}}, {"orders": {"0": 130}})) == 30
    assert records_read(_progress(0, None, '{"orders": {"0": 5}}')) == 0


def test_the_rates_of_a_fetched_batch_are_made_from_its_offsets():
    from engine.metrics import BatchRates

    class Progress(dict):  # PySpark's progress: a dict with properties
        numInputRows = property(lambda self: self["numInputRows"])
        inputRowsPerSecond = property(lambda self: self["inputRowsPerSecond"])
        processedRowsPerSecond = property(lambda self: self["processedRowsPerSecond"])
        durationMs = property(lambda self: self["durationMs"])

    fetched = Progress(_progress(0, '{"orders": {"0": 0}}', '{"orders": {"0": 300}}', ms=250))
    rates = BatchRates.of(fetched, since_previous_s=0.6)
    assert (rates.records, rates.input_per_s, rates.processed_per_s) == (300, 500.0, 1200.0)
    assert BatchRates.of(fetched, since_previous_s=None).input_per_s == 0.0
    counted = Progress({**_progress(300, "{}", "{}"), "inputRowsPerSecond": 480.0,
                        "processedRowsPerSecond": 1100.0})
    assert BatchRates.of(counted, since_previous_s=0.6) == BatchRates(300, 480.0, 1100.0)
