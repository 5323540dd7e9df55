"""The graph's thread pools start every thread at once, with a deep stack (engine/graph.py:
delta-rs overflowed the default 8 MiB on a large batch)."""

import os
import threading

import pytest

from engine.graph import GRAPH_THREAD_STACK_BYTES, started_threads


def _stacks_of_that_size() -> int:
    count = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if abs(end - start - GRAPH_THREAD_STACK_BYTES) <= 1024 * 1024:
                count += 1
    return count


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux only")
def test_every_thread_starts_at_once_with_the_deep_stack():
    before = _stacks_of_that_size()
    pool = started_threads(3, "test-graph")
    try:
        assert len(pool._threads) == 3
        assert _stacks_of_that_size() - before == 3
        assert threading.stack_size() == 0  # the process's default is back
        assert pool.submit(lambda: 42).result(timeout=10) == 42
    finally:
        pool.shutdown()
