"""The driver's read of a batch (engine.driver_fetch) gives the rows Spark's read gives, or
hands the batch to Spark: every record below goes through both, over a real broker, and
Spark's classification (engine.sources.classify_sources) is the reference. The read ahead
(engine.read_ahead: the same reading, in a process of its own, a batch ahead) gives the
same answers: the tests run with both."""

from __future__ import annotations

import multiprocessing

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from engine.driver_fetch import DriverFetch
from engine.frames import rows_of
from engine.read_ahead import ReadAhead
from engine.rebuild import log_range
from engine.sources import classify_sources
from schema.catalog import Source

pytestmark = pytest.mark.integration

SCHEMA = "id STRING, n INT, big BIGINT, x DOUBLE, flag BOOLEAN, ts TIMESTAMP"
TS = '"2024-03-01T10:00:00.123Z"'


def _record(**fields: str) -> bytes:
    """A JSON object from fields already in JSON form (so that the tests control the text)."""
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}").encode()


# Records the driver reads itself, each as Spark does.
INSIDE: list[tuple[bytes | None, bytes | None]] = [
    (b"a", _record(id='"a"', n="1", big="9007199254740993", x="2.5", flag="true", ts=TS)),
    (b"b", _record(id='"b"', n="-2147483648", big="-9223372036854775808", x="3",
                   flag="false", ts='"2024-03-01T10:00:00Z"')),
    (b"c", _record(id='"c"', n="2147483647", big="9223372036854775807", x="-0.0",
                   ts='"2024-03-01T12:30:00.5+02:30"')),
    (b"d", _record(id='"d"', x="1e-320", ts='"1999-12-31T23:59:59.999999-08:00"')),
    (b"e", _record(id='"e"', x="0.1", ts='"2024-02-29T00:00:00+00:00"')),
    (b"f", _record(id='"f \\u00e9 \\ud83d\\ude00 \\" \\\\ \\n"', x="1.7976931348623157e308",
                   ts=TS)),
    (b"g", '{"id": "g", "ts": %s, "naïve": "caf\u00e9 \U0001f600"}'.encode() % TS.encode()),
    (b"h", _record(id='"h"', n="null", x="null", ts=TS, extra='{"nested": [1, {"a": 2}]}')),
    (b"i", _record(id='"i"', ts=TS, other='"x"', more="[1, 2, 3]")),
    (b"j", b'  {"id": "j", "ts": ' + TS.encode() + b"}\n"),
    (b"k", _record(n="5", ts=TS)),  # missing key field
    (b"l", _record(id="null", ts=TS)),  # null key field
    (b"m", _record(id='"m"')),  # missing event time
    (b"n", _record(id='"n"', ts=TS, pad='"' + "x" * 400 + '"')),  # oversized
    (b"a", None),  # a tombstone
    (None, None),  # a tombstone without a key
    (b"o", b"{}"),
]

# Records that send the batch to Spark: Spark reads each its own way (or calls it
# malformed), which the driver does not imitate.
OUTSIDE: dict[str, tuple[bytes | None, bytes]] = {
    "single quotes": (b"q", b"{'id': 'q', 'ts': '2024-03-01T10:00:00Z'}"),
    "NaN": (b"q", _record(id='"q"', x="NaN", ts=TS)),
    "a number as text": (b"q", _record(id="12", ts=TS)),
    "text as a number": (b"q", _record(id='"q"', n='"12"', ts=TS)),
    "a fraction for an INT": (b"q", _record(id='"q"', n="1.0", ts=TS)),
    "an INT out of range": (b"q", _record(id='"q"', n="2147483648", ts=TS)),
    "a BIGINT out of range": (b"q", _record(id='"q"', big="9223372036854775808", ts=TS)),
    "a DOUBLE past 2**53 as an integer": (b"q", _record(id='"q"', x="9007199254740993", ts=TS)),
    "a DOUBLE past its range": (b"q", _record(id='"q"', x="1e400", ts=TS)),
    "a number as a BOOLEAN": (b"q", _record(id='"q"', flag="1", ts=TS)),
    "a time without a zone": (b"q", _record(id='"q"', ts='"2024-03-01T10:00:00"')),
    "a date as a time": (b"q", _record(id='"q"', ts='"2024-03-01"')),
    "a number as a time": (b"q", _record(id='"q"', ts="1709287200")),
    "nanoseconds": (b"q", _record(id='"q"', ts='"2024-03-01T10:00:00.123456789Z"')),
    "a 30th of February": (b"q", _record(id='"q"', ts='"2024-02-30T10:00:00Z"')),
    "digits that are not ASCII in a time": (
        b"q", _record(id='"q"', ts='"\uff12\uff10\uff12\uff14-03-01T10:00:00Z"')),
    "a field twice": (b"q", b'{"id": "q", "id": "r", "ts": ' + TS.encode() + b"}"),
    "a field in another case": (b"q", _record(id='"q"', ID='"r"', ts=TS)),
    "the corrupt-record field": (b"q", _record(id='"q"', _corrupt='"x"', ts=TS)),
    "a lone surrogate": (b"q", _record(id='"\\ud800"', ts=TS)),
    "an array": (b"q", b"[1, 2]"),
    "JSON null": (b"q", b"null"),
    "empty": (b"q", b""),
    "text after the object": (b"q", _record(id='"q"', ts=TS) + b" tail"),
    "a byte order mark": (b"q", b"\xef\xbb\xbf" + _record(id='"q"', ts=TS)),
    "a key that is not UTF-8": (b"\xff\xfe", _record(id='"q"', ts=TS)),
    "a value that is not UTF-8": (b"q", b'{"id": "\xff", "ts": ' + TS.encode() + b"}"),
    "an oversized record that is not JSON": (b"q", b"x" * 400),
}


@pytest.fixture(params=["driver", "read_ahead"])
def reader(request):
    """Makes the batch reader under test: DriverFetch or ReadAhead (closed at the end)."""
    made = []

    def make(bootstrap: str, sources: list[Source], max_records: int):
        kind = DriverFetch if request.param == "driver" else ReadAhead
        made.append(kind(bootstrap, sources, max_records))
        return made[-1]
    yield make
    for one in made:
        one.close()


def _source(topic: str) -> Source:
    return Source(name="things", topic=topic, schema=SCHEMA, key="id", event_time="ts",
                  max_record_bytes=300)


def _topic(settings, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def _produce(settings, topic: str, records, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def _ends(settings, topic: str) -> dict[str, dict[str, int]]:
    return {topic: {str(p): end for p, (_, end) in
                    log_range(settings.kafka_bootstrap, topic).items()}}


def _spark_rows(spark, settings, source: Source) -> list[dict]:
    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .option("subscribe", source.topic).option("startingOffsets", "earliest").load())
    rows = rows_of(classify_sources(raw, [source]))
    return sorted(rows, key=lambda r: (r["_partition"], r["_offset"]))


def test_the_driver_reads_what_spark_reads(spark, settings, unique, reader):
    topic = f"{unique}-inside"
    _topic(settings, topic, 2)
    _produce(settings, topic, INSIDE, partition=0)
    # The second partition's records: keyed ones only (keyless records in two partitions
    # are Spark's to order).
    _produce(settings, topic, [r for r in INSIDE if r[0] is not None][:6], partition=1)
    source = _source(topic)
    read = reader(settings.kafka_bootstrap, [source], max_records=100)
    ends = _ends(settings, topic)
    fetched = read.read({topic: {"0": 0, "1": 0}}, ends)
    assert fetched is not None
    expected = _spark_rows(spark, settings, source)
    assert len(expected) == len(INSIDE) + 6
    assert fetched == expected
    # The reasons of the bad records are the ones Spark gives, not only equal rows.
    oversized = len(INSIDE[13][1])
    assert [r["_error"] for r in fetched if r["_error"]] == [
        "missing key field id", "missing key field id", "missing event time field ts",
        f"oversized record: {oversized} bytes > 300", "tombstone without a key",
        "missing key field id"]
    # A slice of the batch: from given offsets, up to (not including) the ends.
    middle = read.read({topic: {"0": 3, "1": 2}}, {topic: {"0": 7, "1": 4}})
    assert [(r["_partition"], r["_offset"]) for r in middle] == [
        (0, 3), (0, 4), (0, 5), (0, 6), (1, 2), (1, 3)]


def test_records_outside_the_subset_go_to_spark(settings, unique, reader):
    topic = f"{unique}-outside"
    _topic(settings, topic, 1)
    cases = sorted(OUTSIDE)
    _produce(settings, topic, [INSIDE[0], *(OUTSIDE[case] for case in cases)])
    read = reader(settings.kafka_bootstrap, [_source(topic)], max_records=100)
    assert read.read({topic: {"0": 0}}, {topic: {"0": 1}}) is not None
    # Each record alone in a batch (at offsets 1, 2, ...): the batch is Spark's to read.
    fetched = [case for offset, case in enumerate(cases, start=1)
               if read.read({topic: {"0": offset}}, {topic: {"0": offset + 1}}) is not None]
    assert fetched == []


def test_batches_it_does_not_take(settings, unique, reader):
    topic = f"{unique}-sizes"
    _topic(settings, topic, 2)
    _produce(settings, topic, INSIDE[:4])
    _produce(settings, topic, [(None, _record(id='"z"', ts=TS))], partition=1)
    read = reader(settings.kafka_bootstrap, [_source(topic)], max_records=3)
    ends = _ends(settings, topic)
    assert read.read(None, ends) is None  # the first batch: where it starts is unknown
    assert read.read({topic: {"0": 0}}, ends) is None  # a partition new since the last
    assert read.read({topic: {"0": 0, "1": 1}}, ends) is None  # 4 records > 3
    assert len(read.read({topic: {"0": 1, "1": 1}}, ends)) == 3
    # A keyless record beside a second partition's records: their order is Spark's.
    assert read.read({topic: {"0": 2, "1": 0}}, ends) is None
    assert read.read({topic: {"0": 4, "1": 0}}, ends) is not None  # one partition's only


def test_a_column_type_it_does_not_read_leaves_every_batch_to_spark(settings, unique):
    source = Source(name="things", topic=unique, schema="id STRING, price DECIMAL(10,2)",
                    key="id")
    assert DriverFetch.for_settings(settings, [source]) is None
    assert DriverFetch.for_settings(settings, [_source(unique)]) is not None
    off = settings.model_copy(update={"engine_driver_fetch_max_records": 0})
    assert DriverFetch.for_settings(off, [_source(unique)]) is None
    legacy = settings.model_copy(update={"spark_conf": {
        "spark.sql.legacy.timeParserPolicy": "LEGACY"}})
    assert DriverFetch.for_settings(legacy, [_source(unique)]) is None


def _orders(start: int, count: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), _record(id=f'"k{i}"', n=str(i), ts=TS))
            for i in range(start, start + count)]


def test_batches_read_ahead_are_the_batches_records(settings, unique):
    """Batch after batch, the read ahead answers what the driver's own fetch does: records
    produced after it read on, a batch larger than what it reads ahead, a batch that does
    not start where the last ended, one it must leave to Spark."""
    topic = f"{unique}-ahead"
    _topic(settings, topic, 2)
    source = _source(topic)
    ahead = ReadAhead(settings.kafka_bootstrap, [source], max_records=4)
    fetch = DriverFetch(settings.kafka_bootstrap, [source], max_records=4)
    try:
        _produce(settings, topic, _orders(0, 3), partition=0)
        _produce(settings, topic, _orders(3, 1), partition=1)
        batches = [({"0": 0, "1": 0}, {"0": 3, "1": 1})]
        _produce(settings, topic, _orders(4, 6), partition=0)  # after the read ahead began
        _produce(settings, topic, _orders(10, 2), partition=1)
        batches += [({"0": 3, "1": 1}, {"0": 5, "1": 3}),  # as the engine's batches follow
                    ({"0": 5, "1": 3}, {"0": 9, "1": 3}),  # 4 records, all it reads ahead
                    ({"0": 2, "1": 0}, {"0": 4, "1": 2}),  # not where the last one ended
                    ({"0": 4, "1": 2}, {"0": 9, "1": 3}),  # 6 records > 4: Spark's
                    ({"0": 9, "1": 3}, {"0": 9, "1": 3})]  # nothing new
        for starts, ends in batches:
            starts, ends = {topic: starts}, {topic: ends}
            expected = fetch.read(starts, ends)
            assert ahead.read(starts, ends) == expected
        assert [len(fetch.read({topic: s}, {topic: e}) or []) for s, e in batches] == [
            4, 4, 4, 4, 0, 0]
        # A record Spark must classify sends its batch to Spark, and only that batch.
        _produce(settings, topic, [OUTSIDE["NaN"], *_orders(20, 2)], partition=0)
        assert ahead.read({topic: {"0": 9, "1": 3}}, {topic: {"0": 11, "1": 3}}) is None
        assert ahead.read({topic: {"0": 11, "1": 3}}, {topic: {"0": 12, "1": 3}}) == \
            fetch.read({topic: {"0": 11, "1": 3}}, {topic: {"0": 12, "1": 3}})
    finally:
        ahead.close()
        fetch.close()


def _read_ahead_of_two(settings, topic: str) -> ReadAhead:
    """A read ahead over a topic of two records, the first read."""
    _topic(settings, topic, 1)
    _produce(settings, topic, _orders(0, 2))
    ahead = ReadAhead(settings.kafka_bootstrap, [_source(topic)], max_records=10)
    assert len(ahead.read({topic: {"0": 0}}, {topic: {"0": 1}})) == 1
    return ahead


def test_a_read_ahead_process_gone_leaves_batches_to_spark(settings, unique):
    topic = f"{unique}-gone"
    ahead = _read_ahead_of_two(settings, topic)
    ahead._process.kill()
    ahead._process.join(30)
    assert ahead.read({topic: {"0": 1}}, {topic: {"0": 2}}) is None
    ahead.close()
    assert not ahead._process.is_alive()


def test_a_read_ahead_process_ends_with_its_pipe(settings, unique):
    topic = f"{unique}-ends"
    ahead = _read_ahead_of_two(settings, topic)
    assert len(ahead.read({topic: {"0": 1}}, {topic: {"0": 2}})) == 1
    ahead._conn.close()  # as when the driver is gone: the process ends by itself
    ahead._process.join(30)
    assert ahead._process.exitcode == 0


def _read_ahead_for(settings, source: Source, answer) -> None:
    fetch = DriverFetch.for_settings(settings, [source])
    answer.send(type(ReadAhead.for_settings(settings, fetch)).__name__)


def test_a_daemonic_process_reads_without_a_read_ahead(settings, unique):
    """A daemonic process may not start one (an engine run by a bench worker): the driver
    fetches, as with the read ahead off."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=_read_ahead_for, args=(settings, _source(unique), theirs),
                            daemon=True)
    child.start()
    assert ours.recv() == "NoneType"
    child.join(30)
    off = settings.model_copy(update={"engine_read_ahead": False})
    assert ReadAhead.for_settings(off, DriverFetch.for_settings(off, [_source(unique)])) is None


def test_the_first_batch_starts_where_the_source_resolved_earliest(spark, settings, unique,
                                                                    tmp_path):
    """A new query's first batch is fetched by the driver too: it starts at the offsets the
    Kafka source wrote to the checkpoint (`sources/0/0`) before that batch, here past
    records deleted from the log's head, and the driver's fetch from there to the batch's
    end gives the rows Spark's first batch read."""
    from confluent_kafka import TopicPartition

    from engine.batch_offsets import read_batch_offsets, read_initial_offsets
    from engine.sources import read_kafka

    topic = f"{unique}-first"
    _topic(settings, topic, 2)
    _produce(settings, topic, INSIDE, partition=0)
    _produce(settings, topic, [r for r in INSIDE if r[0] is not None][:6], partition=1)
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    for done in admin.delete_records([TopicPartition(topic, 0, 3)]).values():
        done.result(30)  # partition 0 now begins at offset 3
    source = _source(topic)
    checkpoint = str(tmp_path / "checkpoint")
    batches: dict[int, list[dict]] = {}

    def keep(batch, batch_id: int) -> None:
        rows = rows_of(classify_sources(batch, [source]))
        batches[batch_id] = sorted(rows, key=lambda r: (r["_partition"], r["_offset"]))

    query = (read_kafka(spark, settings, topic).writeStream.foreachBatch(keep)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(120)
    starts = read_initial_offsets(checkpoint)
    assert starts == {topic: {"0": 3, "1": 0}}
    ends = read_batch_offsets(checkpoint, 0).offsets
    fetch = DriverFetch(settings.kafka_bootstrap, [source], max_records=100)
    try:
        fetched = fetch.read(starts, ends)
    finally:
        fetch.close()
    assert fetched is not None and len(fetched) == len(INSIDE) - 3 + 6
    assert fetched == batches[0]
    assert read_initial_offsets(str(tmp_path / "none")) is None
