"""viewgate status: lag arithmetic and the table, without services."""

from __future__ import annotations

from rich.console import Console

from schema.storage import ViewMeta
from viewgate.status import ViewStatus, render


def _row(**changes) -> ViewStatus:
    row = ViewStatus(view="Order", generation=1, version=41, committed_at_ms=1_000_000,
                     watermark="2026-11-23T00:00:00", lag=0, input_rate=120.0,
                     processing_rate=950.0, batch_ms=420, late_events=3, dead_letters=2,
                     last_error="")
    for name, value in changes.items():
        setattr(row, name, value)
    return row


def _text(table) -> str:
    console = Console(record=True, width=250)
    console.print(table)
    return console.export_text()


def test_lag_counts_events_past_the_last_batch_in_every_partition():
    meta = ViewMeta(offsets={"orders": {"0": 90, "1": 40}})
    assert meta.behind("orders", {"0": 100, "1": 40, "2": 5}) == 10 + 0 + 5
    assert ViewMeta().behind("orders", {"0": 7}) == 7  # nothing committed yet
    assert meta.behind("orders", {"0": 80}) == 0  # a truncated topic is not negative lag


def test_table_shows_each_view_its_figures_and_last_error():
    text = _text(render([
        _row(),
        _row(view="CustomerStats", version=-1, committed_at_ms=0, lag=None, batch_ms=0,
             last_error="SparkException: the sink failed"),
    ], now_ms=1_004_500))
    order = next(line for line in text.splitlines() if "Order" in line)
    assert "41" in order and "4.5 s ago" in order and "420 ms" in order and "950" in order
    stats = next(line for line in text.splitlines() if "CustomerStats" in line)
    assert "never" in stats and "?" in stats and "the sink failed" in stats


def test_table_says_when_kafka_did_not_answer():
    text = _text(render([_row(lag=None)], now_ms=1_000_000))
    assert "Kafka did not answer" in text
