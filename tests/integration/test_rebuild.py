"""`viewgate rebuild`: a view recomputed from the log into a new generation beside the live
one, while the live engine keeps running; readers switch at once, the old generation
serves until then, and the engine carries the new one on. A view of the graph query
(engine.graph) is rebuilt with every view of the graph, so a view over views and the views
it reads are switched together."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis
from shop_views import (
    catalog_on,
    delta_frame,
    expected_customer_stats,
    isolated,
    produce,
    redis_rows,
    shop_events,
)

from engine.rebuild import log_range, rebuild_view
from engine.runner import Engine
from schema.storage import (
    APPLY_BATCH_LUA,
    RETIRED,
    ViewMeta,
    apply_batch_args,
    generation_pattern,
    meta_key,
    read_current_generation,
)
from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "rebuild"


def _meta(client: redis.Redis, view: str) -> ViewMeta:
    return ViewMeta.from_fields(client.hgetall(meta_key(view)))


def _caught_up(client: redis.Redis, bootstrap: str, view: str, topic: str) -> bool:
    offsets = _meta(client, view).offsets.get(topic, {})
    return all(
        int(offsets.get(str(p), 0)) >= end for p, (_, end) in log_range(bootstrap, topic).items()
    )


def _query_reached(query, topic: str, bootstrap: str) -> bool:
    """The streaming query has read its topic to the end (whatever it then committed)."""
    progress = query.lastProgress
    if not progress:
        return False
    end = json.loads(progress["sources"][0]["endOffset"] or "{}").get(topic, {})
    return all(
        int(end.get(str(p), 0)) >= high for p, (_, high) in log_range(bootstrap, topic).items()
    )


def _stats_match(client: redis.Redis, orders, generation: int) -> bool:
    rows = redis_rows(client, "CustomerStats", generation)
    want = expected_customer_stats(orders)
    return set(rows) == set(want.index) and all(
        rows[c]["order_count"] == w.order_count for c, w in want.iterrows()
    )


def test_rebuild_switches_readers_atomically_and_the_live_engine_follows(spark, settings, tmp_path):
    settings = isolated(settings, tmp_path, redis_db=4)
    bootstrap = settings.kafka_bootstrap
    client = redis.Redis.from_url(settings.redis_url)
    catalog = catalog_on(PREFIX)
    topic = catalog.source_of(catalog.view("CustomerStats")).topic
    graph = ["Customer", "OrderRecord", "Order", "CustomerStats", "ProductSales"]
    customers, orders = shop_events(PREFIX, seed=5, count=1200)
    first, second = orders[:700], orders[700:]
    produce(bootstrap, customers + first)

    engine = Engine(spark, settings, catalog)
    engine.start()
    try:
        wait_until(
            lambda: _caught_up(client, bootstrap, "CustomerStats", topic),
            timeout_s=180,
            what="the live view",
        )
        live_rows = redis_rows(client, "CustomerStats", 0)
        assert _stats_match(client, first, 0)

        seen: list[tuple[int, int, set[int], bool]] = []

        def watch(progress) -> None:
            # While the rebuild runs, readers are still served generation 0, unchanged.
            generations = {_meta(client, v).generation for v in graph}
            unchanged = redis_rows(client, "CustomerStats", 0) == live_rows
            seen.append((progress.done, progress.total, generations, unchanged))

        result = rebuild_view(spark, settings, catalog, "CustomerStats", watch, batch_offsets=150)

        assert (result.old_generation, result.new_generation) == (0, 1)
        assert len(seen) >= 3, "progress is reported as the rebuild goes"
        assert all(generations == {0} and unchanged for _, _, generations, unchanged in seen)
        assert [done for done, *_ in seen] == sorted(done for done, *_ in seen)
        assert seen[-1][0] == seen[-1][1] == len(customers) + len(first)

        # Switched, every view of the graph together (the windowed ProductSales too): meta,
        # the pointer file and the rows all name generation 1 now, at one version.
        for view in graph:
            meta = _meta(client, view)
            assert meta.generation == 1 and meta.version >= 0, view
            assert read_current_generation(settings.delta_location, view) == 1, view
        assert len({_meta(client, view).version for view in graph}) == 1
        assert _stats_match(client, first, 1)
        assert list(client.scan_iter(match=generation_pattern("CustomerStats", 0))) == []
        stats = delta_frame(settings, "CustomerStats", 1).set_index("customer_id")
        assert (
            stats["order_count"].to_dict()
            == expected_customer_stats(first)["order_count"].to_dict()
        )

        # The live engine still runs generation 0 until it looks: its writes are refused.
        produce(bootstrap, second)
        old_query = engine.graph_query
        wait_until(
            lambda: _query_reached(old_query, topic, bootstrap),
            timeout_s=180,
            what="the old query to read",
        )
        assert list(client.scan_iter(match=generation_pattern("CustomerStats", 0))) == []
        args = apply_batch_args(10**9, 0, {}, [])
        refused = client.register_script(APPLY_BATCH_LUA)
        assert refused(keys=[meta_key("CustomerStats")], args=args) == RETIRED

        # It follows the switch, and generation 1 picks up what arrived meanwhile.
        assert sorted(engine.follow_rebuilds()) == sorted(graph)
        wait_until(
            lambda: _stats_match(client, orders, 1), timeout_s=180, what="generation 1 to catch up"
        )
        assert _meta(client, "CustomerStats").generation == 1
    finally:
        for query in engine.queries:
            query.stop()
        client.close()


def test_rebuild_of_an_unknown_view_names_the_views_there_are():
    done = subprocess.run(
        [sys.executable, "-m", "viewgate", "rebuild", "Nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "no view Nope" in done.stdout and "CustomerStats" in done.stdout
