"""Which index entries an update must rewrite: only those of indexed fields whose value
changed (engine.sinks.redis_sink), comparing the stored row's JSON form with the new row."""

from __future__ import annotations

import datetime

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
    assert sink()._changed_indexed(stored(ORDER), {**ORDER, "customer_tier": "silver"}) == ()


def test_each_changed_indexed_field_is_named_times_included():
    later = WHEN + datetime.timedelta(microseconds=1)
    changed = sink()._changed_indexed(
        stored(ORDER), {**ORDER, "status": "paid", "amount": 13, "ts": later})
    assert changed == ("status", "amount", "ts")  # 13 is an int now: rewritten to be safe
    assert sink()._changed_indexed(stored({**ORDER, "customer_id": None}), ORDER) \
        == ("customer_id",)


def test_a_new_row_gets_every_index():
    assert sink()._changed_indexed(None, ORDER) == demo.CATALOG.views["Order"].indexes
