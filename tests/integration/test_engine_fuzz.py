"""Fuzzed source events through the real engine: every record ends up either in the view or
in the dead-letter topic with a reason, never both, never neither; records that are surely
bad are dead-lettered, records that are surely good are in the view; the engine keeps going."""

from __future__ import annotations

import json
import random
import time

import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from shop_views import catalog_on, isolated, produce, redis_rows, run_once

from engine.rebuild import log_range
from schema.storage import deadletter_topic

pytestmark = pytest.mark.integration

PREFIX = "fuzz-test"
GOOD = {"customer_id": "C1", "product_id": "P1", "amount": 12.5, "status": "placed",
        "ts": "2026-11-23T00:00:00+00:00"}


def _surely_bad(rng: random.Random, i: int) -> bytes:
    """Records no reading of the orders schema can accept."""
    order = {**GOOD, "order_id": f"BAD{i}"}
    text = json.dumps(order)
    kind = i % 8
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if kind == 1:
        return text[: rng.randrange(1, len(text) - 1)].encode()  # truncated
    if kind == 2:
        return json.dumps([order]).encode()
    if kind == 3:
        return json.dumps({k: v for k, v in order.items() if k != "order_id"}).encode()
    if kind == 4:
        return json.dumps({k: v for k, v in order.items() if k != "ts"}).encode()
    if kind == 5:
        return json.dumps({**order, "amount": {"nested": [1, 2, {"deep": True}]}}).encode()
    if kind == 6:
        return json.dumps({**order, "note": "x" * 120_000}).encode()  # over max_record_bytes
    return b"\x00" + text.encode()


def _surely_good(rng: random.Random, i: int) -> tuple[str, bytes]:
    """Valid orders in unusual but legal shapes."""
    order_id = f"GOOD{i}"
    order = {**GOOD, "order_id": order_id, "amount": round(rng.uniform(0, 1e6), 2)}
    kind = i % 4
    if kind == 0:
        order["extra"] = {"ignored": [1, 2, 3]}
    elif kind == 1:
        order["product_id"] = "Pröduct ✓ 商品 \u2028"
    elif kind == 2:
        order = dict(reversed(list(order.items())))
    else:
        order["status"] = "placed" + " " * rng.randrange(1, 5)
    return order_id, json.dumps(order, ensure_ascii=kind != 1).encode()


def _doubtful(rng: random.Random, i: int) -> bytes:
    """Records whose fate depends on how leniently Spark reads JSON: either is fine."""
    order = {**GOOD, "order_id": f"DOUBT{i}"}
    kind = i % 6
    if kind == 0:
        order["amount"] = "12.5"
    elif kind == 1:
        order["amount"] = True
    elif kind == 2:
        order["ts"] = "yesterday"
    elif kind == 3:
        order["amount"] = 1e400
    elif kind == 4:
        return json.dumps(order).replace("12.5", "NaN").encode()
    else:
        order["customer_id"] = None
    return json.dumps(order).encode()


def _dead_letters(bootstrap: str, source_topic: str) -> tuple[dict[str, str], list[str]]:
    """(source record key -> reason, for every dead letter of `source_topic`; the reasons of
    view rows left out for a null key), read to the end the dead-letter topic has now. The
    dead-letter topic is per source name, which other tests' catalogs share."""
    topic = deadletter_topic("orders")
    ends = {p: end for p, (_, end) in log_range(bootstrap, topic).items() if end > 0}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-check",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    read = dict.fromkeys(ends, 0)  # the next offset to read, per partition
    out: dict[str, str] = {}
    keyless: list[str] = []
    deadline = time.monotonic() + 120
    try:
        while any(read[p] < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"the dead letters were not read: {read}"
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            read[message.partition()] = message.offset() + 1
            headers = dict(message.headers())
            if headers.get("source.topic", b"").decode() == source_topic:
                out[message.key().decode()] = headers["reason"].decode()
            elif "view" in headers:  # only this test makes rows without a key
                keyless.append(headers["reason"].decode())
    finally:
        consumer.close()
    return out, keyless


@pytest.mark.parametrize("task_read", [False, True], ids=["driver-read", "task-read"])
def test_fuzzed_orders_are_either_in_the_view_or_dead_lettered_with_a_reason(
        spark, settings, tmp_path, task_read):
    """Also with the batches read by Spark's tasks (engine.task_read, engine.task_upsert):
    a record whose text is not UTF-8 sends the batch to Spark's rows, as the driver's own
    read does."""
    settings = isolated(settings, tmp_path, redis_db=29 if task_read else 7).model_copy(
        update={"engine_task_read": task_read, "engine_task_read_min_records": 0,
                "engine_driver_fetch_max_records": 0 if task_read else
                settings.engine_driver_fetch_max_records})
    catalog = catalog_on(f"{PREFIX}-tasks" if task_read else PREFIX)
    topic = catalog.sources["orders"].topic
    rng = random.Random(2026)
    records: list[tuple[str, str | None, bytes]] = []
    kinds: list[str] = []
    good_ids = []
    for i in range(240):
        roll = i % 3
        if roll == 0:
            records.append((topic, f"BAD{i}", _surely_bad(rng, i)))
            kinds.append("bad")
        elif roll == 1:
            order_id, value = _surely_good(rng, i)
            records.append((topic, order_id, value))
            kinds.append("good")
            good_ids.append(order_id)
        else:
            records.append((topic, f"DOUBT{i}", _doubtful(rng, i)))
            kinds.append("doubt")
    produce(settings.kafka_bootstrap, records)
    run_once(spark, settings, catalog)  # fails the test if any query failed

    ranges = log_range(settings.kafka_bootstrap, topic).values()
    assert sum(end - first for first, end in ranges) == len(records)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        in_view = set(redis_rows(client, "Order"))
    finally:
        client.close()
    dead, keyless = _dead_letters(settings.kafka_bootstrap, topic)
    for kind, (_, key, _) in zip(kinds, records, strict=True):
        in_dlq = key in dead
        assert in_dlq != (key in in_view), (kind, key, dead.get(key))
        if kind == "bad":
            assert in_dlq and dead[key].strip(), (key, "a bad record was accepted")
        if kind == "good":
            assert not in_dlq, (key, dead[key])
    assert set(good_ids) <= in_view
    # Orders without a customer are fine orders, but CustomerStats groups by customer: its
    # row for the null customer is left out and dead-lettered, and the query goes on.
    assert any("CustomerStats: key column(s) customer_id null" in r for r in keyless), keyless
