"""The driver hands the free memory its allocators keep back to the system (engine.memory)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest

from engine.memory import (
    MemoryRelease,
    release_free_memory,
    resident_bytes,
    use_system_allocator,
)

MIB = 2**20


def _churn_arrow_in_threads() -> None:
    """What a batch does: threads build Arrow buffers and drop them."""
    def build(_: int) -> int:
        return len(pa.array(np.arange(2_000_000)) + 1)  # 16 MiB of int64, twice

    for _ in range(10):
        with ThreadPoolExecutor(4, "churn") as pool:
            assert sum(pool.map(build, range(8))) == 16_000_000


@pytest.fixture(params=["arrow's default pool", "the engine's system allocator"])
def arrow_pool(request):
    previous = pa.default_memory_pool()
    if request.param != "arrow's default pool":
        use_system_allocator()
        assert pa.default_memory_pool().backend_name == "system"
    yield
    pa.set_memory_pool(previous)


@pytest.mark.usefixtures("arrow_pool")
def test_release_gives_back_what_threads_freed():
    release_free_memory()
    _churn_arrow_in_threads()
    assert pa.total_allocated_bytes() == 0  # all freed, yet kept by the allocator:
    kept = resident_bytes()
    released = release_free_memory()
    assert released.resident_before >= kept - 8 * MIB
    # The churn peaked at 8 buffers of 16 MiB at once; most of it goes back.
    assert released.resident_after < released.resident_before - 32 * MIB, released
    assert resident_bytes() < kept - 32 * MIB


def test_release_runs_once_an_interval():
    now = [0.0]
    memory = MemoryRelease(interval_s=30, clock=lambda: now[0])
    assert memory.tick() is None
    now[0] = 29.9
    assert memory.tick() is None
    now[0] = 30.0
    first = memory.tick()
    assert first is not None and first.seconds >= 0
    now[0] = 59.0
    assert memory.tick() is None  # counted from the last release
    now[0] = 60.0
    assert memory.tick() is not None
