"""schema.arrow_rows gives what pyarrow's to_pylist gives, times included."""

import datetime
import random

import pyarrow as pa

from schema.arrow_rows import arrow_rows


def _times(rng: random.Random, n: int) -> list[datetime.datetime | None]:
    utc = datetime.UTC
    return [None if rng.random() < 0.1 else
            datetime.datetime(1970, 1, 1, tzinfo=utc)
            + datetime.timedelta(microseconds=rng.randint(-2**50, 2**53))
            for _ in range(n)]


def _same(got: list, want: list) -> None:
    assert got == want
    for g, w in zip(got, want, strict=True):  # equal aware times may differ in tzinfo
        assert repr(g) == repr(w)


def _order_struct(rng: random.Random, n: int, unit: str = "us") -> pa.StructArray:
    times = pa.array(_times(rng, n), pa.timestamp("us", tz="UTC")).cast(
        pa.timestamp(unit, tz="UTC"), safe=False)
    return pa.StructArray.from_arrays(
        [pa.array([f"o-{i}" for i in range(n)]),
         pa.array([None if i % 7 == 0 else rng.random() for i in range(n)]), times],
        names=["order_id", "amount", "ts"],
        mask=pa.array([i % 5 == 0 for i in range(n)]))


def test_rows_with_utc_times_top_level_and_in_structs_equal_pyarrows() -> None:
    rng = random.Random(11)
    n = 500
    table = pa.table({
        "_key": pa.array([f"k{i}" for i in range(n)]),
        "ts": pa.array(_times(rng, n), pa.timestamp("us", tz="UTC")),
        "order": _order_struct(rng, n),
        "other": pa.nulls(n, pa.struct([("ts", pa.timestamp("us", tz="UTC"))])),
        "in_ms": pa.array(_times(rng, n), pa.timestamp("us", tz="UTC")).cast(
            pa.timestamp("ms", tz="UTC"), safe=False),
    })
    _same(arrow_rows(table), table.to_pylist())


def test_sliced_and_chunked_columns_keep_their_rows() -> None:
    rng = random.Random(12)
    table = pa.table({"order": _order_struct(rng, 300),
                      "ts": pa.array(_times(rng, 300), pa.timestamp("us", tz="UTC"))})
    chunked = pa.concat_tables([table.slice(3, 100), table.slice(150, 120), table.slice(0, 0)])
    assert chunked.column("order").num_chunks == 3
    _same(arrow_rows(chunked), chunked.to_pylist())


def test_other_zones_nanoseconds_and_tables_without_times_are_pyarrows() -> None:
    rng = random.Random(13)
    times = _times(rng, 50)
    table = pa.table({
        "paris": pa.array(times, pa.timestamp("us", tz="Europe/Paris")),
        "naive": pa.array([None if t is None else t.replace(tzinfo=None) for t in times],
                          pa.timestamp("us")),
        "nanos": pa.array([None if t is None else t.replace(year=2000) for t in times],
                          pa.timestamp("ns", tz="UTC")),
        "ts": pa.array(times, pa.timestamp("us", tz="UTC")),
    })
    _same(arrow_rows(table), table.to_pylist())
    plain = pa.table({"a": [1, None, 3], "s": pa.array([{"x": 1}, None, {"x": 2}])})
    _same(arrow_rows(plain), plain.to_pylist())
    empty = pa.table({"ts": pa.array([], pa.timestamp("us", tz="UTC"))})
    assert arrow_rows(empty) == []
