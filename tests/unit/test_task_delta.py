"""Delta files written by Spark's tasks, committed by the driver (engine.task_delta): the
table ends as the driver's own MERGE leaves it, with the same change data; a replay, a
share whose previous rows are not Delta's, and a commit called off leave no file behind."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.maintenance import configure_table
from engine.sinks.delta_sink import DeltaSink
from engine.task_delta import WrittenShare
from schema import demo
from schema.delta_read import live_rows
from schema.storage import ChangeEvent, change_op, delta_app_id

VIEW = demo.CUSTOMER
SCHEMA = pa.schema([("customer_id", pa.string()), ("name", pa.string()),
                    ("tier", pa.string()), ("country", pa.string())])


def _row(n: int, tier: str) -> dict:
    return {"customer_id": f"C{n:03d}", "name": f"n{n}", "tier": tier, "country": "NL"}


def _sink(tmp_path: Path) -> tuple[str, DeltaSink]:
    path = str(tmp_path / "Customer")
    write_deltalake(path, pa.Table.from_pylist([], SCHEMA),
                    configuration={"delta.enableChangeDataFeed": "true"})
    configure_table(path, VIEW, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    assert sink.merge(0, [_row(n, "bronze") for n in range(10)], [], VIEW.key,
                      metadata={"batch_id": 0})
    return path, sink


def _event(key: str, row: dict | None, before: dict | None, batch: int) -> ChangeEvent:
    return ChangeEvent(VIEW.name, key, change_op(before, row), row, before, batch, 0, 0)


def _shares(sink: DeltaSink, batch: int) -> list[WrittenShare]:
    """Batch `batch` in two tasks: one updates C001 and C002 and inserts C010, the other
    deletes C003 and C004 and updates C005."""
    writer = sink.task_writer({})
    assert writer is not None and writer.change_data
    first = [_event("C001", _row(1, "gold"), _row(1, "bronze"), batch),
             _event("C010", _row(10, "silver"), None, batch),
             _event("C002", _row(2, "gold"), _row(2, "bronze"), batch)]
    second = [_event("C003", None, _row(3, "bronze"), batch),
              _event("C004", None, _row(4, "bronze"), batch),
              _event("C005", _row(5, "silver"), _row(5, "bronze"), batch)]
    return [WrittenShare.decoded(writer.write(events, partition))
            for partition, events in enumerate((first, second))]


def _files(path: str) -> set[str]:
    return {str(p.relative_to(path)) for p in Path(path).rglob("*.parquet")
            if "_delta_log" not in p.parts}


def _tiers(path: str) -> dict[str, str]:
    data = live_rows(DeltaTable(path))
    return dict(zip(data["customer_id"].to_pylist(), data["tier"].to_pylist(), strict=True))


def test_the_driver_commits_the_files_the_tasks_wrote(tmp_path):
    path, sink = _sink(tmp_path)
    before = _files(path)
    shares = _shares(sink, 1)
    written = {name for share in shares for name in share.names()}
    assert len(written) == 4  # a data file and a change-data file a task
    assert sink.merge_written(1, shares, {"batch_id": 1}) is True

    assert _tiers(path) == {**{f"C{n:03d}": "bronze" for n in range(10) if n not in (3, 4)},
                            "C001": "gold", "C002": "gold", "C005": "silver",
                            "C010": "silver"}
    assert _files(path) == before | written  # nothing rewritten
    table = DeltaTable(path)
    assert table.transaction_version(delta_app_id(VIEW.name, 0)) == 1
    changes = pa.table(table.load_cdf(starting_version=table.version())).to_pylist()
    assert sorted((c["customer_id"], c["_change_type"], c["tier"]) for c in changes) == [
        ("C001", "update_postimage", "gold"), ("C001", "update_preimage", "bronze"),
        ("C002", "update_postimage", "gold"), ("C002", "update_preimage", "bronze"),
        ("C003", "delete", "bronze"), ("C004", "delete", "bronze"),
        ("C005", "update_postimage", "silver"), ("C005", "update_preimage", "bronze"),
        ("C010", "insert", "silver")]

    # The next batch's MERGE, the driver's own, finds the tasks' rows by key.
    assert sink.merge(2, [_row(10, "gold")], [{"customer_id": "C001"}], VIEW.key,
                      metadata={"batch_id": 2})
    tiers = _tiers(path)
    assert tiers["C010"] == "gold" and "C001" not in tiers

    # A replay of batch 1 (its tasks ran again): their new files are deleted, nothing
    # is committed.
    files = _files(path)
    assert sink.merge_written(1, _shares(sink, 1), {"batch_id": 1}) is False
    assert _files(path) == files and _tiers(path) == tiers


def test_previous_rows_that_are_not_deltas_leave_the_batch_to_the_driver(tmp_path):
    path, sink = _sink(tmp_path)
    before = _files(path)
    writer = sink.task_writer({})
    assert writer is not None
    # C042 had no row in Delta, but the task read one in Redis: the driver merges.
    stale = WrittenShare.decoded(writer.write(
        [_event("C042", _row(42, "gold"), _row(42, "bronze"), 1)]))
    assert sink.merge_written(1, [stale], {"batch_id": 1}) is None
    assert _files(path) == before
    assert DeltaTable(path).transaction_version(delta_app_id(VIEW.name, 0)) == 0


def test_a_commit_called_off_deletes_the_tasks_files(tmp_path):
    path, sink = _sink(tmp_path)
    before = _files(path)

    def called_off() -> None:
        raise RuntimeError("Redis did not take the batch")

    with pytest.raises(RuntimeError):
        sink.merge_written(1, _shares(sink, 1), {"batch_id": 1}, ready=called_off)
    assert _files(path) == before
    assert not list(Path(path).glob("deletion_vector_*.bin"))
    assert DeltaTable(path).transaction_version(delta_app_id(VIEW.name, 0)) == 0


def test_a_batch_of_inserts_only_commits_no_change_data(tmp_path):
    # As Delta's own writers: an insert-only commit's adds are its inserts.
    path, sink = _sink(tmp_path)
    writer = sink.task_writer({})
    assert writer is not None
    share = WrittenShare.decoded(writer.write([_event("C020", _row(20, "gold"), None, 1)]))
    assert sink.merge_written(1, [share], {"batch_id": 1}) is True
    assert share.change_data is not None
    assert not (Path(path) / share.change_data["path"]).exists()
    table = DeltaTable(path)
    changes = pa.table(table.load_cdf(starting_version=table.version())).to_pylist()
    assert [(c["customer_id"], c["_change_type"]) for c in changes] == [("C020", "insert")]
