"""The demo event generator: deterministic, and every kind of event shows up."""

from __future__ import annotations

import datetime
import itertools

import orjson

from viewgate.demo_events import generate

N = 4000


def events(seed: int, n: int = N) -> list[tuple[str, str, bytes | None]]:
    return list(itertools.islice(generate(seed), n))


def test_same_seed_same_events_other_seed_other_events() -> None:
    assert events(7) == events(7)
    assert events(7) != events(8)


def test_every_event_kind_appears() -> None:
    seen_customers: dict[str, dict[str, str]] = {}
    orders: dict[str, dict[str, object]] = {}
    kinds = set()
    newest = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    for topic, key, value in events(3):
        assert topic in ("customers", "orders") and isinstance(key, str)
        if topic == "customers":
            assert value is not None
            row = orjson.loads(value)
            assert row["customer_id"] == key and row["tier"] in ("bronze", "silver", "gold")
            if key in seen_customers and seen_customers[key]["tier"] != row["tier"]:
                kinds.add("tier change")
            seen_customers[key] = row
            continue
        if value is None:
            assert orders[key]["status"] == "cancelled"  # only cancelled orders are deleted
            kinds.add("tombstone")
            del orders[key]
            continue
        row = orjson.loads(value)
        assert row["order_id"] == key and row["customer_id"] in seen_customers
        ts = datetime.datetime.fromisoformat(row["ts"])
        assert row["ts"].endswith("Z")
        if row["status"] == "placed":
            assert key not in orders
            kinds.add("insert")
            if ts < newest - datetime.timedelta(minutes=2):
                kinds.add("late")
            elif ts < newest:
                kinds.add("out of order")
            newest = max(newest, ts)
        else:
            assert row["status"] in ("paid", "shipped", "cancelled")
            assert {k: v for k, v in row.items() if k != "status"} == {
                k: v for k, v in orders[key].items() if k != "status"}
            kinds.add("status update")
        orders[key] = row
    assert kinds == {"insert", "status update", "tombstone", "late", "out of order",
                     "tier change"}


def test_customers_come_first() -> None:
    first = events(1, 50)
    assert all(topic == "customers" for topic, _, _ in first)
    assert len({key for _, key, _ in first}) == 50


def test_clock_stamps_event_time() -> None:
    fixed = datetime.datetime(2030, 5, 1, tzinfo=datetime.UTC)
    stream = generate(1, customers=1, clock=lambda: fixed)
    orders = [orjson.loads(v) for t, _, v in itertools.islice(stream, 300)
              if t == "orders" and v is not None]
    placed = [o for o in orders if o["status"] == "placed"]
    assert placed and all(o["ts"] <= "2030-05-01T00:00:00.000Z" for o in placed)
    assert any(o["ts"] == "2030-05-01T00:00:00.000Z" for o in placed)
