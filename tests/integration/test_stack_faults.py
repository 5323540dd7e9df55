"""The whole stack as separate processes through its faults, with clients watching.

One stack for the module, on services of its own so that they can be restarted: a Kafka
broker, a Redis (no persistence: a restart empties it), `viewgate engine` in a process
group of its own and the gateway as a uvicorn process. Websocket subscribers
(graphql-transport-ws) and an HTTP client watch while, in this order:

1. the engine is SIGKILLed right after a commit and again between a Redis apply and its
   change-feed publication, and restarted: every view exact, and the subscribers that stayed
   connected saw each version once, in order, exactly as the change feed holds them;
2. the Kafka broker restarts: engine and gateway reconnect by themselves;
3. Redis is flushed, then stopped and started empty: the gateway answers every query
   correctly from Delta throughout, re-warms Redis, and the engine carries on;
4. the gateway is killed and started again while events keep coming: clients resume with
   their last cursor and get exactly the changes they missed, then live ones.

Each scenario produces its own chunk of orders and checks every view against a pandas
computation over all orders produced so far (tests/integration/shop_views.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis
from engine_process import (
    EngineProcess,
    delta_rows,
    delta_stats_exact,
    feed_changes,
    feed_ends,
    in_time_events,
)
from shop_views import (
    Record,
    delta_frame,
    expected_customer_stats,
    expected_customers,
    expected_orders,
    produce,
    redis_rows,
    view_mismatches,
)
from websockets.exceptions import ConnectionClosed
from ws_clients import GatewayServer, TransportWS

from gateway.subscriptions.feed_cursor import FeedCursor, decode_feed_cursor, encode_feed_cursor
from schema.settings import Settings
from schema.storage import ChangeEvent, ViewMeta, complete_field, meta_key
from viewgate.stack.errors import StackError
from viewgate.stack.kafka import KafkaBroker
from viewgate.stack.process import free_port, wait_until
from viewgate.stack.redis_server import RedisServer

pytestmark = pytest.mark.integration

PREFIX = "stackfaults"
VIEWS = ("Customer", "OrderRecord", "Order", "CustomerStats", "ProductSales")
CHUNKS = 8  # chunks of orders: one to start with, then the scenarios' own
SETTLE_S = 420  # deadline for the engine to catch up (a JVM start on a busy machine)


# --- the stack -------------------------------------------------------------------------


@dataclass
class Stack:
    settings: Settings
    broker: KafkaBroker
    redis_server: RedisServer
    engine: EngineProcess
    gateway: GatewayServer
    client: redis.Redis
    customers: list[Record]
    chunks: list[list[Record]]
    produced: list[Record] = field(default_factory=list)  # orders produced so far

    def produce(self, chunk: int) -> None:
        produce(self.broker.bootstrap, self.chunks[chunk])
        self.produced += self.chunks[chunk]

    def wait_exact(self, what: str) -> None:
        """Every view in Redis equals the batch computation over what was produced."""
        wait_until(lambda: view_mismatches(self.client, self.customers, self.produced) == [],
                   timeout_s=SETTLE_S, what=f"every view to be exact {what}",
                   log=self.engine.log_dir / f"engine-{self.engine.runs}.log")

    def version(self, view: str) -> int:
        return ViewMeta.from_fields(self.client.hgetall(meta_key(view))).version

    def feed_end(self, view: str) -> int:
        return feed_ends(self.broker.bootstrap, view).get(0, 0)

    def feed(self, view: str, start: int) -> list[tuple[int, ChangeEvent]]:
        return feed_changes(self.broker.bootstrap, view, {0: start})

    def alive(self) -> None:
        assert self.engine.process.poll() is None, f"the engine exited:\n{self.engine.log_tail()}"
        assert self.gateway.process.alive(), "the gateway exited"


@pytest.fixture(scope="module")
def stack(base_settings, tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack-faults")
    broker = KafkaBroker(root / "kafka", free_port(), base_settings.jar_dir / "kafka")
    redis_server = RedisServer(root / "redis", free_port())
    engine = gateway = client = None
    try:
        broker.start(timeout_s=base_settings.startup_timeout_s)
        redis_server.start()
        own = base_settings.model_copy(update={"kafka_bootstrap": broker.bootstrap,
                                               "redis_url": redis_server.url,
                                               "data_dir": root / "data"})
        client = redis.Redis.from_url(own.redis_url)
        customers, orders = in_time_events(PREFIX, 2450)
        size = len(orders) // CHUNKS + 1
        chunks = [orders[i:i + size] for i in range(0, len(orders), size)]
        engine = EngineProcess(own, root, PREFIX)
        # A short Redis timeout and retry: during the outage answers come from Delta at once.
        gateway = GatewayServer(own, root, PREFIX, VIEWGATE_GATEWAY_REDIS_TIMEOUT_S="0.5",
                                VIEWGATE_GATEWAY_REDIS_RETRY_MS="100")
        stack = Stack(own, broker, redis_server, engine, gateway, client, customers, chunks)
        # Customers first, so every order's enrichment finds its customer.
        produce(broker.bootstrap, customers)
        engine.start()
        want = len(expected_customers(customers))
        wait_until(lambda: delta_rows(own, "Customer") == want, timeout_s=SETTLE_S,
                   what="the customers to be in Delta", log=root / "engine-1.log")
        stack.produce(0)
        stack.wait_exact("after the first orders")
        gateway.start()  # after the engine created every view's Delta table
        yield stack
    finally:
        if gateway is not None:
            gateway.stop()
        if engine is not None:
            engine.stop()
        if client is not None:
            client.close()
        redis_server.stop()
        broker.stop()


# --- websocket subscribers on a loop of their own ----------------------------------------


class Watch:
    """One subscription; its messages collect in `messages` as they arrive."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.closed = False
        self.client: TransportWS | None = None

    def data(self, field_name: str) -> list[dict]:
        """The changes received; fails on any message other than data without errors."""
        out = []
        for message in self.messages:
            assert message["type"] == "next" and "errors" not in message["payload"], message
            out.append(message["payload"]["data"][field_name])
        return out

    async def run(self, url: str, query: str, variables: dict | None) -> None:
        self.client = await TransportWS.open(url)
        op = await self.client.subscribe(query, variables)
        try:
            while True:
                message = await self.client.receive(timeout_s=3600)
                assert message.get("id") == op, message
                self.messages.append(message)
        except ConnectionClosed:
            self.closed = True


class Watchers:
    """Subscribers on an asyncio loop in a thread, so they stay connected while the test
    kills and restarts processes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.watches: list[Watch] = []

    def watch(self, url: str, query: str, variables: dict | None = None) -> Watch:
        watch = Watch()
        self.watches.append(watch)
        task = asyncio.run_coroutine_threadsafe(watch.run(url, query, variables), self.loop)
        wait_until(lambda: watch.client is not None or task.done(), timeout_s=60,
                   what="a websocket connection")
        if task.done():
            task.result()  # raises what went wrong
        return watch

    def close(self) -> None:
        async def shutdown() -> None:
            for watch in self.watches:
                if watch.client is not None:
                    with contextlib.suppress(Exception):
                        await watch.client.close()
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()


@pytest.fixture
def watchers() -> Iterator[Watchers]:
    watchers = Watchers()
    try:
        yield watchers
    finally:
        watchers.close()


def _subscribed(stack: Stack, count: int) -> None:
    wait_until(lambda: stack.gateway.stats()["subscribers"] >= count, timeout_s=60,
               what=f"{count} subscriptions registered")


def _deduped(events: list[tuple[int, ChangeEvent]]) -> list[tuple[int, ChangeEvent]]:
    """The feed as subscribers see it: a (key, version) already seen is a repeat (the feed
    is at least once)."""
    newest: dict[str, int] = {}
    out = []
    for offset, event in events:
        if newest.get(event.key, -1) >= event.version:
            continue
        newest[event.key] = event.version
        out.append((offset, event))
    return out


def _seen_through(events: list[tuple[int, ChangeEvent]],
                  matches=lambda row: True) -> list[tuple[str, int, str, int]]:
    """(key, version, op, offset) of the changes a subscriber with this filter receives: ops
    relative to the filter, repeats dropped, and nothing for a row the filter never saw
    (such as a row inserted and deleted within one batch)."""
    out = []
    for offset, event in _deduped(events):
        was = event.before is not None and matches(event.before)
        now = event.row is not None and matches(event.row)
        if was or now:
            op = "UPDATE" if was and now else ("INSERT" if now else "DELETE")
            out.append((event.key, event.version, op, offset))
    return out


def _received(watches: list[Watch], view: str) -> list[tuple[str, int, str, int]]:
    """(key, version, op, offset) of the changes the watches received, in order."""
    field_name = f"{view[0].lower()}{view[1:]}Changes"
    return [(c["key"], c["version"], c["op"], decode_feed_cursor(c["cursor"], view).offset)
            for w in watches for c in w.data(field_name)]


def _caught_up(what: str, got: Callable[[], list], want: Callable[[], list]) -> list:
    """Wait until what clients received equals what the change feed says they should have
    (the feed may still be getting the last batch); then compare once more, so that a
    failure shows the difference. Returns what was wanted."""
    state: dict[str, list] = {}

    def equal() -> bool:
        state["got"], state["want"] = got(), want()
        return state["got"] == state["want"]
    with contextlib.suppress(StackError):
        wait_until(equal, timeout_s=120, interval_s=1, what=what)
    assert state["got"] == state["want"], what
    return state["want"]


def _cursor(view: str, offset: int) -> str:
    return encode_feed_cursor(FeedCursor(view, 0, offset))


def _busiest(orders: list[Record]) -> str:
    """The customer with most placed orders among `orders`."""
    counts = collections.Counter(json.loads(v)["customer_id"] for _, _, v in orders
                                 if v is not None and json.loads(v)["status"] == "placed")
    return counts.most_common(1)[0][0]


STATS_LIVE = ("subscription($id: String!) { customerStats(customerId: $id) "
              "{ op key version cursor row { orderCount totalSpent } } }")


# --- 1. the engine killed mid-batch ------------------------------------------------------


def test_engine_sigkill_mid_batch_keeps_views_exact_and_subscribers_in_order(stack, watchers):
    key = _busiest(stack.chunks[1] + stack.chunks[2])
    order_end = stack.feed_end("Order")
    stats_start = stack.feed_end("CustomerStats")
    live = watchers.watch(stack.gateway.url, STATS_LIVE, {"id": key})
    placed = watchers.watch(
        stack.gateway.url,
        'subscription($after: String) { orderChanges(where: {status: {eq: "placed"}}, '
        "after: $after) { op key version cursor } }", {"after": _cursor("Order", order_end - 1)})
    wait_until(lambda: len(live.messages) >= 1, timeout_s=60, what="the current value")
    current = live.data("customerStats")[0]
    assert current["op"] == "CURRENT"
    _subscribed(stack, 2)

    # Killed from outside right after a CustomerStats commit (other views mid-batch).
    before = stack.version("CustomerStats")
    stack.produce(1)
    wait_until(lambda: stack.version("CustomerStats") > before, timeout_s=SETTLE_S,
               what="a CustomerStats commit")
    stack.engine.kill()
    # Killed between CustomerStats' Redis apply and its change-feed publication: Redis
    # holds a batch the feed does not, until the restarted engine replays it.
    stack.produce(2)
    stack.engine.start("after_redis:CustomerStats")
    stack.engine.wait_killed(timeout_s=SETTLE_S)
    stack.engine.start()
    stack.wait_exact("after two kills")
    wait_until(lambda: all(len(delta_frame(stack.settings, v))
                           == len(redis_rows(stack.client, v)) for v in VIEWS),
               timeout_s=120, what="Delta to hold as many rows as Redis")

    # The live value: every version of the key after the current one, once, in order,
    # and its last row is the one Redis holds.
    want = _caught_up(
        "the live value's changes",
        lambda: [(c["op"], c["version"]) for c in live.data("customerStats")[1:]],
        lambda: [("UPDATE", e.version) for _, e in _deduped(stack.feed("CustomerStats",
                 stats_start)) if e.key == key and e.version > current["version"]])
    assert want, "the key never changed: the scenario tested nothing"
    assert live.data("customerStats")[-1]["row"]["orderCount"] == \
        redis_rows(stack.client, "CustomerStats")[key]["order_count"]

    # The filtered changes: exactly the feed's changes the filter sees, in feed order.
    assert _caught_up("the filtered changes", lambda: _received([placed], "Order"),
                      lambda: _seen_through(stack.feed("Order", order_end),
                                            lambda row: row["status"] == "placed"))
    stack.alive()


# --- 2. the Kafka broker restarted -------------------------------------------------------


def test_kafka_restart_engine_and_gateway_reconnect(stack, watchers):
    key = _busiest(stack.chunks[3])
    live = watchers.watch(stack.gateway.url, STATS_LIVE, {"id": key})
    wait_until(lambda: len(live.messages) >= 1, timeout_s=60, what="the current value")
    current = live.data("customerStats")[0]

    stack.broker.stop()
    stack.broker.start(timeout_s=stack.settings.startup_timeout_s)
    stack.produce(3)
    stack.wait_exact("after the broker restarted")
    # The gateway's feed reader reconnected: the subscriber got the key's new versions.
    stored = redis_rows(stack.client, "CustomerStats")[key]
    wait_until(lambda: live.messages and live.data("customerStats")[-1]["row"]["orderCount"]
               == stored["order_count"], timeout_s=120, what="the change after the restart")
    versions = [c["version"] for c in live.data("customerStats")]
    assert versions == sorted(set(versions)) and versions[-1] > current["version"]
    body = stack.gateway.query(f'{{ customerStats(customerId: "{key}") {{ orderCount }} }}')
    assert "errors" not in body, body
    assert body["data"] == {"customerStats": {"orderCount": stored["order_count"]}}
    stack.alive()


# --- 3. Redis flushed, then restarted ----------------------------------------------------


POINT_CUSTOMER = "query($id: String!) { customer(customerId: $id) { customerId name tier } }"
POINT_ORDER = "query($id: String!) { order(orderId: $id) { orderId status amount } }"
PAID = ('{ orders(where: {status: {eq: "paid"}}, orderBy: {field: AMOUNT}, first: 100) '
        "{ totalCount edges { node { orderId } } } }")
LISTS = {"Customer": "{ customers(first: 1) { totalCount } }",
         "OrderRecord": "{ orderRecords(first: 1) { totalCount } }",
         "Order": "{ orders(first: 1) { totalCount } }",
         "CustomerStats": "{ customerStatsList(first: 1) { totalCount } }",
         "ProductSales": "{ productSalesList(first: 1) { totalCount } }"}


class Hammer(threading.Thread):
    """An HTTP client sending point and list queries back to back, checking each answer
    against the expected rows; the events do not change while it runs."""

    def __init__(self, port: int, customers: dict[str, dict], orders: dict[str, dict]) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/graphql"
        self.customers, self.orders = customers, orders
        paid = sorted((o["amount"], k) for k, o in orders.items() if o["status"] == "paid")
        self.paid = ([k for _, k in paid[:100]], len(paid))
        self.stop = threading.Event()
        self.ok = 0
        self.errors: list[str] = []
        self.sources: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        rng = random.Random(5)
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                kind = rng.choice(("customer", "order", "list"))
                try:
                    self._check(http, kind, rng)
                    self.ok += 1
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    self.errors.append(f"{kind}: {exc!r}"[:500])

    def _post(self, http: httpx.Client, query: str, variables: dict | None = None) -> dict:
        response = http.post(self.url, json={"query": query, "variables": variables})
        assert response.status_code == 200, response.text
        body = response.json()
        assert "errors" not in body, body
        for seen in body["extensions"]["freshness"].values():
            self.sources[seen["source"]] += 1
        return body["data"]

    def _check(self, http: httpx.Client, kind: str, rng: random.Random) -> None:
        if kind == "customer":
            key = rng.choice(sorted(self.customers))
            got = self._post(http, POINT_CUSTOMER, {"id": key})["customer"]
            want = self.customers[key]
            assert got == {"customerId": key, "name": want["name"], "tier": want["tier"]}, got
        elif kind == "order":
            key = rng.choice(sorted(self.orders))
            got = self._post(http, POINT_ORDER, {"id": key})["order"]
            want = self.orders[key]
            assert (got["orderId"], got["status"]) == (key, want["status"]), got
            assert got["amount"] == pytest.approx(want["amount"]), got
        else:
            got = self._post(http, PAID)["orders"]
            assert ([e["node"]["orderId"] for e in got["edges"]], got["totalCount"]) \
                == self.paid, got


def test_redis_flush_and_restart_answers_from_delta_and_rewarms(stack):
    customers = expected_customers(stack.customers)
    hammer = Hammer(stack.gateway.port, customers, expected_orders(stack.produced, customers))
    hammer.start()
    try:
        def more(count: int) -> None:
            target = hammer.ok + count
            wait_until(lambda: hammer.ok >= target or not hammer.is_alive(), timeout_s=120,
                       what=f"{count} more answers")

        more(30)
        stack.client.flushall()
        more(100)
        stack.redis_server.stop()
        more(100)  # Redis down: all from Delta
        stack.redis_server.start()
        more(100)
    finally:
        hammer.stop.set()
        hammer.join(60)
    assert hammer.errors == [], hammer.errors[:5]
    assert hammer.sources["delta"] > 0 and hammer.sources["redis"] > 0, hammer.sources

    # The engine carries on with the new Redis before the gateway re-warmed CustomerStats:
    # its changes still say what each row was (read from Delta), so an update is no insert.
    previous = expected_customer_stats(stack.produced)
    stats_start = stack.feed_end("CustomerStats")
    stack.produce(4)
    wait_until(lambda: delta_stats_exact(stack.settings, stack.produced), timeout_s=SETTLE_S,
               what="the engine to commit the orders after Redis came back")
    changed = _deduped(stack.feed("CustomerStats", stats_start))
    assert changed
    # The chunk may take more than one batch: a key's first change starts from the row
    # before the chunk, each later one from the change before it.
    last_row: dict[str, dict] = {}
    for _, event in changed:
        if event.key in last_row:
            assert event.op == "update", event
            assert event.before["order_count"] == last_row[event.key]["order_count"], event
        elif event.key in previous.index:
            assert event.op == "update", event
            assert event.before["order_count"] == previous.at[event.key, "order_count"], event
        else:
            assert (event.op, event.before) == ("insert", None), event
        last_row[event.key] = event.row

    # Re-warmed: a list over each view finds it incomplete and copies Delta into Redis.
    def complete() -> bool:
        done = all(stack.client.hexists(meta_key(v), complete_field(0)) for v in VIEWS)
        if not done:
            for query in LISTS.values():
                stack.gateway.query(query)
        return done
    wait_until(complete, timeout_s=120, what="every view re-warmed",
               log=stack.gateway.process.log_path)
    stack.wait_exact("after Redis came back")
    stack.alive()


# --- 4. the gateway restarted ------------------------------------------------------------


CHANGES = {"Order": "subscription($after: String) { orderChanges(after: $after) "
                    "{ op key version cursor } }",
           "CustomerStats": "subscription($after: String) { customerStatsChanges(after: $after) "
                            "{ op key version cursor } }"}


def _expected(stack: Stack, view: str, start: int) -> list[tuple[str, int, str, int]]:
    return _seen_through(stack.feed(view, start))


def test_gateway_restart_clients_resume_by_cursor_and_miss_nothing(stack, watchers):
    starts = {view: stack.feed_end(view) for view in CHANGES}
    first = {view: watchers.watch(stack.gateway.url, query,
                                  {"after": _cursor(view, starts[view] - 1)})
             for view, query in CHANGES.items()}
    stack.produce(5)
    stack.wait_exact("before the gateway restart")
    for view, watch in first.items():
        _caught_up(f"{view}'s changes before the restart", lambda w=watch, v=view:
                   _received([w], v), lambda v=view: _expected(stack, v, starts[v]))

    # The clients note their last cursor; the gateway dies; events keep coming.
    last = {view: _cursor(view, _received([watch], view)[-1][3]) for view, watch in first.items()}
    os.kill(stack.gateway.process.pid, signal.SIGKILL)
    stack.gateway.process.popen.wait(30)
    wait_until(lambda: all(w.closed for w in first.values()), timeout_s=60,
               what="the clients to see the connection close")
    stack.produce(6)
    stack.wait_exact("while the gateway is down")
    stack.gateway.start()

    # Resumed after their cursors: the missed changes in order, then live ones.
    second = {view: watchers.watch(stack.gateway.url, query, {"after": last[view]})
              for view, query in CHANGES.items()}
    stack.produce(7)
    stack.wait_exact("after the gateway restart")
    for view in CHANGES:
        want = _caught_up(f"{view}'s changes after the restart",
                          lambda v=view: _received([first[v], second[v]], v),
                          lambda v=view: _expected(stack, v, starts[v]))
        assert len(want) > len(_received([first[view]], view)), "no change to resume"
    stack.alive()
