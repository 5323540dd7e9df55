"""The subscriptions group: from an event's production to a subscriber's message, and one
change fanned out to 10,000 subscriptions held by one gateway process.

Everything runs live: the demo views in the engine (engine.runner.start_all, Spark in
this group's process), the gateway as `viewgate gateway` serves it (one uvicorn worker,
a process of its own), and websocket clients in processes of their own
(viewgate.bench.ws_clients, graphql-transport-ws).

Freshness: a producer process writes demo traffic at a steady rate and records each
event's Kafka offset and create time; one client subscribes to every view's change
stream (`<view>Changes`) and notes when each version first reached it; a watcher notes
which Kafka offsets each version covers (the view's meta in Redis). An event reached its
subscriber when the first version past its offset did, and Redis when that version
appeared there; the gateway's CPU over the run, divided by the messages it sent, is its
cost per message.

Fan-out: client processes open `fanout_connections` websockets holding `fanout` live
subscriptions of one customer in all; once every one has its current value, the customer
is updated through Kafka. `fanout_10k_s` is the time from the first subscriber's copy of
that change to the last one's (the engine's share, the same for one subscriber as for
10,000, is reported apart as `fanout_from_event_s`). `subscription_rss_kb` is the gateway's
resident memory growth over the subscriptions it holds.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from typing import Any

from schema import demo
from schema.catalog import Catalog, View
from schema.settings import Settings
from viewgate.bench.engine import (
    VIEW,
    catalog_on_topics,
    commit_timings,
    freshness_by_view,
    produced_then_caught_up,
    profile,
    progress_dicts,
    wait_started,
)
from viewgate.bench.gateway import customer_rows
from viewgate.bench.group import BenchContext, BenchError, Group, GroupResult
from viewgate.bench.load import cpu_seconds_fine, rss_kb
from viewgate.bench.report import Figure, Plot
from viewgate.bench.servers import running
from viewgate.bench.workers import Worker, new_event, produce_paced, watch_meta
from viewgate.bench.ws_clients import hold_live, watch_versions

TOPIC_PREFIX = "bench-subscriptions"
FANOUT_WORKERS = 2  # client processes holding the fan-out subscriptions
_SEED_CUSTOMERS = 200
_WATCH_INTERVAL_S = 0.005

FIGURES = (
    Figure("freshness_p50_ms", "event produced -> subscriber's message, p50", "ms", below=500),
    Figure("freshness_p99_ms", "event produced -> subscriber's message, p99", "ms",
           below=1_500),
    Figure("chained_freshness_p99_ms", "the same for the deepest view over views, p99", "ms",
           below=1_000),
    Figure("freshness_samples", "events measured", "events"),
    Figure("freshness_gateway_us_per_message",
           "the gateway's CPU per message it sent while measuring freshness", "µs"),
    Figure("freshness_subscriber_cpu_s",
           "the measuring subscriber's own CPU over that run (it shares the cores)", "s"),
    Figure("subscriptions_open", "subscriptions held by one gateway process"),
    Figure("fanout_10k_s", "one change to every subscription, first to last copy", "s",
           below=1),
    Figure("fanout_from_event_s", "the same change, produced -> last copy", "s"),
    Figure("subscription_rss_kb", "gateway memory per subscription", "KiB"),
    Figure("fanout_gateway_cpu_s", "the fan-out's CPU time in the gateway", "s"),
    Figure("fanout_clients_cpu_s", "the fan-out's CPU time in the client processes", "s"),
)


def changes_field(view: View) -> str:
    return view.name[0].lower() + view.name[1:] + "Changes"


def changes_query(view: View) -> str:
    return f"subscription {{ {changes_field(view)} {{ op version }} }}"


LIVE_CUSTOMER = ("subscription Live($id: String!) "
                 "{ customer(customerId: $id) { op version row { name } } }")


def _url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/graphql"


def seed_customers(settings: Settings, catalog: Catalog) -> None:
    """Customers for the live subscriptions, through Kafka like every other event."""
    from viewgate.bench.gateway import produce_records
    from viewgate.demo_events import generate

    topics = {demo.CATALOG.sources[s.name].topic: s.topic for s in catalog.sources.values()}
    # The demo stream starts with its customers.
    first = itertools.islice(generate(seed=31, customers=_SEED_CUSTOMERS), _SEED_CUSTOMERS)
    produce_records(settings.kafka_bootstrap, [(topics[t], k, v) for t, k, v in first], catalog)


def delivered(port: int) -> int:
    """Messages this gateway process has put in its subscribers' buffers (/subscriptions)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/subscriptions", timeout=30) as answer:
        return int(json.loads(answer.read())["delivered"])


def measure_freshness(ctx: BenchContext, settings: Settings, catalog: Catalog,
                      port: int, gateway_pid: int) -> tuple[dict[str, Any], Plot]:
    sizes = ctx.sizes
    renamed = {demo.CATALOG.sources[n].topic: s.topic for n, s in catalog.sources.items()}
    view_topics = {name: catalog.source_of(v).topic for name, v in catalog.views.items()}
    stop, subscribed = new_event(), new_event()
    workers: list[Worker] = []
    try:
        watcher = Worker("meta watcher", watch_meta, settings.redis_url, list(catalog.views),
                         stop, _WATCH_INTERVAL_S)
        subscriber = Worker(
            "change subscriber", watch_versions, _url(port),
            {name: (changes_query(v), changes_field(v)) for name, v in catalog.views.items()},
            subscribed, stop)
        workers += [watcher, subscriber]
        if not subscribed.wait(60):
            raise BenchError("the change subscriber did not subscribe within 60 s")
        ctx.say(f"subscribed to every view's changes; producing demo events at "
                f"{sizes.freshness_rate:,.0f}/s for {sizes.freshness_s:.0f} s")
        # What the gateway spends on each message it sends: its CPU over the run (the
        # feed's reader, the fan-out, the payloads, the websocket) against the messages.
        cpu_before, messages_before = cpu_seconds_fine(gateway_pid), delivered(port)
        producer = Worker("producer", produce_paced, settings.kafka_bootstrap, renamed,
                          sizes.freshness_rate, sizes.freshness_s, 9)
        workers.append(producer)
        deliveries = produced_then_caught_up(producer, settings.kafka_bootstrap,
                                             settings.redis_url, view_topics,
                                             sizes.freshness_s + 120)
        # The last versions are in Redis; give their feed messages the same deadline.
        stop.set()
        observed = watcher.result(timeout_s=60)
        watched = subscriber.result(timeout_s=60)
        received = watched["versions"]
        gateway_cpu = cpu_seconds_fine(gateway_pid) - cpu_before
        messages = delivered(port) - messages_before
    finally:
        stop.set()
        for worker in workers:
            worker.stop()
    offsets = {view: observed[view]["offsets"] for view in view_topics}
    by_view, samples = freshness_by_view(deliveries, view_topics, received, offsets,
                                         sizes.freshness_warmup_s)
    if VIEW not in samples:
        raise BenchError(f"no {VIEW} event could be matched to a message a subscriber got")
    # The same events, produced -> version in Redis, in this run (the gateway beside the
    # engine): what is left of the freshness above is the change feed and the gateway.
    seen = {view: observed[view]["seen"] for view in view_topics}
    in_redis, _ = freshness_by_view(deliveries, view_topics, seen, offsets,
                                    sizes.freshness_warmup_s)
    figures = {
        "freshness_p50_ms": by_view[VIEW]["p50"],
        "freshness_p99_ms": by_view[VIEW]["p99"],
        "freshness_samples": by_view[VIEW]["count"],
        "freshness_view": VIEW,
        "freshness_by_view": by_view,
        "freshness_redis_by_view": in_redis,
        "freshness_gateway_messages": messages,
        "freshness_gateway_cpu_s": round(gateway_cpu, 2),
        "freshness_gateway_us_per_message": round(gateway_cpu * 1e6 / max(messages, 1), 1),
        # The measuring subscriber shares the cores with what it measures.
        "freshness_subscriber_cpu_s": watched["cpu_s"],
        # CustomerStats is the demo's deepest view (over Order, over OrderRecord).
        "chained_freshness_p99_ms": by_view[VIEW]["p99"],
    }
    ordered = {VIEW: samples.pop(VIEW), **samples}
    plot = Plot("subscription_freshness.png",
                f"Event produced -> subscriber's message, demo views live at "
                f"{sizes.freshness_rate:,.0f} events/s", ordered,
                notes=["histogram: CustomerStats; right: every view"])
    return figures, plot


def measure_fanout(ctx: BenchContext, settings: Settings, catalog: Catalog, port: int,
                   gateway_pid: int) -> dict[str, Any]:
    from viewgate.bench.gateway import produce_records

    sizes = ctx.sizes
    rows = customer_rows(settings)
    if not rows:
        raise BenchError("no Customer rows to subscribe to")
    key = sorted(rows)[0]
    per_worker = sizes.fanout_connections // FANOUT_WORKERS
    per_connection = max(1, sizes.fanout // sizes.fanout_connections)
    total = per_worker * FANOUT_WORKERS * per_connection
    marker = f"fanout-{time.time_ns()}"
    rss_before = rss_kb(gateway_pid)
    stop = new_event()
    readies = [new_event() for _ in range(FANOUT_WORKERS)]
    ctx.say(f"opening {total:,} live subscriptions of customer {key} over "
            f"{per_worker * FANOUT_WORKERS:,} websockets")
    workers = [Worker(f"fan-out clients {i}", hold_live, _url(port), per_worker, per_connection,
                      LIVE_CUSTOMER, {"id": key}, ready, stop, [marker])
               for i, ready in enumerate(readies)]
    try:
        deadline = time.monotonic() + 300
        for ready in readies:
            if not ready.wait(max(0.0, deadline - time.monotonic())):
                raise BenchError(f"{total:,} subscriptions were not all open within 300 s")
        rss_after = rss_kb(gateway_pid)
        gateway_cpu = cpu_seconds_fine(gateway_pid)
        row = dict(rows[key], name=marker)
        produced_ms = time.time() * 1000
        produce_records(settings.kafka_bootstrap, [(catalog.sources["customers"].topic, key,
                                                    json.dumps(row).encode())], catalog)
        ctx.say(f"updated customer {key}; waiting for {total:,} copies")
        deadline = time.monotonic() + 120
        for worker in workers:  # each ends once all its subscriptions have the copy
            worker.done(max(0.0, deadline - time.monotonic()))
        stop.set()  # one still waiting past the deadline reports what it has
        outcomes = [w.result(timeout_s=60) for w in workers]
        gateway_cpu = cpu_seconds_fine(gateway_pid) - gateway_cpu
    finally:
        stop.set()
        for worker in workers:
            worker.stop()
    initial = sum(o["initial"] for o in outcomes)
    received = sorted(t for o in outcomes for t in o["received"])
    failed = [f for o in outcomes for f in o["failed"]]
    if len(received) < total:
        raise BenchError(f"{len(received):,} of {total:,} subscriptions got the change "
                         f"({initial:,} had their current value); failures: {failed[:3]}")
    return {
        "subscriptions_open": initial,
        "fanout_subscriptions": total,
        "fanout_connections": per_worker * FANOUT_WORKERS,
        "fanout_10k_s": round((received[-1] - received[0]) / 1000, 4),
        "fanout_from_event_s": round((received[-1] - produced_ms) / 1000, 3),
        "fanout_first_copy_s": round((received[0] - produced_ms) / 1000, 3),
        "subscription_rss_kb": round((rss_after - rss_before) / total, 2),
        # Who the fan-out kept busy: the gateway, and the clients reading the copies (on
        # the same cores): CPU seconds from the update to the last copy.
        "fanout_gateway_cpu_s": round(gateway_cpu, 3),
        "fanout_clients_cpu_s": round(sum(o["cpu_s"] for o in outcomes), 3),
        "gateway_rss_kb": {"before": rss_before, "with_subscriptions": rss_after},
    }


def run(ctx: BenchContext) -> GroupResult:
    from engine.graph import GRAPH_TIMINGS
    from engine.runner import start_all
    from engine.views import query_views

    settings = ctx.isolated("subscriptions")
    catalog = catalog_on_topics(demo.CATALOG, TOPIC_PREFIX)
    spark = ctx.spark()
    ctx.say(f"starting the engine on the demo views ({', '.join(catalog.views)})")
    seed_customers(settings, catalog)
    with commit_timings() as timings:
        queries = start_all(spark, settings, catalog)
        try:
            wait_started(queries, 300)
            with running(["gateway"], settings, ctx.workdir / "servers") as servers:
                gateway = servers["gateway"]
                fresh, plot = measure_freshness(ctx, settings, catalog, gateway.port,
                                                gateway.pid)
                # Where the engine's share of the freshness goes, per view (Spark's
                # progress and the commit's steps, while the events were produced).
                # (The graph query's Spark phases are the same for each of its views.)
                fresh["freshness_engine_profile_ms"] = {
                    name: profile(progress_dicts(q), timings.by_view.get(name, {}))
                    for q in queries for name in [v for v, _ in query_views(q.name)]
                    + ([GRAPH_TIMINGS] if q.name.startswith("graph:") else [])
                }
                fanout = measure_fanout(ctx, settings, catalog, gateway.port, gateway.pid)
        finally:
            for query in queries:
                query.stop()
    return GroupResult({**fresh, **fanout}, [plot])


GROUP = Group(
    name="subscriptions",
    description="event produced -> subscriber; one change to 10,000 live subscriptions",
    figures=FIGURES,
    run=run,
)
