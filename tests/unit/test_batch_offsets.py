"""Reading what a batch covers from a Structured Streaming checkpoint's offset log."""

from __future__ import annotations

from pathlib import Path

from engine.batch_offsets import BatchOffsets, read_batch_offsets, records_between

# The shape Spark 4.2 writes to <checkpoint>/offsets/<batch id>.
OFFSET_LOG = """v1
{"batchWatermarkMs":1704067230250,"batchTimestampMs":1795387181818,"conf":{"a":"b"}}
{"shop.orders":{"0":419,"1":415}}
"""


def test_offsets_and_watermark_of_a_batch(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "7").write_text(OFFSET_LOG)
    covered = read_batch_offsets(str(tmp_path), 7)
    assert covered == BatchOffsets(
        {"shop.orders": {"0": 419, "1": 415}}, "2024-01-01T00:00:30.250Z"
    )
    assert read_batch_offsets(f"file://{tmp_path}", 7) == covered


def test_no_watermark_and_missing_batches(tmp_path: Path) -> None:
    # (A checkpoint in a bucket: tests/integration/test_object_storage.py.)
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text(OFFSET_LOG.replace("1704067230250", "0"))
    assert read_batch_offsets(str(tmp_path), 0).watermark == ""
    assert read_batch_offsets(str(tmp_path), 1) is None


def test_the_fields_a_view_records_of_its_batch(tmp_path: Path) -> None:
    from engine.commit import offsets_fields

    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "7").write_text(OFFSET_LOG)
    assert offsets_fields(str(tmp_path), 7) == {
        "offsets": {"shop.orders": {"0": 419, "1": 415}},
        "watermark": "2024-01-01T00:00:30.250Z",
    }
    assert offsets_fields(str(tmp_path), 8) == {}  # not written (yet)
    assert offsets_fields(None, 7) == {}  # a commit with no query (tests, tools)


def test_the_records_a_batch_covers_from_its_offsets_and_the_previous_batchs() -> None:
    previous = {"shop.orders": {"0": 400, "1": 410}, "shop.customers": {"0": 7}}
    ends = {"shop.orders": {"0": 419, "1": 415}, "shop.customers": {"0": 7}}
    assert records_between(previous, ends) == 24
    assert records_between(None, ends) is None  # the first batch: its start is unknown
    # A partition the previous batch did not have (a topic grew one): unknown too.
    assert records_between(previous, {**ends, "shop.customers": {"0": 9, "1": 3}}) is None


def test_where_the_first_batch_starts(tmp_path: Path) -> None:
    """The Kafka source's starting offsets as it wrote them (a zero byte, the version, the
    offsets); Spark's markers for earliest and latest are not offsets."""
    from engine.batch_offsets import read_initial_offsets

    written = tmp_path / "sources" / "0" / "0"
    written.parent.mkdir(parents=True)
    written.write_text('\0v1\n{"shop.orders":{"0":12,"1":0},"shop.customers":{"0":4}}')
    assert read_initial_offsets(str(tmp_path)) == {
        "shop.orders": {"0": 12, "1": 0}, "shop.customers": {"0": 4}}
    written.write_text('\0v1\n{"shop.orders":{"0":-2,"1":0}}')
    assert read_initial_offsets(str(tmp_path)) is None
    assert read_initial_offsets(str(tmp_path / "elsewhere")) is None


def test_the_graph_s_first_batch_starts_at_the_source_s_starting_offsets(tmp_path: Path) -> None:
    """So that the driver fetches it (engine.driver_fetch) instead of a Spark job."""
    from types import SimpleNamespace

    from engine.graph import GraphBatch

    written = tmp_path / "sources" / "0" / "0"
    written.parent.mkdir(parents=True)
    written.write_text('\0v1\n{"shop.orders":{"0":12,"1":0}}')
    batch = SimpleNamespace(checkpoint=str(tmp_path), _ends=None)
    ends = {"shop.orders": {"0": 20, "1": 5}}
    assert GraphBatch._starts(batch, 0, ends) == {"shop.orders": {"0": 12, "1": 0}}
    assert GraphBatch._starts(batch, 1, {"shop.orders": {"0": 25, "1": 5}}) == ends
