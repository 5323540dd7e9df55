"""Threads for delta-rs work, with stacks deep enough for it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

# delta-rs recursed deeper than a thread's default stack (8 MiB) in a graph thread on a
# batch of 120,000 events (SIGSEGV in deltalake's _internal, the gateway bench's engine
# run; the function is not identified), which killed the engine on every replay of it.
# The graph's threads and the maintenance threads get this much address space for their
# stacks; only what a call really uses becomes resident.
THREAD_STACK_BYTES = 256 * 1024 * 1024


# The stack size is the process's: callers in several threads at once (the views' Delta
# threads start their maintenance threads together) would each restore what another set.
_STACK_SIZE_LOCK = threading.Lock()


def started_threads(count: int, name: str) -> ThreadPoolExecutor:
    """A pool of `count` threads, all started now with THREAD_STACK_BYTES of stack
    (a pool starts its threads on demand, when the process-wide stack size may differ)."""
    pool = ThreadPoolExecutor(count, name)
    everyone = threading.Barrier(count + 1)
    with _STACK_SIZE_LOCK:
        previous = threading.stack_size(THREAD_STACK_BYTES)
        try:
            for _ in range(count):  # each task blocks, so each submit starts a thread
                pool.submit(everyone.wait, 60)
            everyone.wait(60)
        finally:
            threading.stack_size(previous)
    return pool
