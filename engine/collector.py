"""The cyclic garbage collector, kept out of the batches' way.

A batch's rows (dicts, lists and tuples: hundreds of thousands of objects in a batch of
20,000 events) live until the batch ends, then go by reference counting: they hold no
cycles. With CPython's thresholds (700, 10, 10) they were promoted to the oldest
generation while the batch ran, and a full collection ran each time that grew by a
quarter, walking every row the batch held and everything start-up built: in the bench's
throughput run, 48 full passes over 19 batches, 3.6 s of the run's 33 s (docs/engine-plan.md,
"The garbage collector's full passes").
"""

from __future__ import annotations

import gc

# A young collection every 10,000 new objects, a middle one every 10 young ones and a
# full one at most every 100 middle ones: a full pass every few dozen large batches, not a
# few in each. Cycles we do not make (exceptions' frames, py4j's proxies) wait longer.
GC_THRESHOLDS = (10_000, 10, 100)


def keep_collector_out_of_batches() -> None:
    """Called as a query starts (engine.graph, engine.views), before its first batch.

    Start-up's objects are not frozen (gc.freeze), as the gateway's are: a query replaced
    by a rebuild or a restart leaves its objects once py4j lets go of its batch function,
    and a frozen cycle would never be collected. A full pass over them every few dozen
    batches costs little."""
    gc.set_threshold(*GC_THRESHOLDS)
