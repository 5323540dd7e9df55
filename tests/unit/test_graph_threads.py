"""The graph's and maintenance's thread pools start every thread at once, with a deep
stack (engine/threads.py: delta-rs overflowed the default 8 MiB on a large batch)."""

import ctypes
import sys
import threading

import pytest

from engine.threads import THREAD_STACK_BYTES, started_threads


def _own_stack_bytes() -> int:
    """The calling thread's stack size, as pthreads gave it (glibc)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.pthread_self.restype = ctypes.c_ulong
    attr = ctypes.create_string_buffer(128)  # pthread_attr_t: 56 bytes on x86-64
    assert libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) == 0
    size = ctypes.c_size_t()
    libc.pthread_attr_getstacksize(attr, ctypes.byref(size))
    libc.pthread_attr_destroy(attr)
    return size.value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's pthreads")
def test_every_thread_starts_at_once_with_the_deep_stack():
    default = threading.stack_size()
    pool = started_threads(3, "test-graph")
    try:
        assert len(pool._threads) == 3
        assert threading.stack_size() == default  # the process's default is back
        # One task a thread (each waits for the others), each reading its own stack.
        everyone = threading.Barrier(3)

        def stack_bytes() -> int:
            everyone.wait(10)
            return _own_stack_bytes()

        sizes = [f.result(timeout=10) for f in [pool.submit(stack_bytes) for _ in range(3)]]
        assert all(abs(s - THREAD_STACK_BYTES) <= 1024 * 1024 for s in sizes), sizes
        assert _own_stack_bytes() < THREAD_STACK_BYTES  # the test's thread: the default
    finally:
        pool.shutdown()


def test_callers_in_several_threads_at_once_leave_the_default_as_it_was():
    # The views' Delta threads start their maintenance threads together.
    default = threading.stack_size()
    everyone = threading.Barrier(8)
    pools = []

    def start() -> None:
        everyone.wait(10)
        pools.append(started_threads(1, "test-maintenance"))

    callers = [threading.Thread(target=start) for _ in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    try:
        assert len(pools) == 8
        assert threading.stack_size() == default
    finally:
        for pool in pools:
            pool.shutdown()
