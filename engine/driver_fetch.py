"""A batch's records fetched straight from Kafka, with no Spark job: by the driver, or a
batch ahead by a process of their own (engine.read_ahead, which reads with this module).

Spark reads a batch in a job of its own, and a job costs about 110 ms on this project's
two cores whatever its size (docs/engine-plan.md): of a live batch's 500 records' read
(126 ms at the median), nearly all. The driver knows the batch's records without that job:
they are the offsets from the previous batch's end (for a query's first batch, where its
source's starting offsets were resolved to) to this batch's end, all in the query's
checkpoint (engine.batch_offsets), which Spark wrote ahead of the batch. So for a batch of
up to `engine_driver_fetch_max_records` records those offsets are fetched with a Kafka
consumer and each record is classified as engine.sources does in Spark.

Both paths must give the same rows, since a replayed batch may take the other one: the
same rows, in the same order within a partition. (Across partitions Spark's order is its
own, which matters only to records without a Kafka key, so a batch with such records in
several partitions goes to Spark.) Spark's `from_json` is more lenient than JSON (single
quotes, NaN, a number read as text) and has rules of its own for times and numbers, so the
driver accepts only records it reads the way Spark does: each value a JSON object whose
fields hold JSON of exactly their column's type (text for STRING, an integer in range for
INT and BIGINT, a finite number for DOUBLE, a boolean, an ISO-8601 time with its zone for
TIMESTAMP), or null. A record outside that (malformed JSON, a wrong type, a key that is
not UTF-8, ...) hands the whole batch back to Spark's read, whose classification decides,
as does a source with a column of another type. tests/integration/test_driver_fetch.py
holds both paths' rows equal.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from engine.batch_offsets import records_between
from engine.driver_sql import OutsideSubset  # here: a record Spark must classify
from engine.sources import CORRUPT, FETCH_MAX_WAIT_MS, value_column
from schema.arrow_rows import UTC_EPOCH
from schema.catalog import Source, parse_ddl
from schema.settings import Settings

log = logging.getLogger("viewgate.engine.driver_fetch")

Row = dict[str, Any]
Offsets = Mapping[str, Mapping[str, int]]  # topic -> partition (as text) -> offset

# How long a batch's fetch may take before the batch goes to Spark's read instead.
FETCH_DEADLINE_S = 5.0

_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
# Spark reads an ISO-8601 time with a zone the same way; other forms it reads its own way.
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-](0\d|1[0-4]):[0-5]\d)",
                   re.ASCII)  # ASCII digits only
_SURROGATES = re.compile("[\ud800-\udfff]")
# Spark settings under which from_json may read a record otherwise than the driver.
_CHANGES_PARSING = re.compile(r"timeParserPolicy|json|timestamp|ansi|caseSensitive",
                              re.IGNORECASE)


class _Pairs(list):
    """A JSON object's fields in their order, duplicates kept (a JSON array is a list)."""


def _no_constant(name: str) -> Any:
    raise OutsideSubset(f"JSON constant {name}")


class _NotPlain(Exception):
    """A record SourceReader._plain cannot vouch for: _DECODER reads it."""


_BEYOND_64_BITS = 2.0**63

# Made once: json.loads with a hook builds a decoder per call (20,000 records decoded in
# 118 ms that way, in 55 ms by one decoder).
_DECODER = json.JSONDecoder(object_pairs_hook=_Pairs, parse_constant=_no_constant)


def _text(value: Any) -> str:
    if not isinstance(value, str) or _SURROGATES.search(value):
        raise OutsideSubset("not text")
    return value


def _plain_double(value: Any) -> float:
    # orjson reads an integer beyond 64 bits as a float, which Python's json reads as an
    # int (left to Spark by _double): a float that large may be one, so it goes the slow way.
    if type(value) is float and abs(value) >= _BEYOND_64_BITS:
        raise _NotPlain
    return _double(value)


def _integer(kind: str) -> Any:
    low, high = _INT_RANGE[kind]

    def parse(value: Any) -> int:
        if type(value) is not int or not low <= value <= high:
            raise OutsideSubset(f"not {kind}")
        return value
    return parse


def _double(value: Any) -> float:
    # An integer beyond 2**53 is rounded by Java and Python alike, but left to Spark.
    if type(value) is int and abs(value) <= 2**53:
        return float(value)
    if type(value) is float and math.isfinite(value):
        return value
    raise OutsideSubset("not double")


def _boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise OutsideSubset("not boolean")
    return value


def _timestamp(value: Any) -> datetime.datetime:
    if not isinstance(value, str) or not _TIME.fullmatch(value):
        raise OutsideSubset("not an ISO-8601 time with its zone")
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError as e:  # a 31st of February
        raise OutsideSubset(str(e)) from None
    # As schema.arrow_rows makes Spark's times: UTC, the same tzinfo.
    return UTC_EPOCH + (moment - UTC_EPOCH)


# Spark's DDL names of the types read here (INTEGER and LONG are INT's and BIGINT's).
_PARSERS = {"string": _text, "int": _integer("int"), "integer": _integer("int"),
            "bigint": _integer("bigint"), "long": _integer("bigint"), "double": _double,
            "boolean": _boolean, "timestamp": _timestamp}


class SourceReader:
    """Classifies one source's records as engine.sources.classify_sources does."""

    def __init__(self, source: Source, index: int, count: int) -> None:
        self.source = source
        self.column = value_column(index)
        self.others = {value_column(i): None for i in range(count) if i != index}
        columns = parse_ddl(source.schema)
        unknown = sorted({t for t in columns.values() if t not in _PARSERS})
        if unknown:
            raise ValueError(f"source {source.name} has columns of {', '.join(unknown)}")
        self.parsers = {name: _PARSERS[kind] for name, kind in columns.items()}
        # For SourceReader._plain: the text columns are only checked, the others parsed,
        # each with whether its JSON is text (a time) or not.
        self.texts = [name for name, kind in columns.items() if kind == "string"]
        self.converted = [(name, _plain_double if kind == "double" else _PARSERS[kind],
                           kind == "timestamp")
                          for name, kind in columns.items() if kind != "string"]
        self.folded = {name.lower(): name for name in columns}

    def row(self, topic: str, partition: int, offset: int, key: bytes | None,
            value: bytes | None) -> Row:
        """The record as the batch's row; OutsideSubset if Spark must classify it."""
        try:
            text_key = None if key is None else key.decode()
        except UnicodeDecodeError:
            raise OutsideSubset("a key that is not UTF-8") from None
        row: Row = {"_kafka_key": text_key, "_raw": None, "_topic": topic,
                    "_partition": partition, "_offset": offset,
                    "_tombstone": value is None, "_error": None}
        error, parsed = self._classify(text_key, value)
        if error is not None:
            row["_raw"] = value
            row["_error"] = error
        row.update(self.others)
        row[self.column] = parsed
        return row

    def _classify(self, key: str | None, value: bytes | None) -> tuple[str | None, Row | None]:
        source = self.source
        if value is None:
            return ("tombstone without a key" if key is None else None), None
        if len(value) > source.max_record_bytes:
            # Spark parses an oversized record all the same, and its row carries the value.
            error = f"oversized record: {len(value)} bytes > {source.max_record_bytes}"
            return error, self._parsed(value)
        parsed = self._parsed(value)
        if parsed[source.key] is None:
            return f"missing key field {source.key}", parsed
        if source.event_time and parsed[source.event_time] is None:
            return f"missing event time field {source.event_time}", parsed
        return None, parsed

    def _parsed(self, value: bytes) -> Row:
        try:
            return self._plain(value)
        except _NotPlain:
            pass
        try:
            pairs = _DECODER.decode(value.decode())
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise OutsideSubset("not JSON as Spark reads it") from None
        if not isinstance(pairs, _Pairs):
            raise OutsideSubset("not a JSON object")
        fields = dict(pairs)
        if len(fields) != len(pairs):
            raise OutsideSubset("a field given twice")
        return self._columns(fields)

    def _plain(self, value: bytes) -> Row:
        """The record read by orjson, when that reading is certainly _DECODER's: a JSON
        object without escapes whose fields are all columns, given once each. Else
        _NotPlain. (19,424 demo orders parsed in 108 ms with _DECODER, 81 ms this way,
        on a quiet host: orjson's own part is 17 ms, the columns' checks the rest.)"""
        if b"\\" in value:
            raise _NotPlain
        try:
            fields = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise _NotPlain from None  # _DECODER says why, or reads what orjson does not
        if type(fields) is not dict or not fields.keys() <= self.parsers.keys():
            raise _NotPlain  # fields that are no column: _columns' rules
        parsed: Row = dict.fromkeys(self.parsers)
        parsed.update(fields)
        texts = 0  # the record's values that are JSON text
        for name in self.texts:  # valid UTF-8 without escapes: no lone surrogate
            text = parsed[name]
            if text is not None:
                if type(text) is not str:
                    raise OutsideSubset("not text")
                texts += 1
        for name, parse, quoted in self.converted:
            field_value = parsed[name]
            if field_value is not None:
                parsed[name] = parse(field_value)
                texts += quoted
        # Without escapes every '"' opens or closes a key or a text. Quotes beyond the
        # fields' and texts' own are keys orjson dropped: a field given twice (orjson keeps
        # the last; Spark reads it its own way) or a nested one.
        if value.count(b'"') != 2 * (len(fields) + texts):
            raise _NotPlain
        parsed[CORRUPT] = None
        return parsed

    def _columns(self, fields: dict[str, Any]) -> Row:
        parsed: Row = dict.fromkeys(self.parsers)
        for name, field_value in fields.items():
            parse = self.parsers.get(name)
            if parse is None:
                # Spark skips fields it does not know; one that differs from a column only
                # in case, or its own corrupt-record column, is left to Spark.
                if name.lower() in self.folded or name == CORRUPT:
                    raise OutsideSubset(f"field {name}")
                continue
            if field_value is not None:
                parsed[name] = parse(field_value)
        parsed[CORRUPT] = None
        return parsed


def spark_orders(partitions: int, keyless: bool) -> bool:
    """Whether a batch's order across its partitions is Spark's to give: a record without
    a Kafka key is deduplicated by its value's key field, which may be in several
    partitions, when the batch has records in more than one."""
    return keyless and partitions > 1


class DriverFetch:
    """Reads a batch's records from Kafka in the driver, as the graph query's batch rows
    (engine.sources.classify_sources' columns), or says that Spark must."""

    def __init__(self, bootstrap: str, sources: Sequence[Source], max_records: int) -> None:
        self.bootstrap = bootstrap
        self.sources = list(sources)
        self.max_records = max_records
        self.readers = {s.topic: SourceReader(s, i, len(sources)) for i, s in enumerate(sources)}
        self._consumer: Consumer | None = None

    @classmethod
    def for_settings(cls, settings: Settings, sources: Sequence[Source]) -> DriverFetch | None:
        """None when it is off (engine_driver_fetch_max_records 0), when Spark's own
        settings change how it reads JSON or times, or when a source has a column of a
        type the driver does not read."""
        if settings.engine_driver_fetch_max_records <= 0:
            return None
        changed = sorted(k for k in settings.spark_conf if _CHANGES_PARSING.search(k))
        if changed:
            log.info("every batch is read by Spark, whose settings %s change its parsing",
                     ", ".join(changed))
            return None
        try:
            return cls(settings.kafka_bootstrap, sources, settings.engine_driver_fetch_max_records)
        except ValueError as e:
            log.info("every batch is read by Spark: %s", e)
            return None

    def read(self, starts: Offsets | None, ends: Offsets | None) -> list[Row] | None:
        """The records from `starts` to `ends` (end offsets excluded), partition by
        partition in offset order; None when Spark must read them: a start unknown, more
        than max_records records, or a record outside what the driver reads as Spark does."""
        ranges = self.ranges(starts, ends)
        if ranges is None:
            return None
        try:
            return self._fetch(ranges)
        except OutsideSubset as e:
            log.debug("batch left to Spark's read: %s", e)
            return None

    def ranges(self, starts: Offsets | None, ends: Offsets | None
               ) -> list[tuple[str, int, int, int]] | None:
        """(topic, partition, start, end) of each partition with records in the batch,
        or None when the driver does not fetch it (a start unknown, too many records)."""
        if ends is None or set(ends) - set(self.readers):
            return None
        # None when a start is unknown: the first batch, or a partition new since the last.
        count = records_between(starts, ends)
        if count is None or count > self.max_records:
            return None
        return [(topic, int(partition), starts[topic][partition], end)
                for topic, partitions in sorted(ends.items())
                for partition, end in sorted(partitions.items(), key=lambda p: int(p[0]))
                if end > starts[topic][partition]]

    def _fetch(self, ranges: list[tuple[str, int, int, int]]) -> list[Row]:
        consumer = self.consumer()
        consumer.assign([TopicPartition(t, p, start) for t, p, start, _ in ranges])
        try:
            return self._consumed(consumer, ranges)
        finally:
            consumer.unassign()  # no fetching ahead of the next batch, which may be Spark's

    def _consumed(self, consumer: Consumer, ranges: list[tuple[str, int, int, int]]
                  ) -> list[Row]:
        ends = {(t, p): end for t, p, _, end in ranges}
        got: dict[tuple[str, int], list[Row]] = {tp: [] for tp in ends}
        keyless: set[tuple[str, int]] = set()
        deadline = time.monotonic() + FETCH_DEADLINE_S
        while ends:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("fetch not done in %s s, left to Spark: %s", FETCH_DEADLINE_S,
                            sorted(ends))
                raise OutsideSubset("fetch too slow")
            # What is there already; else the next message as soon as it comes (consume
            # with a timeout would wait for all 1,000 or the whole timeout).
            messages = consumer.consume(1000, 0)
            if not messages:
                message = consumer.poll(min(left, 0.1))
                messages = [message] if message is not None else []
            for message in messages:
                where = (message.topic(), message.partition())
                end = ends.get(where)
                if end is None:
                    continue  # a partition done, or a message of the last assignment
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        del ends[where]  # the rest of the range was compacted away
                        continue
                    log.warning("fetch of %s failed, left to Spark: %s", where, error)
                    raise OutsideSubset(f"fetch of {where}: {error}")
                offset = message.offset()
                if offset >= end:
                    del ends[where]
                    continue
                row = self.readers[where[0]].row(where[0], where[1], offset, message.key(),
                                                 message.value())
                if row["_kafka_key"] is None and row["_error"] is None:
                    keyless.add(where)
                got[where].append(row)
                if offset == end - 1:
                    del ends[where]
        if spark_orders(len(got), bool(keyless)):
            raise OutsideSubset("records without a Kafka key in a batch of several partitions")
        return [row for where in sorted(got) for row in got[where]]

    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                "bootstrap.servers": self.bootstrap,
                "group.id": "viewgate-engine-driver-fetch",  # required; nothing is committed
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # As Spark's Kafka source reads: every record, also of open transactions.
                "isolation.level": "read_uncommitted",
                "auto.offset.reset": "error",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": FETCH_MAX_WAIT_MS,  # as Spark's read waits
            })
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
