"""Subscriptions over websockets against a real gateway process (uvicorn), fed by the real
engine's change feed: live values by key, changes of a filtered list relative to the
filter, live lists (multiplexed, coalesced, not re-sent when unchanged), resuming by
cursor and by version without gap or repeat, expired cursors, and bad protocol input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from shop_views import (
    Record,
    catalog_on,
    expected_customers,
    isolated,
    produce,
    run_once,
    shop_events,
)
from ws_clients import GatewayServer, LegacyWS, TransportWS, small_socket

from gateway.subscriptions.feed_cursor import FeedCursor, decode_feed_cursor, encode_feed_cursor
from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import ChangeEvent, changefeed_topic
from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "subs"
CHANGE = "op key version cursor row { customerId name tier } before { tier }"
ORDER_CHANGE = "op key version cursor row { orderId status amount }"


@dataclass
class Shop:
    spark: object
    settings: Settings
    catalog: Catalog
    customers: dict[str, dict]
    orders: dict[str, dict]

    def topic(self, source: str) -> str:
        return self.catalog.sources[source].topic

    def commit(self, records: list[Record]) -> None:
        """Events in, one engine run over them (every view)."""
        produce(self.settings.kafka_bootstrap, records)
        run_once(self.spark, self.settings, self.catalog)

    def customer(self, key: str, **changes) -> Record:
        row = self.customers[key] = {**self.customers.get(key, {"customer_id": key}), **changes}
        return self.topic("customers"), key, json.dumps(row).encode()

    def order(self, key: str, **changes) -> Record:
        row = self.orders[key] = {**self.orders[key], **changes}
        return self.topic("orders"), key, json.dumps(row).encode()

    def feed(self, view: str, start: int) -> list[tuple[int, ChangeEvent]]:
        """The view's change feed from `start` to its end, as Kafka holds it."""
        topic = changefeed_topic(view, self.settings.changefeed_prefix)
        consumer = Consumer({"bootstrap.servers": self.settings.kafka_bootstrap,
                             "group.id": "subs-test"})
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            consumer.assign([TopicPartition(topic, 0, start)])
            events: list[tuple[int, ChangeEvent]] = []
            wait_until(lambda: _read_into(consumer, events, high - start), timeout_s=60,
                       what=f"{view}'s change feed")
            return events
        finally:
            consumer.close()

    def feed_end(self, view: str) -> int:
        consumer = Consumer({"bootstrap.servers": self.settings.kafka_bootstrap,
                             "group.id": "subs-test"})
        try:
            topic = changefeed_topic(view, self.settings.changefeed_prefix)
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        finally:
            consumer.close()


def _read_into(consumer: Consumer, events: list, count: int) -> bool:
    for message in consumer.consume(500, timeout=0.5):
        if not message.error():
            events.append((message.offset(), ChangeEvent.from_bytes(message.value())))
    return len(events) >= count


@pytest.fixture(scope="module")
def shop(spark, settings, tmp_path_factory) -> Shop:
    settings = isolated(settings, tmp_path_factory.mktemp("subscriptions"), redis_db=6)
    settings = settings.model_copy(update={"changefeed_prefix": f"{PREFIX}.changes."})
    catalog = catalog_on(PREFIX)
    customers, orders = shop_events(PREFIX, seed=23, count=500)
    shop = Shop(spark, settings, catalog, expected_customers(customers),
                expected_customers(orders))
    shop.commit(customers)  # customers first, so orders find them (stream-static join)
    shop.commit(orders)
    return shop


@pytest.fixture(scope="module")
def gateway(shop: Shop, tmp_path_factory) -> Iterator[GatewayServer]:
    server = GatewayServer(shop.settings, tmp_path_factory.mktemp("gateway-logs"), PREFIX)
    try:
        yield server.start()
    finally:
        server.stop()


def _subscribers(server: GatewayServer, count: int) -> None:
    """Wait until exactly `count` subscriptions are registered (closed ones unregistered)."""
    wait_until(lambda: server.stats()["subscribers"] == count, timeout_s=30,
               what=f"{count} subscribers")


def _gold(shop: Shop, outside: set[str] = frozenset(), count: int = 1) -> list[str]:
    return [k for k, c in sorted(shop.customers.items())
            if c["tier"] == "gold" and k not in outside][:count]


def _by_id(messages: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for message in messages:
        assert message["type"] in ("next", "data"), message
        out.setdefault(message["id"], []).append(message["payload"]["data"])
    return out


def test_live_value_by_key_sends_the_row_then_its_versions_and_its_deletion(shop, gateway):
    async def scenario() -> None:
        client = await TransportWS.open(gateway.url)
        kept, gone = sorted(shop.customers)[:2]
        query = f"subscription($id: String!) {{ customer(customerId: $id) {{ {CHANGE} }} }}"
        first = await client.subscribe(query, {"id": kept})
        current = (await client.next(first))["customer"]
        assert current["op"] == "CURRENT" and current["key"] == kept
        assert current["row"]["name"] == shop.customers[kept]["name"]
        second = await client.subscribe(query, {"id": gone})
        assert (await client.next(second))["customer"]["op"] == "CURRENT"

        await asyncio.to_thread(shop.commit, [
            shop.customer(kept, name="Renamed Once"),
            (shop.topic("customers"), gone, None)])
        got = _by_id(await client.take(2))
        update, = got[first]
        assert update["customer"]["op"] == "UPDATE"
        assert update["customer"]["row"]["name"] == "Renamed Once"
        assert update["customer"]["version"] > current["version"]
        deletion, = got[second]
        assert deletion["customer"]["op"] == "DELETE" and deletion["customer"]["row"] is None
        shop.customers.pop(gone)
        await client.close()
    asyncio.run(scenario())


def test_filtered_changes_are_relative_to_the_filter(shop, gateway):
    """Over the legacy graphql-ws protocol: a row entering the filter is an INSERT, one
    leaving it a DELETE, and a change outside it is sent to nobody."""
    async def scenario() -> None:
        client = await LegacyWS.open(gateway.url)
        op = await client.subscribe(
            f'subscription {{ customerChanges(where: {{tier: {{eq: "gold"}}}}) {{ {CHANGE} }} }}')
        await asyncio.to_thread(_subscribers, gateway, 1)
        demoted, renamed, deleted = _gold(shop, count=3)
        silver = [k for k, c in sorted(shop.customers.items()) if c["tier"] == "silver"][:2]
        promoted, ignored = silver
        delivered = gateway.stats()["delivered"]
        await asyncio.to_thread(shop.commit, [
            shop.customer(demoted, tier="silver"),
            shop.customer(renamed, name="Still Gold"),
            (shop.topic("customers"), deleted, None),
            shop.customer(promoted, tier="gold"),
            shop.customer(ignored, name="Silver Renamed"),
            shop.customer("C-NEW-GOLD", name="New", tier="gold", country="DE"),
        ])
        shop.customers.pop(deleted)
        got = {m["customerChanges"]["key"]: m["customerChanges"]
               for m in _by_id(await client.take(5))[op]}
        assert {k: c["op"] for k, c in got.items()} == {
            demoted: "DELETE", renamed: "UPDATE", deleted: "DELETE", promoted: "INSERT",
            "C-NEW-GOLD": "INSERT"}
        assert got[demoted]["row"]["tier"] == "silver" and got[demoted]["before"]["tier"] == "gold"
        assert got[deleted]["row"] is None
        assert got[promoted]["before"]["tier"] == "silver"
        # Everything the engine published was dispatched, and only those five were sent.
        end = shop.feed_end("Customer")
        await asyncio.to_thread(wait_until, lambda: gateway.stats()["positions"]["Customer"]
                                == end, timeout_s=30, what="the gateway to read the feed")
        assert gateway.stats()["delivered"] - delivered == 5
        await client.close()
    asyncio.run(scenario())


def test_live_list_is_shared_resent_on_change_and_not_when_unchanged(shop, gateway):
    query = ('subscription { customers(where: {tier: {eq: "gold"}}, orderBy: {field: COUNTRY}, '
             'first: 3) { totalCount edges { node { customerId name country } } } }')

    async def scenario() -> None:
        a = await TransportWS.open(gateway.url)
        b = await TransportWS.open(gateway.url)
        evaluations = gateway.stats()["evaluations"]
        page = (await a.next(await a.subscribe(query)))["customers"]
        op_b = await b.subscribe(query)
        assert (await b.next(op_b))["customers"] == page
        stats = gateway.stats()
        assert stats["evaluations"] == evaluations + 1  # two subscribers, one evaluation
        assert stats["liveLists"] == 1
        shown = [e["node"]["customerId"] for e in page["edges"]]

        # A change the filter sees but the page does not show: evaluated, not sent.
        outside = _gold(shop, set(shown), count=20)
        assert len(outside) >= 3
        evaluations = gateway.stats()["evaluations"]
        await asyncio.to_thread(shop.commit, [shop.customer(outside[0], name="Off Page")])
        await asyncio.to_thread(wait_until, lambda: gateway.stats()["evaluations"]
                                > evaluations, timeout_s=60, what="a re-evaluation")

        # A burst that alters the page (a change to every gold customer): one new page, the
        # first message since, and one or two evaluations for the whole burst.
        evaluations = gateway.stats()["evaluations"]
        await asyncio.to_thread(shop.commit, [shop.customer(shown[0], name="On Page")] + [
            shop.customer(k, name=f"Burst {i}") for i, k in enumerate(outside[1:])])
        for client in (a, b):
            new = (await client.next("1"))["customers"]
            assert new["edges"][0]["node"]["name"] == "On Page", (page, new, shown, outside)
            assert new["totalCount"] == page["totalCount"]
        assert gateway.stats()["evaluations"] - evaluations <= 2
        await a.close()
        await b.close()
    asyncio.run(scenario())


def test_resume_by_cursor_and_by_version_replays_exactly_the_missed_changes(shop, gateway):
    query = ("subscription($after: String, $v: Int) { orderChanges(after: $after, "
             f"afterVersion: $v) {{ {ORDER_CHANGE} }} }}")
    keys = sorted(shop.orders)

    async def scenario() -> None:
        first = await TransportWS.open(gateway.url)
        op = await first.subscribe(query)
        await asyncio.to_thread(_subscribers, gateway, 1)
        await asyncio.to_thread(shop.commit, [shop.order(k, status="paid") for k in keys[:3]])
        seen = [(await first.next(op))["orderChanges"] for _ in range(3)]
        cursor, version = seen[-1]["cursor"], seen[-1]["version"]
        assert {m["key"] for m in seen} == set(keys[:3])
        await first.close()

        # Missed while disconnected: updates, a new order and a deletion.
        new_order = dict(shop.orders[keys[0]], order_id="O-NEW-1", status="placed")
        shop.orders["O-NEW-1"] = new_order
        await asyncio.to_thread(shop.commit, [
            # A status none of them has yet: Order is a view over views, whose feed
            # carries real changes only (an event that leaves a row as it was is none).
            *[shop.order(k, status="returned") for k in keys[3:7]],
            (shop.topic("orders"), "O-NEW-1", json.dumps(new_order).encode()),
            (shop.topic("orders"), keys[7], None)])
        missed = [(e.key, e.op.upper()) for _, e in
                  shop.feed("Order", decode_feed_cursor(cursor, "Order").offset + 1)]
        assert len(missed) == 6 and missed[-1] != missed[0]

        by_cursor = await TransportWS.open(gateway.url)
        by_version = await TransportWS.open(gateway.url)
        op_c = await by_cursor.subscribe(query, {"after": cursor})
        op_v = await by_version.subscribe(query, {"v": version})
        for client, op_id in ((by_cursor, op_c), (by_version, op_v)):
            got = [(await client.next(op_id))["orderChanges"] for _ in missed]
            assert [(m["key"], m["op"]) for m in got] == missed

        # Then live, with nothing repeated: the next message is the next change.
        await asyncio.to_thread(shop.commit, [shop.order(keys[8], status="cancelled")])
        for client, op_id in ((by_cursor, op_c), (by_version, op_v)):
            live = (await client.next(op_id))["orderChanges"]
            assert (live["key"], live["op"]) == (keys[8], "UPDATE")
            await client.close()
    asyncio.run(scenario())


def test_bad_input_gets_protocol_errors_and_the_server_keeps_serving(shop, gateway):
    async def scenario() -> None:
        client = await TransportWS.open(gateway.url)
        for document in ('subscription { customer(customerId: "NO-SUCH") { op } }',
                         "subscription { customer(customerId: ) { op } }",
                         "subscription { noSuchField }",
                         'subscription { customerChanges(after: "garbage") { op } }'):
            op = await client.subscribe(document)
            message = await client.receive()
            assert (message["type"], message["id"]) == ("error", op), message
        assert message["payload"][0]["extensions"]["code"] == "BAD_CURSOR"
        op = await client.subscribe("subscription { customers(first: 100000) { totalCount } }")
        message = await client.receive()
        assert message["type"] == "error"
        assert message["payload"][0]["extensions"]["code"] == "LIMIT_PAGE_SIZE"
        await client.send({"id": "named", "type": "subscribe", "payload": {
            "query": "subscription A { customerChanges { op } }", "operationName": "B"}})
        message = await client.receive()
        assert (message["type"], message["id"]) == ("error", "named"), message
        key = sorted(shop.customers)[0]
        op = await client.subscribe(f'subscription {{ customer(customerId: "{key}") {{ op }} }}')
        assert (await client.next(op))["customer"]["op"] == "CURRENT"  # still open

        # graphql-transport-ws: a malformed message closes with 4400, as its spec says.
        await client.ws.send("not json")
        await asyncio.wait_for(client.ws.wait_closed(), 30)
        assert client.ws.close_code == 4400

        # The legacy protocol answers with `error`, and keeps alive with `ka`.
        legacy = await LegacyWS.open(gateway.url)
        op = await legacy.subscribe('subscription { customer(customerId: "NO-SUCH") { op } }')
        error = await legacy.receive()
        assert error["type"] == "error" and error["payload"]["extensions"]["code"] == "NOT_FOUND"
        await legacy.close()
        raw = await LegacyWS.open(gateway.url)
        assert json.loads(await asyncio.wait_for(raw.ws.recv(), 30))["type"] == "ka"
        await raw.close()
    asyncio.run(scenario())


def test_two_gateway_processes_serve_their_subscribers_from_the_same_feed(
        shop, gateway, tmp_path):
    other = GatewayServer(shop.settings, tmp_path, PREFIX)
    try:
        other.start()

        async def scenario() -> None:
            key = _gold(shop)[0]
            query = f'subscription {{ customer(customerId: "{key}") {{ {CHANGE} }} }}'
            clients = [await TransportWS.open(gateway.url), await TransportWS.open(other.url)]
            for client in clients:
                assert (await client.next(await client.subscribe(query)))["customer"]["op"] \
                    == "CURRENT"
            await asyncio.to_thread(shop.commit, [shop.customer(key, name="Seen Twice")])
            got = [(await client.next("1"))["customer"] for client in clients]
            assert [g["row"]["name"] for g in got] == ["Seen Twice", "Seen Twice"]
            assert got[0]["cursor"] == got[1]["cursor"]
            for client in clients:
                await client.close()
        asyncio.run(scenario())
    finally:
        other.stop()


def test_a_slow_client_is_closed_and_the_others_keep_receiving(shop, tmp_path):
    server = GatewayServer(shop.settings, tmp_path, PREFIX,
                           VIEWGATE_GATEWAY_SUBSCRIPTION_BUFFER="600")
    query = f"subscription {{ orderChanges {{ {ORDER_CHANGE} }} }}"
    template = next(iter(shop.orders.values()))
    new = {f"O-BULK-{i:05d}": dict(template, order_id=f"O-BULK-{i:05d}") for i in range(2000)}
    try:
        server.start()

        async def scenario() -> None:
            fast = await TransportWS.open(server.url)
            # A client that stops reading (a tiny receive buffer, one queued message) with
            # 20 subscriptions: more than the kernel's socket buffers hold.
            slow = await TransportWS.open(server.url, max_queue=1, compression=None,
                                          sock=small_socket(server.port))
            op = await fast.subscribe(query)
            for _ in range(20):
                await slow.subscribe(query)
            await asyncio.to_thread(_subscribers, server, 21)
            await asyncio.to_thread(shop.commit, [
                (shop.topic("orders"), k, json.dumps(v).encode()) for k, v in new.items()])
            got = set()
            while got != set(new):
                got.add((await fast.next(op))["orderChanges"]["key"])
            assert server.stats()["overflows"] == 1
            with pytest.raises(Exception):  # noqa: B017 - read until the close
                while True:
                    await asyncio.wait_for(slow.ws.recv(), 60)
            assert slow.ws.close_code == 4008
            assert "too slow" in slow.ws.close_reason
            await fast.close()
        asyncio.run(scenario())
        shop.orders.update(new)
    finally:
        server.stop()


def test_an_expired_cursor_says_to_query_again(shop, gateway):
    topic = changefeed_topic("Customer", shop.settings.changefeed_prefix)
    end = shop.feed_end("Customer")
    assert end > 0
    admin = AdminClient({"bootstrap.servers": shop.settings.kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, end)]).values():
        future.result(timeout=30)

    async def scenario() -> None:
        client = await TransportWS.open(gateway.url)
        old = encode_feed_cursor(FeedCursor("Customer", 0, 0))
        for variables in ({"after": old}, {"v": 0}):
            op = await client.subscribe(
                "subscription($after: String, $v: Int) { customerChanges(after: $after, "
                "afterVersion: $v) { op } }", variables)
            message = await client.receive()
            assert (message["type"], message["id"]) == ("error", op), message
            error = message["payload"][0]
            assert error["extensions"]["code"] == "CURSOR_EXPIRED"
            assert "query the view again" in error["message"]
        await client.close()
    asyncio.run(scenario())


def test_a_rebuild_refreshes_live_values_and_ends_change_streams(shop, gateway):
    """Runs last: it switches Customer to generation 1."""
    from engine.rebuild import rebuild_view

    key = _gold(shop)[0]

    async def scenario() -> None:
        client = await TransportWS.open(gateway.url)
        live = await client.subscribe(f'subscription {{ customer(customerId: "{key}") '
                                      f'{{ {CHANGE} }} }}')
        assert (await client.next(live))["customer"]["op"] == "CURRENT"
        changes = await client.subscribe("subscription { customerChanges { op } }")
        await asyncio.to_thread(_subscribers, gateway, 2)

        result = await asyncio.to_thread(rebuild_view, shop.spark, shop.settings,
                                         shop.catalog, "Customer")
        assert result.new_generation == 1
        got: dict[str, list[dict]] = {}
        for message in await client.take(3):
            got.setdefault(message["id"], []).append(message)
        fresh = got[live][0]["payload"]["data"]["customer"]
        assert fresh["op"] == "CURRENT" and fresh["row"]["name"] == shop.customers[key]["name"]
        assert decode_feed_cursor(fresh["cursor"], "Customer").generation == 1
        ended = got[changes]
        assert [m["type"] for m in ended] == ["next", "complete"]
        assert ended[0]["payload"]["errors"][0]["extensions"]["code"] == "GENERATION_CHANGED"
        assert "query it again" in ended[0]["payload"]["errors"][0]["message"]
        await client.close()
    asyncio.run(scenario())
