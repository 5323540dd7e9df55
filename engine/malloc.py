"""glibc malloc's free memory, handed back to the system after a batch that needed much.

A batch far larger than the usual (a stall, or the backlog after a restart) takes memory
from glibc's arenas in blocks below the mmap threshold (viewgate/__init__.py). Once freed,
those stay in the arenas between blocks still in use, and glibc only gives back the free
memory at an arena's top. In the engine's hour on 2026-11-27 one 7.4-second batch at minute
15 left 100-160 MiB free in the arenas for the remaining 45 minutes (the driver's RSS +47%
by the soak's rule, with malloc's memory in use flat). `malloc_trim(0)` returns every free
page of every arena; it runs only when the free memory passes `TRIM_ABOVE_BYTES`. Reading
that is not free either (`mallinfo2` walks every free chunk: 25 ms on a heap with 150,000 of
them), so the engine looks at most every `TRIM_CHECK_S` seconds (FreeMemoryTrim).
"""

from __future__ import annotations

import ctypes
import functools
import time

TRIM_ABOVE_BYTES = 64 << 20
TRIM_CHECK_S = 30.0


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2  # glibc 2.33 and later
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # not glibc, or an older one
        return None
    return libc


def mallinfo() -> MallInfo2 | None:
    """glibc's counters over every arena (`uordblks` in use, `fordblks` free, `hblkhd`
    mapped apart); None where there is no glibc 2.33+."""
    libc = _libc()
    return None if libc is None else libc.mallinfo2()


def trim_free_memory(above_bytes: int = TRIM_ABOVE_BYTES) -> bool:
    """Give glibc's free memory back to the system if more than `above_bytes` is free;
    True if it did."""
    info = mallinfo()
    if info is None or info.fordblks <= above_bytes:
        return False
    _libc().malloc_trim(0)  # type: ignore[union-attr]
    return True


class FreeMemoryTrim:
    """trim_free_memory at most every `every_s` seconds: call it after each batch."""

    def __init__(self, every_s: float = TRIM_CHECK_S,
                 above_bytes: int = TRIM_ABOVE_BYTES) -> None:
        self.every_s = every_s
        self.above_bytes = above_bytes
        self._next = 0.0

    def __call__(self) -> bool:
        """True if it looked at glibc's free memory this time (and trimmed it if need be)."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.every_s
        trim_free_memory(self.above_bytes)
        return True
