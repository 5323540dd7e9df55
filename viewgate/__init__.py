"""The `viewgate` command: sets up and runs the local stack, the engine and the gateway."""

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
