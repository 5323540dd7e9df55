"""The `viewgate` command: sets up and runs the local stack, the engine and the gateway."""

import ctypes
import os
import sys

# Arrow allocates from mimalloc by default, and mimalloc kept what the engine's batches
# freed: in a 15-minute soak the driver's mimalloc arena grew 71 -> 208 MiB resident while
# Arrow held nothing between batches. jemalloc, which Arrow's Linux wheels carry too, hands
# freed pages back on a timer. Chosen here, before pyarrow loads (Arrow reads the variable
# once, at import); the processes viewgate starts (Spark's JVM and its Python workers, the
# gateway) inherit it. A user's own choice wins.
if sys.platform == "linux":
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

# glibc's malloc raises its mmap threshold to the size of each large block freed (up to
# 32 MiB); blocks of that size then come from its arenas, and stay there when freed. In the
# engine's hour-long soak the driver's arenas kept 44-267 MiB of freed memory that way
# (NumPy's and Python's buffers of a few MiB, a batch at a time). A fixed threshold turns
# that off: blocks of 1 MiB and more are mapped on their own and given back when freed.
# glibc reads the variable at a process's start (the processes viewgate starts); mallopt
# sets it for this one. A user's own value wins.
_M_MMAP_THRESHOLD = -3  # malloc.h


def _fix_mmap_threshold() -> None:
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    try:
        threshold = int(os.environ["MALLOC_MMAP_THRESHOLD_"])
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, threshold)
    except (ValueError, OSError, AttributeError):  # not a number, or not glibc
        pass


if sys.platform == "linux":
    _fix_mmap_threshold()
