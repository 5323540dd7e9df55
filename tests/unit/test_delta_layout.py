"""A view's Delta table stays cheap to change as it grows: a batch's MERGE rewrites only
the files its keys fall in, and maintenance compacts into files ordered by key, keeps
`asOf` working within the view's history, and checkpoints the log. Real Delta tables (delta-rs),
no Spark."""

from __future__ import annotations

import os
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.maintenance import (
    MaintenanceSchedule,
    configure_table,
    maintain,
    table_properties,
)
from engine.sinks.delta_sink import DeltaSink
from schema import demo
from schema.catalog import Catalog
from schema.delta_read import live_rows
from schema.errors import CatalogError
from schema.storage import delta_app_id

VIEW = demo.CUSTOMER  # keyed by customer_id
SCHEMA = pa.schema([("customer_id", pa.string()), ("name", pa.string()),
                    ("tier", pa.string()), ("country", pa.string())])


def _rows(first: int, count: int, tier: str = "gold") -> list[dict]:
    return [{"customer_id": f"C{i:06d}", "name": f"n{i}", "tier": tier, "country": "NL"}
            for i in range(first, first + count)]


def _table_in_files(path: str, files: int, per_file: int) -> None:
    """`files` files, each a narrow key range, as maintenance leaves a table."""
    for f in range(files):
        write_deltalake(path, pa.Table.from_pylist(_rows(f * per_file, per_file), SCHEMA),
                        mode="append")


def _last_metrics(path: str) -> dict:
    return DeltaTable(path).history(1)[0]["operationMetrics"]


def test_a_merge_rewrites_only_the_files_its_keys_fall_in(tmp_path):
    path = str(tmp_path / "Customer")
    _table_in_files(path, files=20, per_file=500)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    # Updates within the last file's key range, a delete there, and new keys after it.
    updates = _rows(9_700, 50, tier="platinum") + _rows(10_000, 30)
    deleted = [{"customer_id": "C009990"}]
    assert sink.merge(1, updates, deleted, VIEW.key, metadata={"batch_id": 1})

    metrics = _last_metrics(path)
    # Pruned by the files' key statistics before the scan (a streamed MERGE scans all 20).
    assert metrics["num_target_files_scanned"] == 1
    assert metrics["num_target_files_removed"] == 1
    assert metrics["num_target_rows_copied"] < 500  # of 10,000 rows
    table = live_rows(DeltaTable(path))
    tiers = dict(zip(table["customer_id"].to_pylist(), table["tier"].to_pylist(), strict=True))
    assert len(tiers) == 10_000 + 30 - 1
    assert tiers["C009700"] == "platinum" and tiers["C000000"] == "gold"
    assert "C009990" not in tiers and tiers["C010029"] == "gold"


def test_maintenance_compacts_in_key_order_and_keeps_history(tmp_path):
    path = str(tmp_path / "Customer")
    write_deltalake(path, pa.Table.from_pylist([], SCHEMA))
    configure_table(path, VIEW, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    # Batches whose keys interleave: every file's key range spans the whole table.
    for batch in range(8):
        rows = [r for i, r in enumerate(_rows(0, 4_000)) if i % 8 == batch]
        sink.merge(batch, rows, [], VIEW.key, metadata={"batch_id": batch})
    first_version = DeltaTable(path).version()
    # Updates of keys in every file: each file is removed and added again with a deletion
    # vector (a tombstone without a time), then removed for good by the compaction below.
    sink.merge(8, _rows(0, 16, tier="silver"), [], VIEW.key, metadata={"batch_id": 8})
    before = DeltaTable(path)
    version_before = before.version()
    content_before = live_rows(before).sort_by("customer_id")

    result = sink.maintain(64 * 1024)

    table = DeltaTable(path)
    assert result.files_removed == 9 and result.files_added >= 1
    assert live_rows(table).sort_by("customer_id").equals(content_before)
    # Each file now holds a key range no other file overlaps.
    actions = pa.table(table.get_add_actions(flatten=True)).sort_by("min.customer_id")
    lows, highs = actions["min.customer_id"].to_pylist(), actions["max.customer_id"].to_pylist()
    assert all(high < low for high, low in zip(highs, lows[1:], strict=False))
    # Within the view's history (a day) earlier versions still read: asOf keeps working.
    table.load_as_version(version_before)
    assert live_rows(table).num_rows == 4_000
    # Also the version before the vectors: its files were removed for good by the
    # compaction, and VACUUM keeps them as long as the history.
    table.load_as_version(first_version)
    assert set(live_rows(table)["tier"].to_pylist()) == {"gold"}
    table.vacuum(retention_hours=1, dry_run=False, enforce_retention_duration=False)
    assert live_rows(table).num_rows == 4_000
    assert any(p.name.endswith(".checkpoint.parquet")
               for p in (tmp_path / "Customer" / "_delta_log").iterdir())
    # Idempotency records survive maintenance: a replayed batch is still refused.
    assert not DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0)).merge(
        7, [], [], VIEW.key, metadata={"batch_id": 7})


def test_table_properties_follow_the_views_history(tmp_path):
    props = table_properties(VIEW, 1024)
    assert props["delta.logRetentionDuration"] == "interval 86400 seconds"
    assert props["delta.deletedFileRetentionDuration"] == "interval 86400 seconds"
    path = str(tmp_path / "t")
    write_deltalake(path, pa.Table.from_pylist([], SCHEMA))
    configure_table(path, VIEW, 1024)
    version = DeltaTable(path).version()
    configure_table(path, VIEW, 1024)  # unchanged: no new commit
    assert DeltaTable(path).version() == version
    assert DeltaTable(path).metadata().configuration["delta.targetFileSize"] == "1024"


def test_an_unreadable_history_is_refused_with_the_fix():
    from dataclasses import replace
    view = replace(VIEW, history="forever")
    try:
        Catalog.of(sources=[demo.CUSTOMERS], views=[view]).validate()
    except CatalogError as error:
        text = str(error)
        assert "history" in text and "forever" in text
    else:
        raise AssertionError("a history of 'forever' was accepted")


def test_maintenance_schedule():
    now = [100.0]
    schedule = MaintenanceSchedule(60.0, clock=lambda: now[0])
    assert not schedule.due()
    now[0] = 160.0
    assert schedule.due()
    schedule.done()
    assert not schedule.due()
    now[0] = 219.0
    assert not schedule.due()
    assert not MaintenanceSchedule(0.0, clock=lambda: 1e9).due()


def test_maintenance_phases_spread_the_first_runs_over_the_interval():
    now = [100.0]
    schedules = [MaintenanceSchedule(60.0, clock=lambda: now[0], phase=i / 5) for i in range(5)]
    due_at = []
    for second in range(101, 161):
        now[0] = float(second)
        for i, schedule in enumerate(schedules):
            if schedule.due() and i not in dict(due_at):
                due_at.append((i, second))
    # 12 s apart, the last phase first; after a run each waits a whole interval.
    assert due_at == [(4, 112), (3, 124), (2, 136), (1, 148), (0, 160)]
    schedules[4].done()
    now[0] = 171.0
    assert not schedules[4].due()


def test_maintenance_deletes_change_data_older_than_the_history(tmp_path):
    path = str(tmp_path / "Customer")
    write_deltalake(path, pa.Table.from_pylist([], SCHEMA),
                    configuration={"delta.enableChangeDataFeed": "true"})
    configure_table(path, VIEW, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    for batch in range(1, 4):
        sink.merge(batch, _rows(0, 100, tier=f"t{batch}"), [], VIEW.key,
                   metadata={"batch_id": batch})
    change_data = sorted((tmp_path / "Customer" / "_change_data").iterdir())
    assert len(change_data) == 2  # the first batch only inserted: no change-data file
    old = change_data[0]
    day_and_a_minute_ago = time.time() - 86_400 - 60  # the view's history is a day
    os.utime(old, (day_and_a_minute_ago, day_and_a_minute_ago))

    maintain(path, VIEW)

    assert sorted((tmp_path / "Customer" / "_change_data").iterdir()) == change_data[1:]


@pytest.mark.parametrize(("history", "deleted", "kept"), [
    ("1 day", "two days", "two hours"),  # older than the history
    ("2 seconds", "two hours", "ten minutes"),  # and an hour old at least
])
def test_maintenance_deletes_data_files_no_version_names(tmp_path, history, deleted, kept):
    """A writer killed between writing a batch's files and committing them leaves data
    files no version names: maintenance deletes them once older than the view's history
    and than an hour (a younger one may be a batch's, being written), and nothing the
    table uses (its data files, its deletion-vector files) however old."""
    from dataclasses import replace
    view = replace(VIEW, history=history)
    path = str(tmp_path / "Customer")
    write_deltalake(path, pa.Table.from_pylist([], SCHEMA),
                    configuration={"delta.enableChangeDataFeed": "true"})
    configure_table(path, view, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, view, delta_app_id(view.name, 0))
    for batch in range(1, 5):  # overlapping keys: each batch marks rows of the earlier files
        sink.merge(batch, _rows(batch * 50, 100, tier=f"t{batch}"), [], view.key,
                   metadata={"batch_id": batch})
    root = tmp_path / "Customer"
    used = {p.name for p in root.iterdir() if p.is_file()}
    assert any(name.startswith("deletion_vector_") for name in used)
    ages = {"two days": 2 * 86_400, "two hours": 7_200, "ten minutes": 600}
    orphans = {age: f"part-00000-{uuid.uuid4()}-c000.snappy.parquet" for age in ages}
    for name in orphans.values():
        pq.write_table(pa.Table.from_pylist(_rows(9_000, 10), SCHEMA), root / name)
    for name in used:  # what the table uses, as old as the oldest orphan
        os.utime(root / name, (time.time() - ages["two days"],) * 2)
    for age, name in orphans.items():
        os.utime(root / name, (time.time() - ages[age],) * 2)
    expected = live_rows(DeltaTable(path)).sort_by("customer_id")

    maintain(path, view)

    left = {p.name for p in root.iterdir() if p.is_file()}
    assert orphans[deleted] not in left
    assert orphans[kept] in left
    assert used <= left
    assert live_rows(DeltaTable(path)).sort_by("customer_id") == expected
    assert expected.num_rows == 250


def test_a_history_shorter_than_an_hour_is_vacuumed_to_the_second(tmp_path):
    from dataclasses import replace
    view = replace(VIEW, history="2 seconds")
    path = str(tmp_path / "Customer")
    write_deltalake(path, pa.Table.from_pylist([], SCHEMA))
    configure_table(path, view, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, view, delta_app_id(view.name, 0))
    for batch in range(1, 5):
        sink.merge(batch, _rows(batch * 100, 100), [], view.key, metadata={"batch_id": batch})
    small_files = set(pa.table(DeltaTable(path).get_add_actions())["path"].to_pylist())
    assert len(small_files) == 4

    sink.maintain(64 * 1024)  # compacts the four files into one; they are kept for now
    on_disk = {p.name for p in (tmp_path / "Customer").iterdir()}
    assert small_files <= on_disk

    # Once their two seconds have passed, maintenance deletes them (an hour's rounding
    # kept them for an hour).
    deadline = time.monotonic() + 30
    while small_files & {p.name for p in (tmp_path / "Customer").iterdir()}:
        assert time.monotonic() < deadline, "files older than the history were kept"
        maintain(path, view)
    assert live_rows(DeltaTable(path)).num_rows == 400


def test_background_maintenance_runs_beside_the_caller_and_is_waited_for():
    import threading

    from engine.maintenance import BackgroundMaintenance

    background = BackgroundMaintenance("Customer")
    assert background.wait() == 0.0  # nothing running
    release, ran = threading.Event(), []

    def work() -> None:
        release.wait(10)
        ran.append(threading.current_thread().name)

    background.start(work)
    assert not ran  # start returned while the work waits: it runs beside its caller
    assert background.running()
    threading.Timer(0.2, release.set).start()
    assert background.wait() >= 0.15  # the next MERGE waits until the run ends
    assert ran and ran[0].startswith("maintenance-Customer")
    assert not background.running() and background.wait() == 0.0

    def failing() -> None:
        raise RuntimeError("disk full")

    background.start(failing)
    background.wait()  # a failed run (logged by the work) does not fail the next MERGE
    background.start(lambda: ran.append("again"))
    background.wait()
    assert ran[-1] == "again"


def test_one_background_maintenance_per_table_in_a_process():
    import threading

    from engine.maintenance import background_for, running_maintenance

    # Committers of a restarted query share the table's: their MERGEs wait for its runs.
    assert background_for("/d/Order/g0", "Order") is background_for("/d/Order/g0", "Order")
    assert background_for("/d/Order/g0", "Order") is not background_for("/d/Order/g1", "Order")
    release = threading.Event()
    background_for("/d/Order/g1", "Order").start(lambda: release.wait(10))
    assert "Order" in running_maintenance()  # the engine's stop line names it
    release.set()
    background_for("/d/Order/g1", "Order").wait()
    assert "Order" not in running_maintenance()
