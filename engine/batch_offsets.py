"""What one micro-batch covers, read from its query's checkpoint: the Kafka end offsets
and the event-time watermark Spark wrote ahead of running the batch (`offsets/<batch id>`).

foreachBatch is not told them; reading them here lets a commit record them atomically with
its rows in Redis and in its Delta commit, instead of after the fact.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field

from schema.object_store import read_text


@dataclass(frozen=True)
class BatchOffsets:
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)  # topic->partition->end
    watermark: str = ""  # ISO-8601 UTC, "" when the view has no watermark


def read_batch_offsets(checkpoint: str, batch_id: int) -> BatchOffsets | None:
    """None when the checkpoint lacks the batch. On a local disk or in a bucket."""
    text = read_text(f"{checkpoint.rstrip('/')}/offsets/{batch_id}")
    if text is None:
        return None
    lines = text.splitlines()
    # Line 1 is the log version, line 2 the batch metadata, then one line per source.
    watermark_ms = json.loads(lines[1]).get("batchWatermarkMs", 0) if len(lines) > 1 else 0
    offsets: dict[str, dict[str, int]] = {}
    for line in lines[2:]:
        if line.startswith("{"):
            for topic, partitions in json.loads(line).items():
                offsets.setdefault(topic, {}).update(partitions)
    watermark = ""
    if watermark_ms:
        moment = datetime.datetime.fromtimestamp(watermark_ms / 1000, datetime.UTC)
        watermark = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{watermark_ms % 1000:03d}Z"
    return BatchOffsets(offsets, watermark)


def read_initial_offsets(checkpoint: str) -> dict[str, dict[str, int]] | None:
    """Where the query's first batch starts (topic -> partition -> offset): the offsets the
    Kafka source resolved `startingOffsets` to and wrote ahead of that batch
    (`sources/0/0`: a zero byte, `v1`, the offsets' JSON). None when the checkpoint lacks
    them or holds no plain offsets there."""
    text = read_text(f"{checkpoint.rstrip('/')}/sources/0/0")
    if text is None:
        return None
    lines = text.lstrip("\0").splitlines()
    if len(lines) < 2 or lines[0] != "v1":
        return None
    offsets = json.loads(lines[1])
    if not all(isinstance(o, int) and o >= 0 for parts in offsets.values()
               for o in parts.values()):
        return None  # Spark's markers for "earliest" and "latest" (-2, -1), not offsets
    return offsets


def records_between(previous: dict[str, dict[str, int]] | None,
                    ends: dict[str, dict[str, int]]) -> int | None:
    """How many Kafka records a batch covers: its end offsets less the previous batch's
    (topic -> partition -> offset). None when a partition's start is unknown (the first
    batch, or a partition the previous batch did not have). Compacted topics have gaps, so
    this is an upper bound."""
    if previous is None:
        return None
    total = 0
    for topic, partitions in ends.items():
        for partition, end in partitions.items():
            start = previous.get(topic, {}).get(partition)
            if start is None:
                return None
            total += end - start
    return total
