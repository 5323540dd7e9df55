"""The soak's account of where the engine driver's memory lives (viewgate.bench
.driver_memory), read from this process."""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest

from viewgate.bench import driver_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_each_allocator_sees_what_it_allocated():
    before = driver_memory.sample()
    assert before["rss_kb"] > 0 and before["anonymous_kb"] > 0 and before["python_blocks"] > 0
    held = bytearray(64 * 1024 * 1024)  # a large object: glibc malloc's
    array = pa.array(range(4_000_000), pa.int64())  # 32 MB from Arrow's pool
    after = driver_memory.sample()
    assert after["malloc_in_use_kb"] - before["malloc_in_use_kb"] >= 60 * 1024
    assert after["arrow_kb"] - before["arrow_kb"] >= 30 * 1024
    del held, array
    assert driver_memory.sample()["malloc_in_use_kb"] < after["malloc_in_use_kb"] - 60 * 1024


def test_the_key_indexes_on_disk_are_counted_apart(tmp_path):
    import numpy as np

    from engine.sinks.key_index import KeyIndex

    before = driver_memory.sample()["key_index_spilled_kb"]
    index = KeyIndex(fold_at=1, spill_dir=tmp_path)
    index.add("a", np.arange(640_000, dtype=np.int64))  # 16 bytes an entry: 10,000 KiB
    index.settle()
    assert driver_memory.sample()["key_index_spilled_kb"] - before == 10_000
    del index
    assert driver_memory.sample()["key_index_spilled_kb"] == before
