"""A browser tab's change feed survives dropped connections while other tabs come and go:
the reference `graphql-ws` client from npm (what the dashboard bundles, as browsers run it)
subscribes to `customerChanges` through a proxy the test cuts, reconnects by itself and
subscribes again from the cursor of the last change it got. Every change of the feed
reaches it exactly once, in feed order, while churning tabs (viewgate.bench.tab_clients)
open, subscribe and close beside it; afterwards the gateway holds no websocket,
subscription or task of theirs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from shop_views import catalog_on, isolated, produce, run_once, shop_events
from ws_clients import GatewayServer

from gateway.subscriptions.feed_cursor import FeedCursor, decode_feed_cursor, encode_feed_cursor
from schema.storage import changefeed_topic
from viewgate.bench.servers import LIMITS_OFF
from viewgate.bench.tab_clients import churn_tabs
from viewgate.stack.dashboard import DASHBOARD_DIR, build_dashboard
from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "tabs"
SCRIPT = Path(__file__).with_name("graphql_ws_resume.cjs")


class DropProxy:
    """A TCP proxy to the gateway (its own event loop in a thread) whose `cut()` aborts
    every connection through it, as a network drop does."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.transports: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop).result(10)
        self.server = server
        self.port = server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.transports.update((writer, up_writer))

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.transport.abort()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.transports.difference_update((writer, up_writer))

    def cut(self) -> None:
        def abort() -> None:
            for writer in list(self.transports):
                writer.transport.abort()
        self.loop.call_soon_threadsafe(abort)

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            for writer in list(self.transports):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class NodeTab:
    """graphql_ws_resume.cjs; its lines are collected by a thread as they come."""

    def __init__(self, url: str, after: str) -> None:
        node = shutil.which("node")
        if node is None:
            pytest.fail("node is missing: install Node.js 20 or newer")
        self.lines: list[dict] = []
        self.process = subprocess.Popen(
            [node, "--experimental-websocket", "--no-warnings", str(SCRIPT), url, after],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "NODE_PATH": str(DASHBOARD_DIR / "node_modules")})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def changes(self) -> list[dict]:
        return [line["change"] for line in list(self.lines) if "change" in line]

    def count(self, kind: str) -> int:
        return sum(1 for line in list(self.lines) if kind in line)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> str:
        self.process.terminate()
        try:
            _, err = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate(timeout=10)
        return err


@pytest.fixture(scope="module")
def shop(spark, settings, tmp_path_factory):
    settings = isolated(settings, tmp_path_factory.mktemp("tabs"), redis_db=23)
    settings = settings.model_copy(update={"changefeed_prefix": f"{PREFIX}.changes."})
    catalog = catalog_on(PREFIX)
    customers, orders = shop_events(PREFIX, seed=37, count=300)
    produce(settings.kafka_bootstrap, customers)
    run_once(spark, settings, catalog)
    produce(settings.kafka_bootstrap, orders)
    run_once(spark, settings, catalog)
    keys = sorted({key for _, key, _ in customers})
    rows = {key: json.loads(value) for _, key, value in customers if value is not None}
    return spark, settings, catalog, keys, rows


@pytest.fixture(scope="module")
def gateway(shop, tmp_path_factory) -> Iterator[GatewayServer]:
    _, settings, *_ = shop
    server = GatewayServer(settings, tmp_path_factory.mktemp("tabs-logs"), PREFIX, **LIMITS_OFF)
    try:
        yield server.start()
    finally:
        server.stop()


def _feed(settings, start: int) -> list[int]:
    """Offsets of the Customer change feed from `start` to its end."""
    topic = changefeed_topic("Customer", settings.changefeed_prefix)
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "tabs"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return list(range(start, high))
    finally:
        consumer.close()


def test_graphql_ws_client_resumes_from_its_cursor_under_churn(shop, gateway) -> None:
    spark, settings, catalog, keys, rows = shop
    build_dashboard()  # its node_modules hold graphql-ws
    before = gateway.stats()
    start = _feed(settings, 0)[-1] + 1 if _feed(settings, 0) else 0
    after = encode_feed_cursor(FeedCursor("Customer", 0, start - 1))
    proxy = DropProxy(gateway.port)
    churned: dict = {}
    churn = threading.Thread(target=lambda: churned.update(churn_tabs(
        gateway.url, 20, 12, keys[0], keys[1:], 0.3, None)), daemon=True)
    tab = NodeTab(f"ws://127.0.0.1:{proxy.port}/graphql", after)
    try:
        wait_until(lambda: tab.count("connected") == 1, timeout_s=30,
                   what="the graphql-ws client connected", alive=tab.alive)
        churn.start()
        proxy.cut()  # a drop with nothing new: it reconnects and resumes from `after`
        wait_until(lambda: tab.count("connected") >= 2, timeout_s=30,
                   what="the client reconnected", alive=tab.alive)
        topic = catalog.sources["customers"].topic
        for round_ in range(2):
            produce(settings.kafka_bootstrap, [
                (topic, key, json.dumps(dict(rows[key], name=f"r{round_}-{key}")).encode())
                for key in keys[:12]])
            run_once(spark, settings, catalog)
            proxy.cut()  # changes on their way to it, or not yet read: it must miss none
            expected = _feed(settings, start)
            wait_until(lambda r=round_: tab.count("connected") >= 3 + r, timeout_s=30,
                       what="the client reconnected", alive=tab.alive)
            count = len(expected)
            wait_until(lambda n=count: len(tab.changes()) >= n, timeout_s=60,
                       what=f"{count} changes at the client", alive=tab.alive)
        churn.join(60)
    finally:
        err = tab.stop()
        proxy.close()
    offsets = [decode_feed_cursor(c["cursor"], "Customer").offset for c in tab.changes()]
    assert offsets == expected, err  # every change once, in feed order: no gap, no repeat
    assert {c["key"] for c in tab.changes()} == set(keys[:12])
    assert tab.count("connected") >= 4, tab.lines  # the first and after each of 3 cuts
    assert not tab.count("failed"), tab.lines
    assert churned["started"] == 240 and churned["completed"] == 240, churned
    assert churned["failures"] == 0, churned
    # The churned tabs and the dropped connections left nothing behind in the gateway.
    wait_until(lambda: gateway.stats()["websockets"] == before["websockets"]
               and gateway.stats()["subscribers"] == before["subscribers"]
               and gateway.stats()["tasks"] == before["tasks"], timeout_s=30,
               what=f"the gateway back to {before} (now {gateway.stats()})")
