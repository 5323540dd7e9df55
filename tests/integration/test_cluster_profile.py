"""The demo on the cluster profile (`viewgate up --cluster`): three KRaft brokers with
topics replicated three times and two replicas in sync to acknowledge, a Redis Cluster of
three masters with a replica each (redis-py's cluster client, `redis+cluster://`), a Spark
standalone master with two workers that run the engine's jobs, and the Delta tables and
Spark checkpoints in an S3 bucket (S3Proxy, through s3a:// and delta-rs). Faults one after the
other under load: a Spark worker dies with its executor, a broker dies, the Redis master
that holds `Order` dies (its replica takes over), the gateway restarts. Every view is then
exact, in Redis and in Delta, and a subscriber that resumed from its cursor across the
gateway's restart received every change of the feed once, in order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from engine_process import (
    EngineProcess,
    delta_stats_exact,
    feed_changes,
    feed_ends,
    in_time_events,
    start_on_customers,
)
from shop_views import (
    expected_customer_stats,
    expected_order_records,
    isolated,
    produce,
    view_mismatches,
)
from websockets.exceptions import ConnectionClosed
from ws_clients import GatewayServer, TransportWS

from engine.generations import switch_generations
from gateway.subscriptions.feed_cursor import decode_feed_cursor
from schema.object_store import s3_environment
from schema.redis_client import connect
from schema.storage import GRAPH_VERSION, ViewMeta, changefeed_topic, graph_key, meta_key
from viewgate.stack.kafka import KafkaCluster
from viewgate.stack.local import CLUSTER_ENGINE_PATH
from viewgate.stack.process import wait_until
from viewgate.stack.redis_cluster import RedisClusterServers
from viewgate.stack.s3proxy import S3ProxyServer
from viewgate.stack.spark_standalone import SparkStandalone

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PREFIX = "cprofile"
VIEWS = ("Customer", "OrderRecord", "Order", "CustomerStats", "ProductSales")
ORDER_CHANGES = ("subscription($after: String) { orderChanges(after: $after) "
                 "{ op key version cursor } }")


# The engine's two paths on the profile: the driver's (its defaults: the batches read
# ahead and computed by the driver), and the executors' (every batch read, computed and
# written to Delta by Spark's tasks on the workers, as `viewgate up --cluster` and
# compose's cluster profile run it). A profile each: the fault test leaves its profile
# short of a worker.
ENGINE_PATHS = {"driver": {}, "executors": CLUSTER_ENGINE_PATH}


@dataclass
class Profile:
    kafka: KafkaCluster
    redis: RedisClusterServers
    spark: SparkStandalone
    s3: S3ProxyServer
    engine_env: dict[str, str]  # the engine path's settings (ENGINE_PATHS)


@pytest.fixture(scope="module", params=list(ENGINE_PATHS))
def profile(request, base_settings, tmp_path_factory) -> Iterator[Profile]:
    root = tmp_path_factory.mktemp("cluster-profile")
    started = []
    try:
        for server in (KafkaCluster(root / "kafka", base_settings.jar_dir / "kafka"),
                       RedisClusterServers(root / "redis"), SparkStandalone(root / "spark"),
                       S3ProxyServer(root / "s3", base_settings.jar_dir / "s3proxy")):
            started.append(server)
            server.start()
        yield Profile(*started, ENGINE_PATHS[request.param])
    finally:
        for server in reversed(started):
            server.stop()


def test_a_rebuild_switches_views_on_different_masters_behind_the_graph_mark(
        profile, settings, tmp_path):
    """No transaction spans a cluster's slots: the views switch one by one, and the graph's
    `applying` mark (which readers of several views wait on) is gone once all switched."""
    settings = settings.model_copy(update={"data_dir": tmp_path / "data",
                                           "redis_url": profile.redis.url})
    client = connect(settings.redis_url)
    names = [f"Switched{i}" for i in range(20)]
    masters = {profile.redis.master_of(meta_key(n)).port: n for n in names}
    views = tuple(masters.values())[:2]  # two views on two masters
    assert len(views) == 2, masters
    try:
        for view in views:
            client.hset(meta_key(view), mapping={"generation": 0, "version": 7,
                                                 "version:g1": 3, "offsets:g1": "{}"})
        client.hset(graph_key(1), GRAPH_VERSION, 3)
        switch_generations(settings, client, dict.fromkeys(views, 1))
        for view in views:
            meta = ViewMeta.from_fields(client.hgetall(meta_key(view)))
            assert (meta.generation, meta.version) == (1, 3)
        assert client.hgetall(graph_key(1)) == {GRAPH_VERSION.encode(): b"3"}
    finally:
        client.delete(*(meta_key(v) for v in views))
        client.delete(graph_key(1))
        client.close()


class FeedReader:
    """Reads `orderChanges` as they come, in the background (a subscriber that stopped
    reading would be closed as too slow), and resumes from its last cursor when asked."""

    def __init__(self, gateway: GatewayServer) -> None:
        self.gateway = gateway
        self.changes: list[dict] = []
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        after = self.changes[-1]["cursor"] if self.changes else None
        client = await TransportWS.open(self.gateway.url)
        op = await client.subscribe(ORDER_CHANGES, {"after": after})
        await asyncio.to_thread(wait_until, lambda: self.gateway.stats()["subscribers"] >= 1,
                                timeout_s=30, what="the subscription to be live")
        self.task = asyncio.create_task(self._read(client, op))

    async def _read(self, client: TransportWS, op: str) -> None:
        try:
            while True:
                # Quiet for minutes at times (a failover, the gateway's restart).
                self.changes.append((await client.next(op, timeout_s=3600))["orderChanges"])
        except ConnectionClosed:
            return

    def last_offset(self) -> int:
        return decode_feed_cursor(self.changes[-1]["cursor"], "Order").offset \
            if self.changes else -1


def test_the_demo_rides_out_a_worker_a_broker_a_redis_master_and_a_gateway_restart(
        profile, settings, tmp_path, monkeypatch):
    spark_conf = {"spark.executor.memory": "768m", "spark.cores.max": "2"}
    storage = {"delta_root": "s3a://viewgate/profile/delta",
               "checkpoint_root": "s3a://viewgate/profile/checkpoints"}
    settings = isolated(settings, tmp_path / "data", redis_db=0).model_copy(update={
        "kafka_bootstrap": profile.kafka.bootstrap, "redis_url": profile.redis.url,
        "spark_master": profile.spark.master_url, "kafka_replication_factor": 3,
        "kafka_min_insync_replicas": 2, "spark_conf": spark_conf, **storage,
        **profile.s3.settings_update()})
    storage_env = {"VIEWGATE_DELTA_ROOT": storage["delta_root"],
                   "VIEWGATE_CHECKPOINT_ROOT": storage["checkpoint_root"], **profile.s3.env()}
    for name, value in s3_environment(settings).items():  # this process reads them too
        monkeypatch.setenv(name, value)
    client = connect(settings.redis_url)
    engine = EngineProcess(settings, tmp_path, PREFIX, **storage_env,
                           VIEWGATE_SPARK_MASTER=profile.spark.master_url,
                           VIEWGATE_KAFKA_REPLICATION_FACTOR="3",
                           VIEWGATE_KAFKA_MIN_INSYNC_REPLICAS="2",
                           VIEWGATE_SPARK_CONF=json.dumps(spark_conf), **profile.engine_env)
    gateway = GatewayServer(settings, tmp_path, PREFIX, **storage_env)
    customers, orders = in_time_events(PREFIX, 2000)
    parts = [orders[i * len(orders) // 5:(i + 1) * len(orders) // 5] for i in range(5)]

    def exact(upto: int, what: str) -> None:
        done = [o for part in parts[:upto] for o in part]
        wait_until(lambda: view_mismatches(client, customers, done) == [], timeout_s=300,
                   what=f"every view to match the orders {what}")

    try:
        start_on_customers(engine, customers)
        produce(settings.kafka_bootstrap, parts[0])
        exact(1, "of the first part")
        _assert_replicated(settings.kafka_bootstrap, changefeed_topic("Order"))
        app, = profile.spark.state()["activeapps"]
        assert app["cores"] == 2, app  # the engine's jobs run on both workers' executors
        gateway.start()
        feed_start = feed_ends(settings.kafka_bootstrap, "Order")

        async def faults() -> FeedReader:
            reader = FeedReader(gateway)
            await reader.start()
            # A worker dies, its executor with it, while the engine works through a part.
            await asyncio.to_thread(produce, settings.kafka_bootstrap, parts[1])
            profile.spark.kill_worker(1)
            await asyncio.to_thread(exact, 2, "after a Spark worker died")
            # A broker dies: two of three replicas still acknowledge every write.
            broker = profile.kafka.nodes[1].process
            os.kill(broker.pid, signal.SIGKILL)
            broker.popen.wait(30)
            await asyncio.to_thread(produce, settings.kafka_bootstrap, parts[2])
            await asyncio.to_thread(exact, 3, "after a Kafka broker died")
            # The Redis master of Order dies; its replica takes over.
            doomed = profile.redis.master_of(meta_key("Order"))
            os.kill(doomed.process.pid, signal.SIGKILL)
            await asyncio.to_thread(
                wait_until, lambda: profile.redis.master_of(meta_key("Order")) is not doomed
                and profile.redis.healthy(), timeout_s=60, what="a replica to take over")
            await asyncio.to_thread(produce, settings.kafka_bootstrap, parts[3])
            await asyncio.to_thread(exact, 4, "after a Redis master failed over")
            # The gateway restarts; the subscriber resumes from its last cursor.
            await asyncio.to_thread(gateway.stop)
            await reader.task
            # From this thread: a child started from a worker thread would get SIGTERM when
            # that thread ends (the die-with-parent signal follows the thread).
            gateway.start()
            await reader.start()
            await asyncio.to_thread(produce, settings.kafka_bootstrap, parts[4])
            await asyncio.to_thread(exact, 5, "after the gateway restarted")
            end = feed_ends(settings.kafka_bootstrap, "Order")[0]
            await asyncio.to_thread(wait_until, lambda: reader.last_offset() == end - 1,
                                    timeout_s=120, what="the subscriber to reach the feed's end")
            return reader

        reader = asyncio.run(faults())
        feed = feed_changes(settings.kafka_bootstrap, "Order", feed_start)
        got = [(c["key"], c["op"], c["version"]) for c in reader.changes]
        assert got == [(e.key, e.op.upper(), e.version) for _, e in feed]
        wait_until(lambda: delta_stats_exact(settings, orders), timeout_s=120,
                   what="CustomerStats in Delta to count every order once")
        assert engine.process.poll() is None, f"the engine exited:\n{engine.log_tail()}"
        if profile.engine_env:  # the workers' tasks computed the views and wrote Delta
            for view in ("OrderRecord", "CustomerStats"):
                assert (engine.metric("viewgate_graph_delta_commits_by_tasks_total",
                                      view=view, by="tasks") or 0) > 0, view

        stats = expected_customer_stats(orders)
        customer = stats.index[0]
        answer = gateway.query(f'{{ customerStats(customerId: "{customer}") '
                               "{ orderCount totalSpent } }")
        assert "errors" not in answer, answer
        got_stats = answer["data"]["customerStats"]
        assert got_stats["orderCount"] == stats.loc[customer].order_count
        assert got_stats["totalSpent"] == pytest.approx(stats.loc[customer].total_spent)
        # A list page by a score index (a script run through the cluster pipeline).
        paid = sorted((o["amount"], k) for k, o in expected_order_records(orders).items()
                      if o["status"] == "paid")
        page = gateway.query('{ orders(where: {status: {eq: "paid"}}, orderBy: {field: AMOUNT}, '
                             "first: 50) { totalCount edges { node { orderId } } } }")
        assert "errors" not in page, page
        assert page["data"]["orders"]["totalCount"] == len(paid)
        assert [e["node"]["orderId"] for e in page["data"]["orders"]["edges"]] == [
            k for _, k in paid[:50]]
    finally:
        gateway.stop()
        engine.stop()
        client.close()


def _assert_replicated(bootstrap: str, topic: str) -> None:
    """The engine created `topic` with three replicas and two of them in sync to ack."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
    assert {len(p.replicas) for p in partitions} == {3}
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["min.insync.replicas"].value == "2"


def test_two_gateways_share_nothing_but_redis_and_kafka_and_one_rate_limit(
        profile, settings, tmp_path):
    """Two gateway processes on the profile: the same answers, and a client's rate limit
    (its token bucket lives in the Redis Cluster) holds across both."""
    settings = settings.model_copy(update={
        "data_dir": tmp_path / "data", "kafka_bootstrap": profile.kafka.bootstrap,
        "redis_url": profile.redis.url})
    limits = {"VIEWGATE_GATEWAY_RATE_LIMIT_PER_S": "0.01", "VIEWGATE_GATEWAY_RATE_LIMIT_BURST": "4",
              "VIEWGATE_GATEWAY_CLIENT_ADDRESS_HEADER": "X-Forwarded-For"}
    gateways = [GatewayServer(settings, tmp_path, PREFIX, **limits) for _ in range(2)]
    try:
        for gateway in gateways:
            gateway.start()
        query = {"query": "{ views { name } }"}
        client = {"x-forwarded-for": "192.0.2.77"}
        answers = [httpx.post(f"http://127.0.0.1:{gateways[i % 2].port}/graphql", json=query,
                              headers=client, timeout=10) for i in range(6)]
        assert [a.status_code for a in answers] == [200, 200, 200, 200, 429, 429]
        assert answers[0].json() == answers[1].json()  # one from each gateway
        other = httpx.post(f"http://127.0.0.1:{gateways[1].port}/graphql", json=query,
                           headers={"x-forwarded-for": "192.0.2.78"}, timeout=10)
        assert other.status_code == 200
    finally:
        for gateway in gateways:
            gateway.stop()
