"""`asOf` beyond a view's history (schema.catalog View.history): once maintenance has removed
a Delta table's old log entries and files, a read as of an older version, Delta version or
time answers BAD_AS_OF saying how much history the view keeps and how to keep more, instead
of a delta-rs error, "no Delta table yet", or (for a time) the oldest version it still has.
A real Delta table, written by the engine's sink and cleaned with delta-rs."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from test_delta_previous_rows import SCHEMA, _window

from engine.sinks.delta_sink import DeltaSink
from gateway.reads.delta_store import AsOf, DeltaStore
from gateway.reads.filters import QueryError
from schema import demo
from schema.storage import delta_app_id, delta_table_path
from viewgate.stack.process import wait_until

VIEW = demo.PRODUCT_SALES
BATCHES = 6


def _row(count: int) -> dict:
    return {"product_id": "P1", **_window(0), "order_count": count, "revenue": float(count)}


@pytest.fixture
def cleaned(tmp_path) -> tuple[str, datetime.datetime]:
    """Batches 0..5 merged, then the log checkpointed and its older entries removed, and
    the files older versions needed vacuumed; with the time before the first batch."""
    path = delta_table_path(str(tmp_path), VIEW.name, 0)
    write_deltalake(path, pa.Table.from_pylist([], schema=SCHEMA), configuration={
        "delta.logRetentionDuration": "interval 0 seconds",
        "delta.deletedFileRetentionDuration": "interval 0 seconds"})
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    before = datetime.datetime.now(datetime.UTC)
    # Commit timestamps are milliseconds: the first must be strictly after `before`.
    wait_until(lambda: datetime.datetime.now(datetime.UTC) - before
               >= datetime.timedelta(milliseconds=2), timeout_s=5, what="the clock to move on",
               interval_s=0.001)
    for batch in range(BATCHES):
        assert sink.merge(batch, [_row(batch)], [], VIEW.key, metadata={"batch_id": batch})
    table = DeltaTable(path)
    table.create_checkpoint()
    table.cleanup_metadata()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert min(c["version"] for c in DeltaTable(path).history()) > 0  # the log was cleaned
    return str(tmp_path), before


@pytest.mark.parametrize("as_of", [AsOf(version=1), AsOf(delta_version=1), None],
                         ids=["version", "delta_version", "timestamp"])
def test_as_of_beyond_the_history_names_the_setting(cleaned, as_of):
    root, before = cleaned
    as_of = as_of or AsOf(timestamp=before)
    with pytest.raises(QueryError) as refused:
        DeltaStore(root).read(VIEW, as_of=as_of)
    error = refused.value
    assert error.extensions["code"] == "BAD_AS_OF"
    assert error.extensions["history"] == VIEW.history == "1 day"
    message = str(error)
    assert f"ProductSales keeps {VIEW.history} of history" in message, message
    assert "declare a longer history on the view" in message and "history=" in message


def test_what_the_table_still_holds_reads_as_before(cleaned):
    root, _ = cleaned
    store = DeltaStore(root)
    rows, snapshot = store.read(VIEW, as_of=AsOf(version=BATCHES - 1))
    assert snapshot.batch == BATCHES - 1 and [r["order_count"] for r in rows] == [BATCHES - 1]
    rows, _ = store.read(VIEW, as_of=AsOf(timestamp=datetime.datetime.now(datetime.UTC)))
    assert [r["order_count"] for r in rows] == [BATCHES - 1]
    # Newer than the newest: still the message that says what it holds.
    with pytest.raises(QueryError) as ahead:
        store.read(VIEW, as_of=AsOf(version=BATCHES + 5))
    assert "holds versions up to 5" in str(ahead.value)
