"""Which index entries an update must rewrite: only those of indexed fields whose value
changed (engine.sinks.redis_sink), comparing the stored row's JSON form with the new row."""

from __future__ import annotations

import datetime

import orjson
import redis

from engine.sinks.redis_sink import RedisSink
from schema import demo
from schema.catalog import graphql_fields
from schema.storage import decode_row, encode_row

WHEN = datetime.datetime(2026, 1, 1, 12, 30, 0, 250_000, tzinfo=datetime.UTC)
ORDER = {"order_id": "O1", "customer_id": "C1", "product_id": "P1", "amount": 12.5,
         "status": "placed", "ts": WHEN, "customer_tier": "gold", "customer_country": "DE"}


def sink() -> RedisSink:
    order = demo.CATALOG.views["Order"]
    return RedisSink("redis://127.0.0.1:1/0", order, graphql_fields(order))


def stored(row: dict) -> dict:
    return decode_row(encode_row(row))  # as Redis holds it


def test_an_update_of_unindexed_fields_rewrites_no_index_entry():
    assert sink().writes.changed_indexed(stored(ORDER), {**ORDER, "customer_tier": "silver"}) == ()


def test_each_changed_indexed_field_is_named_times_included():
    later = WHEN + datetime.timedelta(microseconds=1)
    changed = sink().writes.changed_indexed(
        stored(ORDER), {**ORDER, "status": "paid", "amount": 13, "ts": later})
    assert changed == ("status", "amount", "ts")  # 13 is an int now: rewritten to be safe
    assert sink().writes.changed_indexed(stored({**ORDER, "customer_id": None}), ORDER) \
        == ("customer_id",)


def test_a_new_row_gets_every_index():
    assert sink().writes.changed_indexed(None, ORDER) == demo.CATALOG.views["Order"].indexes


def queued_writes(upserts: dict, deletes: set, old_rows: dict) -> dict:
    """The writes one apply queues (APPLY_BATCH_LUA's ARGV[4]), by (command, key)."""
    pipe = redis.Redis(port=1).pipeline(transaction=False)  # queued, never sent
    sink().apply(7, 3, upserts, deletes, {}, old_rows, client=pipe)
    (args, _), = pipe.command_stack
    return {(command, key): values for command, key, values in orjson.loads(args[-2])}


def test_an_apply_writes_an_inserts_every_index_an_updates_changed_ones_a_deletes_none():
    moved = {**ORDER, "order_id": "O2", "status": "paid"}
    gone = {**ORDER, "order_id": "O3"}
    writes = queued_writes(
        {"O1": ORDER, "O2": moved}, {"O3"},
        {"O2": stored({**moved, "status": "placed"}), "O3": stored(gone)})
    index = "vg:{Order}:g3:idx:"
    row = "vg:{Order}:g3:row:"
    at = float(int(WHEN.timestamp() * 1000))
    assert writes == {
        ("del", ""): [f"{row}O3"],
        ("set", ""): [f"{row}O1", encode_row(ORDER).decode(), f"{row}O2",
                      encode_row(moved).decode()],
        # O1 is new: an entry in each of the view's four indexes.
        ("zadd", f"{index}customer_id"): [0.0, "C1\x00O1"],
        ("zadd", f"{index}amount"): [12.5, "O1"],
        ("zadd", f"{index}ts"): [at, "O1"],
        # O2 only changed its status: that index alone moves it.
        ("zadd", f"{index}status"): [0.0, "placed\x00O1", 0.0, "paid\x00O2"],
        ("zrem", f"{index}status"): ["placed\x00O2", "placed\x00O3"],
        # O3 is deleted: out of every index.
        ("zrem", f"{index}customer_id"): ["C1\x00O3"],
        ("zrem", f"{index}amount"): ["O3"],
        ("zrem", f"{index}ts"): ["O3"],
    }
