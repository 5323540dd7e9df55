"""Where a process's memory lives, by allocator, sampled in the soak's engine driver (the
soak runs the engine in its own process): an hour's soak saw the driver's RSS double,
and RSS alone cannot say whose it is.

- `python_blocks`: objects CPython's own allocator holds (sys.getallocatedblocks);
- `arrow_kb`: what Arrow has allocated (its default pool: jemalloc, viewgate/__init__.py);
- `malloc_in_use_kb` and `malloc_free_kb`: glibc malloc's bytes in use and free but kept
  (mallinfo2, every arena): delta-rs's Rust code, Python's large objects and the C
  libraries allocate there; a large `free` is fragmentation, a growing `in use` is data;
- `anonymous_kb`: the process's anonymous memory (smaps_rollup), every allocator's
  together; what RSS adds to it is mapped files (code, the JVM's jars are not here);
- `key_index_spilled_kb`: what the deletion-vector writers' key indexes keep on disk
  instead (engine.sinks.key_index), which grows with the views' rows by design.
"""

from __future__ import annotations

import sys
import threading

import pyarrow as pa

from engine.malloc import mallinfo
from engine.sinks.key_index import spilled_bytes_total
from viewgate.bench.load import proc_kb


def sample() -> dict[str, int]:
    """This process's memory by allocator (see the module docstring); a figure this
    machine cannot read is left out."""
    out = {
        "python_blocks": sys.getallocatedblocks(),
        "arrow_kb": pa.default_memory_pool().bytes_allocated() // 1024,
        "threads": threading.active_count(),
        "key_index_spilled_kb": spilled_bytes_total() // 1024,
    }
    info = mallinfo()
    if info is not None:
        out["malloc_in_use_kb"] = (info.uordblks + info.hblkhd) // 1024
        out["malloc_free_kb"] = info.fordblks // 1024
    for name, path, field in (("rss_kb", "/proc/self/status", "VmRSS"),
                              ("anonymous_kb", "/proc/self/smaps_rollup", "Anonymous")):
        kb = proc_kb(path, field)
        if kb is not None:
            out[name] = kb
    return out
