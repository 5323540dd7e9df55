"""The graph batches' records fetched and classified one batch ahead, in a process of their
own.

engine.driver_fetch reads a batch's records once Spark has called the batch: on the
batch's critical path, in the driver's one interpreter, which is what limits the engine's
throughput (held for about two thirds of a batch while a third of the host's two cores
sits idle: docs/engine-plan.md). This process reads on from where the last batch ended
while the driver computes and commits that batch, and classifies each record with the
same code (engine.driver_fetch.SourceReader), so that the next batch finds its records
read: the driver only unpickles them.

A batch's answer is exactly DriverFetch.read's: the records of the batch's offsets, per
partition in offset order, or None when Spark must read them (a record the driver does not
read as Spark does, more than max_records records, a fetch that failed or took too long).
The process holds nothing that matters to exactly once: a batch's offsets come from Spark's
checkpoint, and a process that dies only sends batches to Spark's read.
"""

from __future__ import annotations

import bisect
import logging
import multiprocessing
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from engine.collector import keep_collector_out_of_batches
from engine.driver_fetch import FETCH_DEADLINE_S, DriverFetch, Offsets, Row, spark_orders
from engine.driver_sql import OutsideSubset
from schema.catalog import Source
from schema.settings import Settings

log = logging.getLogger("viewgate.engine.read_ahead")

Partition = tuple[str, int]  # topic, partition
_CONSUME_WAIT_S = 0.1  # the reader's longest wait for records; it holds no interpreter


class ReadAhead:
    """The driver's side: each batch's records from the read-ahead process (read), with
    DriverFetch.read's answers."""

    def __init__(self, bootstrap: str, sources: Sequence[Source], max_records: int) -> None:
        context = multiprocessing.get_context("spawn")  # the driver holds a JVM: no fork
        self._conn, theirs = context.Pipe()
        self._process = context.Process(target=_serve, name="viewgate-read-ahead",
                                        args=(theirs, bootstrap, list(sources), max_records),
                                        daemon=True)  # ends with the driver
        self._process.start()
        theirs.close()
        self._lock = threading.Lock()  # one batch's question and answer at a time

    @classmethod
    def for_settings(cls, settings: Settings, fetch: DriverFetch | None) -> ReadAhead | None:
        """The read ahead of the driver's `fetch` (DriverFetch.for_settings); None when
        that is off, the read ahead is (engine_read_ahead), or this process may not start
        one."""
        if fetch is None or not settings.engine_read_ahead:
            return None
        if multiprocessing.current_process().daemon:
            # A daemonic process may not start one (an engine run by a worker of the
            # bench's): the driver fetches the batches itself.
            log.info("no read ahead in a daemonic process: the driver fetches the batches")
            return None
        return cls(fetch.bootstrap, fetch.sources, fetch.max_records)

    def read(self, starts: Offsets | None, ends: Offsets | None) -> list[Row] | None:
        """The records from `starts` to `ends`, as DriverFetch.read gives them."""
        with self._lock:
            try:
                self._conn.send((starts, ends))
                chunks = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError) as e:  # the process is gone: Spark reads
                log.warning("the read-ahead process is gone (%s); Spark reads the batch", e)
                return None
        if chunks is None:
            return None
        rows: list[Row] = []
        for chunk in chunks:
            rows += pickle.loads(chunk)
        return rows

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def close(self) -> None:
        self._conn.close()  # the process ends when its pipe does
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def _serve(conn: Any, bootstrap: str, sources: list[Source], max_records: int) -> None:
    """The read-ahead process: answers each batch's question until the driver's end of
    the pipe closes (the driver stopped, or died)."""
    keep_collector_out_of_batches()  # its rows live until pickled, as a batch's do
    ahead = _Ahead(DriverFetch(bootstrap, sources, max_records))
    try:
        while True:
            starts, ends = conn.recv()
            conn.send_bytes(ahead.batch(starts, ends))
    except (EOFError, OSError):
        pass
    # At once: nothing here needs flushing, and the reader thread may be in librdkafka.
    os._exit(0)


@dataclass
class _Chunk:
    """Records of one partition read together: their offsets and their rows, pickled by the
    reader ahead of the batch that takes them (a row None: a record Spark must classify)."""

    offsets: list[int]
    data: bytes
    refused: bool  # a record Spark must classify
    keyless: bool  # a good record without a Kafka key

    @classmethod
    def of(cls, offsets: list[int], rows: list[Row | None]) -> _Chunk:
        return cls(offsets, pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL),
                   any(row is None for row in rows),
                   any(row is not None and row["_kafka_key"] is None and row["_error"] is None
                       for row in rows))

    def split(self, offset: int) -> tuple[_Chunk | None, _Chunk | None]:
        """Its records below `offset`, and from it."""
        cut = bisect.bisect_left(self.offsets, offset)
        if cut == len(self.offsets):
            return self, None
        if cut == 0:
            return None, self
        rows = pickle.loads(self.data)
        return (_Chunk.of(self.offsets[:cut], rows[:cut]),
                _Chunk.of(self.offsets[cut:], rows[cut:]))


class _Ahead:
    """A consumer read by one thread into chunks per partition, from where the last batch
    ended; batch() takes a batch's chunks from them."""

    def __init__(self, fetch: DriverFetch) -> None:
        self.fetch = fetch
        self.changed = threading.Condition()
        # Under `changed`: per partition, where its records start (the last batch's end),
        # the next offset not read yet (records below it are all in `chunks`, or compacted
        # away), and its chunks in offset order; `failed` partitions' fetch failed.
        self.origin: dict[Partition, int] = {}
        self.reached: dict[Partition, int] = {}
        self.chunks: dict[Partition, deque[_Chunk]] = {}
        self.failed: set[Partition] = set()
        self.buffered = 0
        self.assign: dict[Partition, int] | None = None  # asked of the reader, not made yet
        self.waiting = False  # a batch waits for records: the reader reads past its limit
        threading.Thread(target=self._read, name="read-ahead", daemon=True).start()

    def batch(self, starts: Offsets | None, ends: Offsets | None) -> bytes:
        """The batch's answer, pickled: its rows' chunks in order, or None (Spark reads it)."""
        with self.changed:
            return pickle.dumps(self._answer(starts, ends), protocol=pickle.HIGHEST_PROTOCOL)

    def _answer(self, starts: Offsets | None, ends: Offsets | None) -> list[bytes] | None:
        """batch()'s answer (under `changed`)."""
        if ends is None:
            return None
        ranges = self.fetch.ranges(starts, ends)
        wanted = {(t, int(p)): o for t, partitions in (starts or {}).items()
                  for p, o in partitions.items()}
        if ranges is None:  # not the driver's to fetch: read on from its end
            self._assign(ends)
            return None
        if any(self.origin.get(tp) != o for tp, o in wanted.items()):
            self._assign(starts)  # not read from here (the first batch, a new partition)
        deadline = time.monotonic() + FETCH_DEADLINE_S
        self.waiting = True
        self.changed.notify_all()  # a reader at its limit reads on
        try:
            while self.assign is not None or not all(
                    self.reached.get((t, p), -1) >= end or (t, p) in self.failed
                    for t, p, _, end in ranges):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("batch not read in %s s, left to Spark", FETCH_DEADLINE_S)
                    self._assign(ends)
                    return None
                self.changed.wait(left)
        finally:
            self.waiting = False
        taken = {(t, p): self._take((t, p), end) for t, p, _, end in ranges}
        self.origin = {(t, int(p)): o for t, partitions in ends.items()
                       for p, o in partitions.items()}
        if set(self.origin) != set(self.reached) or self.failed:
            self._assign(ends)  # a partition new, or one whose fetch failed
        self.changed.notify_all()  # room for the reader again
        chunks = [c for tp in sorted(taken) for c in taken[tp]]  # DriverFetch.read's order
        if any(tp in self.failed for tp in taken) or any(c.refused for c in chunks):
            return None
        if spark_orders(len(taken), any(c.keyless for c in chunks)):
            return None
        return [c.data for c in chunks]

    def _take(self, tp: Partition, end: int) -> list[_Chunk]:
        """The partition's chunks of records below `end`, removed from `chunks`."""
        chunks, taken = self.chunks[tp], []
        while chunks and chunks[0].offsets[0] < end:
            below, above = chunks[0].split(end)
            taken.append(below)
            if above is None:
                chunks.popleft()
            else:
                chunks[0] = above
        self.buffered -= sum(len(c.offsets) for c in taken)
        return taken

    def _assign(self, offsets: Offsets) -> None:
        """Ask the reader to read from `offsets` instead (under `changed`); the state is
        the new assignment's once `assign` is None again."""
        self.assign = {(t, int(p)): o for t, partitions in offsets.items()
                       for p, o in partitions.items()}
        self.origin = dict(self.assign)
        self.changed.notify_all()

    def _read(self) -> None:
        """The reader thread, the consumer's only user."""
        consumer = self.fetch.consumer()
        while True:
            with self.changed:
                while self.assign is None and (not self.reached or (
                        self.buffered >= self.fetch.max_records and not self.waiting)):
                    self.changed.wait()
                if self.assign is not None:
                    offsets, self.assign = self.assign, None
                    consumer.assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
                    self.reached = dict(offsets)
                    self.chunks = {tp: deque() for tp in offsets}
                    self.failed = set()
                    self.buffered = 0
                    self.changed.notify_all()
                    continue
            # What is there already; else the next message as soon as it comes (consume
            # with a timeout would wait for all 1,000 or the whole timeout).
            messages = consumer.consume(1000, 0)
            if not messages:
                message = consumer.poll(_CONSUME_WAIT_S)
                messages = [message] if message is not None else []
            ends, failed, chunks = self._chunks(messages)
            with self.changed:
                if self.assign is not None:
                    continue  # read for an assignment about to go
                for tp, chunk in chunks.items():
                    if tp not in self.reached:
                        continue  # of an earlier assignment
                    _, chunk = chunk.split(self.reached[tp])  # nothing read twice
                    if chunk is not None:
                        self.chunks[tp].append(chunk)
                        self.reached[tp] = chunk.offsets[-1] + 1
                        self.buffered += len(chunk.offsets)
                for tp, offset in ends.items():  # after the records before them
                    if tp in self.reached:
                        self.reached[tp] = max(self.reached[tp], offset)
                self.failed |= failed & set(self.reached)
                self.changed.notify_all()

    def _chunks(self, messages: list[Any]
                ) -> tuple[dict[Partition, int], set[Partition], dict[Partition, _Chunk]]:
        """The messages classified and pickled per partition; with the ends of partitions
        reached and the partitions whose fetch failed."""
        ends: dict[Partition, int] = {}
        failed: set[Partition] = set()
        read: dict[Partition, tuple[list[int], list[Row | None]]] = {}
        for message in messages:
            tp = (message.topic(), message.partition())
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    ends[tp] = message.offset()
                else:
                    log.warning("read ahead of %s failed: %s", tp, error)
                    failed.add(tp)
                continue
            offsets, rows = read.setdefault(tp, ([], []))
            offset = message.offset()
            try:
                row = self.fetch.readers[tp[0]].row(tp[0], tp[1], offset, message.key(),
                                                    message.value())
            except OutsideSubset:
                row = None
            offsets.append(offset)
            rows.append(row)
        return ends, failed, {tp: _Chunk.of(*read[tp]) for tp in read}
