"""Realistic, deterministic event traffic for the demo shop (topics `customers`, `orders`).

`generate(seed)` yields `(topic, key, value)` forever: first the customers, then a mix of
new orders, status updates (the whole order re-emitted), customer tier changes, deletes
of cancelled orders (value None, a Kafka tombstone), out-of-order and, rarely, late event
times. The same seed gives the same events. `produce` sends them to Kafka at a rate.
"""

from __future__ import annotations

import datetime
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

CUSTOMERS_TOPIC = "customers"
ORDERS_TOPIC = "orders"

Event = tuple[str, str, bytes | None]  # (topic, key, value); value None deletes the key

TIERS = ("bronze", "silver", "gold")
_TIER_WEIGHTS = (0.6, 0.3, 0.1)
_COUNTRIES = ("US", "DE", "FR", "GB", "NL", "ES", "IT", "PL", "SE", "JP", "BR", "CA")
_COUNTRY_WEIGHTS = (30, 12, 10, 10, 5, 6, 6, 4, 3, 6, 4, 4)
_FIRST = ("Ada", "Alan", "Grace", "Linus", "Margaret", "Ken", "Barbara", "Dennis", "Frances",
          "Edsger", "Radia", "Tim", "Hedy", "John", "Katherine", "Niklaus", "Sophie", "Yukihiro")
_LAST = ("Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Thompson", "Liskov",
         "Ritchie", "Allen", "Dijkstra", "Perlman", "Berners-Lee", "Lamarr", "Backus",
         "Johnson", "Wirth", "Wilson", "Matsumoto")
# How much more often a customer of a tier orders than a bronze one.
_TIER_ACTIVITY = {"bronze": 1.0, "silver": 2.0, "gold": 4.0}

DEFAULT_START = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
PACE_S = 0.005  # the producer sleeps only when this far ahead of its schedule
LATE_BY_S = (150.0, 600.0)  # late events: older than 2 minutes, past any 30 s watermark
OUT_OF_ORDER_BY_S = (0.5, 8.0)  # a few seconds in the past, within the watermark


@dataclass
class _Order:
    order_id: str
    customer_id: str
    product_id: str
    amount: float
    status: str
    ts: str


def _iso(ts: datetime.datetime) -> str:
    return ts.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{ts.microsecond // 1000:03d}Z"


def _json(value: dict[str, object]) -> bytes:
    return orjson.dumps(value)


def generate(
    seed: int = 0,
    *,
    customers: int = 50,
    products: int = 200,
    start: datetime.datetime = DEFAULT_START,
    tick_s: float = 0.01,
    clock: Callable[[], datetime.datetime] | None = None,
    first_order: int = 1,
) -> Iterator[Event]:
    """Yield demo events forever (slice with itertools.islice).

    Event time advances `tick_s` per event from `start`, so the stream is reproducible;
    pass `clock` (e.g. the wall clock) to stamp events with real time instead. Order ids
    count up from `first_order`, so several generators can write distinct orders.
    """
    rng = random.Random(seed)
    step = 0

    def now() -> datetime.datetime:
        if clock is not None:
            return clock()
        return start + datetime.timedelta(seconds=step * tick_s)

    tiers: dict[str, str] = {}
    customer_rows: dict[str, dict[str, object]] = {}
    open_orders: list[_Order] = []  # placed or paid: may still change status
    cancelled: list[str] = []  # may be deleted later
    next_order = first_order
    # A few best sellers. Cumulative weights, computed once: random.choices would sum the
    # weights on every call (the same numbers, so the same picks, only slower).
    product_cum = list(itertools.accumulate(1.0 / (i + 1) for i in range(products)))
    buyers: tuple[list[str], list[float]] | None = None  # ids, cumulative activity; None: stale

    def new_customer() -> Event:
        customer_id = f"C{len(customer_rows) + 1:05d}"
        row: dict[str, object] = {
            "customer_id": customer_id,
            "name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
            "tier": rng.choices(TIERS, _TIER_WEIGHTS)[0],
            "country": rng.choices(_COUNTRIES, _COUNTRY_WEIGHTS)[0],
        }
        customer_rows[customer_id] = row
        tiers[customer_id] = str(row["tier"])
        return CUSTOMERS_TOPIC, customer_id, _json(row)

    for _ in range(customers):
        yield new_customer()
        step += 1

    while True:
        roll = rng.random()
        event: Event
        if roll < 0.30 and open_orders:
            event = _status_update(rng, open_orders, cancelled)
        elif roll < 0.33 and cancelled:
            # Tombstone: a cancelled order is forgotten.
            order_id = cancelled.pop(rng.randrange(len(cancelled)))
            event = ORDERS_TOPIC, order_id, None
        elif roll < 0.345:
            event = _tier_change(rng, customer_rows, tiers)
            buyers = None
        elif roll < 0.35:
            event = new_customer()
            buyers = None
        else:
            if buyers is None:
                ids = list(tiers)
                buyers = ids, list(itertools.accumulate(_TIER_ACTIVITY[tiers[c]] for c in ids))
            customer_id = rng.choices(buyers[0], cum_weights=buyers[1])[0]
            ts = now()
            kind = rng.random()
            if kind < 0.01:
                ts -= datetime.timedelta(seconds=rng.uniform(*LATE_BY_S))
            elif kind < 0.16:
                ts -= datetime.timedelta(seconds=rng.uniform(*OUT_OF_ORDER_BY_S))
            order = _Order(
                order_id=f"O{next_order:08d}",
                customer_id=customer_id,
                product_id=f"P{rng.choices(range(products), cum_weights=product_cum)[0] + 1:04d}",
                amount=round(min(rng.lognormvariate(3.3, 0.8), 5_000.0), 2),
                status="placed",
                ts=_iso(ts),
            )
            next_order += 1
            open_orders.append(order)
            if len(open_orders) > 5_000:  # forget the oldest, so memory stays bounded
                open_orders.pop(0)
            event = ORDERS_TOPIC, order.order_id, _json(order.__dict__)
        yield event
        step += 1


def _status_update(rng: random.Random, open_orders: list[_Order], cancelled: list[str]) -> Event:
    """Move an open order on (placed -> paid|cancelled, paid -> shipped|cancelled)."""
    # Recent orders move on first, like a real fulfilment pipeline.
    index = len(open_orders) - 1 - min(int(rng.expovariate(1 / 20)), len(open_orders) - 1)
    order = open_orders[index]
    if order.status == "placed":
        order.status = "paid" if rng.random() < 0.85 else "cancelled"
    else:
        order.status = "shipped" if rng.random() < 0.93 else "cancelled"
    if order.status in ("shipped", "cancelled"):
        open_orders.pop(index)
    if order.status == "cancelled":
        cancelled.append(order.order_id)
        if len(cancelled) > 5_000:
            cancelled.pop(0)
    # The whole order again; ts stays the time it was placed.
    return ORDERS_TOPIC, order.order_id, _json(order.__dict__)


def _tier_change(rng: random.Random, customer_rows: dict[str, dict[str, object]],
                 tiers: dict[str, str]) -> Event:
    customer_id = rng.choice(list(customer_rows))
    tier = rng.choice([t for t in TIERS if t != tiers[customer_id]])
    tiers[customer_id] = tier
    customer_rows[customer_id] = {**customer_rows[customer_id], "tier": tier}
    return CUSTOMERS_TOPIC, customer_id, _json(customer_rows[customer_id])


def send(producer: Any, topic: str, key: str, value: bytes | None, on_delivery=None) -> None:
    """Produce one event, waiting for room when the producer's local queue is full."""
    while True:
        try:
            producer.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery)
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(0.1)


def produce(
    bootstrap: str,
    rate: float = 100.0,
    seed: int = 0,
    count: int | None = None,
    duration: float | None = None,
    topics: Mapping[str, str] | None = None,
    observe: Callable[[Any], None] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Send demo events to Kafka at about `rate` events/s; stop after `count` events or
    `duration` seconds (whichever comes first; neither: run until interrupted).

    Events are stamped with the wall clock. `topics` renames topics (e.g. {"orders":
    "bench.orders"}); `observe` is called with every delivered message (its topic,
    partition, offset and timestamp). Returns the number of events delivered; raises
    RuntimeError if any delivery failed. Setting `stop` ends it early, as cleanly: what
    was sent is delivered and counted.
    """
    from confluent_kafka import Producer  # only this function needs Kafka

    if rate <= 0:
        raise ValueError("rate must be positive")
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,  # retries never duplicate or reorder events
        "linger.ms": 5,
    })
    failures: list[str] = []
    delivered = 0

    def on_delivery(err: object, msg: Any) -> None:
        nonlocal delivered
        if err is not None:
            failures.append(str(err))
        else:
            delivered += 1
            if observe is not None:
                observe(msg)

    events = generate(seed, clock=lambda: datetime.datetime.now(datetime.UTC))
    started = time.monotonic()
    sent = 0
    stop = stop or threading.Event()
    try:
        while (count is None or sent < count) and not stop.is_set():
            elapsed = time.monotonic() - started
            if duration is not None and elapsed >= duration:
                break
            # Pace against the schedule, not per event, and sleep only when more than
            # PACE_S ahead of it: at 1,000 events/s a sleep before every event was a
            # thousand wake-ups a second. Each event is still stamped when it is produced.
            ahead = sent / rate - elapsed
            if ahead > PACE_S and stop.wait(ahead):
                break
            topic, key, value = next(events)
            send(producer, (topics or {}).get(topic, topic), key, value, on_delivery)
            sent += 1
            producer.poll(0)
    finally:
        remaining = producer.flush(30)
    if remaining:
        raise RuntimeError(f"{remaining} demo events were not delivered within 30 s")
    if failures:
        raise RuntimeError(f"{len(failures)} demo events failed; first error: {failures[0]}")
    return delivered
