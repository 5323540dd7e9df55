"""Reading what a batch covers from a Structured Streaming checkpoint's offset log."""

from __future__ import annotations

from pathlib import Path

from engine.batch_offsets import BatchOffsets, read_batch_offsets

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


def test_a_batch_is_read_once_however_many_views_record_it(tmp_path: Path, monkeypatch) -> None:
    import engine.batch_offsets as batch_offsets

    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(OFFSET_LOG)
    (tmp_path / "offsets" / "4").write_text(OFFSET_LOG.replace("419", "500"))
    reads: list[str] = []
    real = batch_offsets.read_text
    monkeypatch.setattr(batch_offsets, "read_text", lambda p: reads.append(p) or real(p))
    first = [read_batch_offsets(str(tmp_path), 3) for _ in range(5)]
    assert len(reads) == 1 and all(c == first[0] for c in first)
    # The next batch is read anew, and a batch not written yet is looked for every time.
    assert read_batch_offsets(str(tmp_path), 4).offsets["shop.orders"]["0"] == 500
    assert read_batch_offsets(str(tmp_path), 5) is None
    assert read_batch_offsets(str(tmp_path), 5) is None
    assert len(reads) == 4
