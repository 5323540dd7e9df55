"""A graph batch's records per source, as its views read them: the last record per key
(None: tombstoned), the bad ones for the dead-letter topics, and every good event for the
stream aggregates that read the source.

They come as Python rows (fetched by the driver, engine.driver_fetch, or returned by
Spark's tasks, engine.task_read), or as the Arrow table of Spark's read. The table is read
column by column: a row dict per record, with every column of the batch, took 100 ms of a
20,000-record batch in the driver's interpreter, against 60 ms for the columns the views
use and a dict per event (measured on 2 cores). Bad records, rare, still become whole
rows: the dead-letter topic takes every column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.sources import record_key
from engine.task_read import EVENT, TopicLayout
from schema.arrow_rows import arrow_rows, column_rows

Row = dict[str, Any]


@dataclass
class SourceRecords:
    """One source's records in a batch: the last per key (None: tombstoned), the bad, and
    (for the stream aggregates that read it) every good one that is not a tombstone and
    that no task folded."""

    latest: dict[str, Row | None]
    bad: list[Row]
    events: list[Row] = field(default_factory=list)


# Per topic: where its records go, where they are in the batch, and whether a stream
# aggregate reads its events.
ByTopic = Mapping[str, tuple[SourceRecords, TopicLayout, bool]]


def take_rows(rows: Iterable[Row], by_topic: ByTopic, by_tasks: bool = False) -> None:
    """Add the batch's records given as rows (with the batch's columns) to their sources.
    `by_tasks`: the rows are what Spark's tasks returned, each flagged EVENT when its task
    handed its event over instead of folding it."""
    for row in rows:
        into, layout, stream = by_topic[row["_topic"]]
        # A task hands the driver its events only when it could not fold them.
        handed = by_tasks and row.pop(EVENT)
        if row["_error"] is not None:
            into.bad.append(row)
        else:
            _take_good(into, layout, stream and (handed or not by_tasks), row["_kafka_key"],
                       row["_tombstone"], row[layout.column])


def take_table(table: pa.Table, by_topic: ByTopic) -> None:
    """Add the records of Spark's read (its Arrow table) to their sources, as take_rows
    does with the same records as rows. Raises UnicodeDecodeError, before adding any, when
    a Kafka key is not UTF-8 (Spark's own rows decode it leniently)."""
    topics = table.column("_topic")
    read = []  # every column decoded first, so that a failure adds nothing
    for topic, (into, layout, stream) in by_topic.items():
        mine = table.filter(pc.equal(topics, topic))  # in the batch's order
        if mine.num_rows:
            read.append((into, layout, stream, mine, zip(
                mine.column("_kafka_key").to_pylist(),
                mine.column("_error").is_valid().to_pylist(),
                mine.column("_tombstone").to_pylist(),
                column_rows(mine.column(layout.column)), strict=True)))
    for into, layout, stream, mine, columns in read:
        bad_at = []
        for at, (key, bad, tombstone, value) in enumerate(columns):
            if bad:
                bad_at.append(at)
            else:
                _take_good(into, layout, stream, key, tombstone, value)
        if bad_at:
            into.bad.extend(arrow_rows(mine.take(pa.array(bad_at, pa.int64()))))


def _take_good(into: SourceRecords, layout: TopicLayout, keep_event: bool, kafka_key: str | None,
               tombstone: bool, value: Row | None) -> None:
    """One good record: a tombstone deletes its key, else its event becomes the key's row
    (a key lives in one partition, in order: the last record wins) and, with `keep_event`,
    one of the events the stream aggregates read."""
    if tombstone:
        into.latest[kafka_key] = None
        return
    event = layout.event(value)
    into.latest[record_key(kafka_key, event, layout.key)] = event
    if keep_event:
        into.events.append(event)
