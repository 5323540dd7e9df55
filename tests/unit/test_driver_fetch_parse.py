"""SourceReader reads a record with orjson only when that reading is certainly the one of
Python's json with duplicates kept (engine.driver_fetch._DECODER): a record either reads
the same both ways, or both ways send its batch to Spark."""

from __future__ import annotations

import pytest

from engine.driver_fetch import _DECODER, OutsideSubset, SourceReader, _NotPlain, _Pairs
from schema.catalog import Source

SOURCE = Source(name="things", topic="things", key="id", event_time="ts",
                schema="id STRING, n INT, x DOUBLE, flag BOOLEAN, ts TIMESTAMP")
TS = '"2024-03-01T10:00:00.123Z"'

RECORDS = [text.replace("$TS", TS) for text in [
    '{"id":"a","n":1,"x":2.5,"flag":true,"ts":$TS}',
    '{"id": "b", "n": null, "x": 3, "ts": $TS}',
    '{"id":"c","x":1e300,"ts":$TS}',  # a large double, written as one
    '{"id":"d","x":123456789012345678901234567890,"ts":$TS}',  # an integer orjson floats
    '{"id":"e","x":18446744073709551615,"ts":$TS}',
    '{"id":"f","id":"g","ts":$TS}',  # a field twice
    '{"id" :"h","id":"i","ts":$TS}',  # a field twice, spaced
    '{"id":"j","n":{"id":"k"},"ts":$TS}',  # a nested object in a column
    '{"id":"l","other":{"a":[1,"b"]},"ts":$TS}',  # a field that is no column
    '{"id":"m","ID":"n","ts":$TS}',  # a column in another case
    '{"id":"o \\u00e9","ts":$TS}',  # an escape
    '{"id":"p\\ud800","ts":$TS}',  # a lone surrogate
    '{"id":"q","x":NaN,"ts":$TS}',
    '{"id":"r","x":1e400,"ts":$TS}',
    '{"id":"s","n":1.0,"ts":$TS}',
    '{"id":12,"ts":$TS}',
    '{"id":"t","ts":"2024-03-01T10:00:00"}',
    '{"id":"u","ts":$TS} tail',
    '[1,2]',
    '{"id":"v","ts":$TS,"_corrupt":"w"}',
    '{"id":"\\"x\\"","ts":$TS}',
    '{"id":"y:\\":","n":3,"ts":$TS}',
]]


def _decoded(reader: SourceReader, value: bytes) -> object:
    try:
        pairs = _DECODER.decode(value.decode())
        if not isinstance(pairs, _Pairs) or len(dict(pairs)) != len(pairs):
            raise OutsideSubset("not one object with distinct fields")
        return reader._columns(dict(pairs))
    except (OutsideSubset, ValueError):
        return "Spark"


@pytest.mark.parametrize("text", RECORDS)
def test_orjson_reads_a_record_as_the_decoder_does_or_not_at_all(text):
    reader = SourceReader(SOURCE, 0, 1)
    value = text.encode()
    expected = _decoded(reader, value)
    try:
        plain = reader._plain(value)
    except _NotPlain:
        plain = None  # read by the decoder instead
    except OutsideSubset:
        plain = "Spark"
    assert plain is None or plain == expected
    try:
        parsed = reader._parsed(value)
    except OutsideSubset:
        parsed = "Spark"
    assert parsed == expected


def test_plain_records_take_the_fast_way():
    reader = SourceReader(SOURCE, 0, 1)
    assert reader._plain(RECORDS[0].encode())["n"] == 1
    assert reader._plain(RECORDS[1].encode())["x"] == 3.0
    for duplicate in (RECORDS[5], RECORDS[6]):  # orjson keeps the last of them
        with pytest.raises(_NotPlain):
            reader._plain(duplicate.encode())
