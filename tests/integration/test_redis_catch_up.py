"""Redis loses a batch the engine already applied, and the engine takes it back from Delta.

The window: Redis is flushed between a batch's Redis apply and its Delta commit, and the
gateway re-warms the view from the Delta snapshot before that batch. Redis then says it
holds the older batch, with its rows; the engine's next batch finds Redis one batch short
and brings the rows the lost batch changed up to date from Delta. Real Redis, Kafka, Delta,
the engine's committer and the gateway's own re-warm; Spark only creates the tables.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from engine_process import feed_changes, feed_ends
from shop_views import catalog_on, isolated, redis_rows

import engine.commit
from engine.commit import ViewCommitter
from engine.runner import prepare
from gateway.reads.reads import Reads
from schema.storage import ViewMeta, index_entry, index_key, meta_key

pytestmark = pytest.mark.integration

PREFIX = "catch-up.changes."


def customer(key: str, tier: str) -> dict:
    return {"customer_id": key, "name": f"name {key}", "tier": tier, "country": "NL"}


def tier_indexed(client: redis.Redis, key: str, tier: str) -> bool:
    _, member = index_entry(str, tier, key)
    return client.zscore(index_key("Customer", 0, "tier"), member) is not None


def test_rows_of_a_batch_redis_lost_before_its_delta_commit_come_back(
        spark, settings, tmp_path, monkeypatch):
    settings = isolated(settings, tmp_path, redis_db=20).model_copy(
        update={"changefeed_prefix": PREFIX})
    catalog = catalog_on("catch-up")
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    prepare(spark, settings, catalog)
    view = catalog.view("Customer")
    committer = ViewCommitter(settings, view, 0, ("customer_id",))
    committer.commit(0, [customer("A", "gold"), customer("B", "silver"),
                         customer("C", "bronze")])

    async def gateway_rewarm() -> bool:
        reads = Reads(catalog, settings)
        try:
            return await reads.warm_all(view)
        finally:
            await reads.close()

    def lose_redis(step: str, view_name: str) -> None:
        if step == "after_changefeed":  # batch 1 is in Redis and the feed, not in Delta
            client.flushdb()
            assert asyncio.run(gateway_rewarm())

    monkeypatch.setattr(engine.commit, "failpoint", lose_redis)
    committer.commit(1, [customer("A", "platinum")], [{"customer_id": "C"}])
    monkeypatch.undo()
    # The gap: Redis holds batch 0 again (rows, indexes and fence), Delta holds batch 1.
    assert ViewMeta.from_fields(client.hgetall(meta_key("Customer"))).version == 0
    assert redis_rows(client, "Customer")["A"]["tier"] == "gold"
    assert "C" in redis_rows(client, "Customer")

    start = feed_ends(settings.kafka_bootstrap, "Customer", PREFIX)
    committer.commit(2, [customer("D", "gold")])

    assert redis_rows(client, "Customer") == {
        "A": customer("A", "platinum"), "B": customer("B", "silver"), "D": customer("D", "gold")}
    assert ViewMeta.from_fields(client.hgetall(meta_key("Customer"))).version == 2
    assert tier_indexed(client, "A", "platinum") and not tier_indexed(client, "A", "gold")
    assert not tier_indexed(client, "C", "bronze") and tier_indexed(client, "D", "gold")
    # Batch 1's changes went out with batch 1; batch 2 publishes only its own.
    changes = feed_changes(settings.kafka_bootstrap, "Customer", start, PREFIX)
    assert [(e.key, e.op, e.version) for _, e in changes] == [("D", "insert", 2)]
    client.close()
