"""A graph query started again in one process (after a failure, or to follow a rebuild)
releases what the stopped query's batch function held: its producers, its read-ahead
process, its tables' key indexes. Spark keeps the stopped function itself referenced from
the JVM, so nothing else would. A query still running keeps all of it."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import redis
from shop_views import catalog_on, isolated, produce, shop_events, view_mismatches

from engine.graph import GraphBatch, start_graph_query
from engine.query_resources import held, release_stopped
from engine.read_ahead import ReadAhead
from engine.runner import prepare
from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "resources"


def _closed(producer) -> bool:
    try:
        producer.flush(0)
    except RuntimeError:  # "Producer has been closed"
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_graph_query_started_again_releases_what_the_stopped_one_held(spark, settings,
                                                                        tmp_path):
    settings = isolated(settings, tmp_path, redis_db=31)
    client = redis.Redis.from_url(settings.redis_url)
    catalog = catalog_on(PREFIX)
    # A seed whose second half has no order older than the first half's watermark: the
    # expectations count every order, and ProductSales drops those late to a batch.
    customers, orders = shop_events(PREFIX, seed=32, count=600)
    first, rest = orders[:300], orders[300:]
    produce(settings.kafka_bootstrap, customers + first)
    generations, schemas = prepare(spark, settings, catalog)

    before = {id(s) for s in held(GraphBatch)}  # other tests' steps, released or not
    running = start_graph_query(spark, settings, catalog, generations, schemas)
    try:
        [step] = [s for s in held(GraphBatch) if id(s) not in before]
        wait_until(lambda: not view_mismatches(client, customers, first), timeout_s=180,
                   what="the first events in every view")
        release_stopped()  # the query runs: nothing of it is released
        producers = [c.feed.producer for c in step.committers.values()] + [
            w.producer for w in step.dead_letters.values()]
        assert len(producers) == len(step.committers) + len(catalog.sources)
        assert not any(_closed(p) for p in producers)
        read_ahead = step.driver_fetch.pid if isinstance(step.driver_fetch, ReadAhead) else None
        assert read_ahead is None or _alive(read_ahead)
        index = weakref.ref(step.committers["Order"].delta._vectors.index)
        assert index() is not None
    finally:
        running.stop()

    produce(settings.kafka_bootstrap, rest)
    again = start_graph_query(spark, settings, catalog, generations, schemas,
                              available_now=True)
    try:
        # Starting the next query released the stopped one's resources.
        assert all(_closed(p) for p in producers)
        assert read_ahead is None or not _alive(read_ahead)
        gc.collect()
        assert index() is None, "the stopped query's key index is still referenced"
        assert step not in held(GraphBatch)

        # The new query carries on from the checkpoint, on tables the old one wrote.
        assert again.awaitTermination(300), "the restarted query did not finish"
        assert again.exception() is None, again.exception()
        assert view_mismatches(client, customers, orders) == []
    finally:
        again.stop()
        release_stopped()
        client.close()
