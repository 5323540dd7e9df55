"""The cyclic garbage collector, kept out of the batches' way.

A batch's rows (dicts, lists and tuples: hundreds of thousands of objects in a batch of
20,000 events) live until the batch ends, then go by reference counting: they hold no
cycles. With CPython's thresholds (700, 10, 10) they were promoted to the oldest
generation while the batch ran, and a full collection ran each time that grew by a
quarter, walking every row the batch held and everything start-up built: in the bench's
throughput run, 48 full passes over 19 batches, 3.6 s of the run's 33 s (docs/engine-plan.md,
"The garbage collector's full passes"). The gateway tunes its collector the same way, for
its own reasons (gateway/app.py).
"""

from __future__ import annotations

import gc

# A young collection every 10,000 new objects, a middle one every 10 young ones and a
# full one at most every 100 middle ones: a full pass every few large batches, not a few
# in each. Cycles we do not make (exceptions' frames, py4j's proxies) wait a little longer.
GC_THRESHOLDS = (10_000, 10, 100)


def keep_collector_out_of_batches() -> None:
    """Called as a query starts (engine.graph, engine.views), before its first batch: what
    the engine built so far (modules, the Spark session's proxies, the views' plans) lives
    as long as the process, so it leaves the collector's passes (gc.freeze), and the
    thresholds above replace CPython's.

    A query started again in the same process (a rebuild's new generation) first frees
    what the process froze before and no longer uses: a query it replaced may have left
    cycles only a full collection frees, and a frozen object is never collected. That
    collection is one pass over the process's objects (about 70 ms over 150,000)."""
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
