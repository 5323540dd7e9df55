"""The engine's collector (engine.collector): a batch's rows and change events hold no
cycles, so they go by reference counting; ten large batches run no full collection, where
CPython's thresholds run several in two; and a change feed holds no cycle (nothing but a
full collection would free it)."""

from __future__ import annotations

import datetime
import gc
import weakref
from collections.abc import Iterator

import pyarrow as pa
import pytest

from engine.collector import GC_THRESHOLDS, keep_collector_out_of_batches
from engine.sinks.changefeed import ChangeFeed
from schema.arrow_rows import arrow_rows
from schema.storage import ChangeEvent, change_op

CPYTHON_THRESHOLDS = (700, 10, 10)
BATCH_EVENTS = 20_000  # the bench's throughput batch
VIEWS = ("OrderRecord", "Order", "CustomerStats")


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as this process had it, afterwards; a known start before."""
    thresholds = gc.get_threshold()
    gc.collect()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def _batch() -> list[object]:
    """What a batch holds while it runs, for a few views: its records as Python rows
    (schema.arrow_rows, as the engine reads them), the rows before, and a change event
    for each, encoded as the commit sends them."""
    start = datetime.datetime(2026, 11, 29, tzinfo=datetime.UTC)
    records = pa.table({
        "order_id": [f"o-{i}" for i in range(BATCH_EVENTS)],
        "customer_id": [f"c-{i % 997}" for i in range(BATCH_EVENTS)],
        "amount": [i / 100 for i in range(BATCH_EVENTS)],
        "status": ["placed"] * BATCH_EVENTS,
        "placed_at": pa.array([start + datetime.timedelta(seconds=i)
                               for i in range(BATCH_EVENTS)], pa.timestamp("us", tz="UTC")),
    })
    held: list[object] = []
    for view in VIEWS:
        rows, before = arrow_rows(records), arrow_rows(records)
        events = [ChangeEvent(view, row["order_id"], change_op(old, row), row, old, 7, 1, 0)
                  for row, old in zip(rows, before, strict=True)]
        for event in events:
            event.to_bytes()
        held += [rows, before, events]
    return held


def _full_collections_over(batches: int) -> int:
    """Full collections while `batches` batches run one after the other."""
    gc.freeze()  # a known start: nothing in the generations, whatever ran before
    gc.collect()
    before = gc.get_stats()[2]["collections"]
    for _ in range(batches):
        held = _batch()
        del held
    return gc.get_stats()[2]["collections"] - before


def test_a_batchs_rows_and_events_hold_no_cycles(collector: None) -> None:
    _batch()  # a first batch's lazy set-ups (pyarrow's, datetime's) are not a batch's
    gc.disable()
    try:
        gc.collect()  # what came before
        held = _batch()
        del held
        assert gc.collect() == 0  # everything went by reference counting
    finally:
        gc.enable()


def test_ten_large_batches_run_no_full_collection_with_the_engines_thresholds(
        collector: None) -> None:
    gc.set_threshold(*CPYTHON_THRESHOLDS)
    assert _full_collections_over(2) >= 2  # what the engine's batches paid

    gc.unfreeze()
    keep_collector_out_of_batches()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert _full_collections_over(10) == 0


def test_a_change_feed_goes_by_reference_counting(collector: None) -> None:
    feed = ChangeFeed("127.0.0.1:1", "viewgate.changes.Order")  # connects lazily
    gone = weakref.ref(feed)
    gc.disable()
    try:
        del feed
        assert gone() is None  # no cycle through the producer's delivery callback
    finally:
        gc.enable()
