"""The gateway group: GraphQL point lookups per second through the gateway against the
bare Starlette baseline doing the same Redis read (and stock Strawberry), and latency at
a fixed offered load, for point lookups and for a page of 100 orders with their customers.

Data: the real engine runs once over demo events (customers first, then the orders,
as the gateway tests' shop does), so rows, indexes, meta and Delta tables are exactly
what the engine writes. Spark stops before anything is measured.

Servers: the gateway, the baseline (gateway/baseline.py) and stock Strawberry
(viewgate.bench.servers) each run in a uvicorn process of their own with one worker;
every answer is checked once in full before measuring and by marker bytes during it.

Load: viewgate.bench.load, in a process of its own per run. Throughput is closed-loop
(connections send back to back); the rounds interleave baseline, gateway and stock, so
machine noise hits all of them, and the ratio is the median of the per-round ratios.
Latency is open-loop: requests are due at fixed times and measured from then.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from schema import demo
from schema.catalog import Catalog
from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from viewgate.bench.engine import catalog_on_topics
from viewgate.bench.group import BenchContext, BenchError, Group, GroupResult, Say, Sizes
from viewgate.bench.load import closed_loop, open_loop, post_request
from viewgate.bench.report import Figure, Plot
from viewgate.bench.rewarm import measure_rewarm
from viewgate.bench.servers import Server, running
from viewgate.bench.stats import distribution
from viewgate.bench.workers import Worker, new_event
from viewgate.stack.process import pid_alive, wait_until

POINT_QUERY = (
    "query Customer($id: String!) { customer(customerId: $id) { customerId name tier country } }"
)
LIST_QUERY = (
    "query Orders($after: String) { orders(first: 100, after: $after) "
    "{ edges { node { orderId amount customer { name } } } pageInfo { endCursor } } }"
)
POINT_RATE = 1_000.0  # requests/s of the point latency run (the design's budget)
LIST_RATE_CAP = 1_000.0
# The list latency run offers this share of the list's measured saturation throughput.
LIST_LOAD_SHARE = 0.5
Record = tuple[str, str, bytes | None]  # topic, key, value (None: a tombstone)
SATURATION_CONNECTIONS = 32
OPEN_LOOP_CONNECTIONS = 64
LIST_PAGES = 20
SATURATED_CPU = 0.9  # a saturated one-worker server uses about one core
GENERATOR_CPU_LIMIT = 0.8  # distinct pages (cursors) the list requests cycle through
# Answers with these bytes are wrong (GraphQL errors, a missing customer).
_BAD = (b'"errors"', b'"customer":null')

FIGURES = (
    Figure("query_point_rps", "GraphQL point lookups/s through the gateway", "req/s"),
    Figure("query_point_raw_rps", "bare Starlette, same Redis read, same run", "req/s"),
    Figure("query_point_ratio", "gateway / bare Starlette (median of rounds)", "x",
           at_least=0.8),
    Figure("query_point_stock_rps", "stock Strawberry (strawberry.asgi), same schema", "req/s"),
    Figure("query_point_p50_ms", "point lookup p50 at 1,000 req/s (open loop)", "ms"),
    Figure("query_point_p99_ms", "point lookup p99 at 1,000 req/s (open loop)", "ms", below=5),
    Figure("query_point_raw_p99_ms", "bare Starlette at the same load, p99: this host's floor",
           "ms"),
    Figure("query_list100_rps", "100 orders + customer, closed loop", "req/s"),
    Figure("query_list100_rate", "offered load of the list latency run", "req/s"),
    Figure("query_list100_p50_ms", "100 orders + customer, p50 (open loop)", "ms"),
    Figure("query_list100_p99_ms", "100 orders + customer, p99 (open loop)", "ms", below=25),
    Figure("query_point_generator_cpu", "load generator CPU, busiest point run", "cores"),
    Figure("query_point_raw_server_cpu", "baseline server CPU while saturated", "cores"),
    Figure("rebuild_rows_per_s", "re-warming Redis from Delta (Order view)", "rows/s"),
)


# --- Data ------------------------------------------------------------------------------------


def _produce(bootstrap: str, records: Sequence[Record]) -> None:
    produce_records(bootstrap, records, catalog_on_topics(demo.CATALOG, TOPIC_PREFIX))


def produce_records(bootstrap: str, records: Sequence[Record], catalog: Catalog) -> None:
    """Into `catalog`'s topics, created first as the engine creates them."""
    from confluent_kafka import Producer

    from engine.topics import ensure_topics
    from viewgate.demo_events import send

    ensure_topics(bootstrap, catalog)
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20})
    for topic, key, value in records:
        send(producer, topic, key, value, on_delivery)
        producer.poll(0)
    if producer.flush(120) or failures:
        raise BenchError(f"producing demo events failed: {failures[:3]}")


def _run_engine_once(spark: Any, settings: Settings, catalog: Catalog) -> None:
    from engine.runner import start_all

    for query in start_all(spark, settings, catalog, available_now=True):
        if not query.awaitTermination(600):
            query.stop()
            raise BenchError(f"query {query.name} did not finish within 600 s")
        if query.exception() is not None:
            raise BenchError(f"query {query.name} failed: {query.exception()}")


TOPIC_PREFIX = "bench-gateway"


def shop_events(sizes: Sizes) -> list[Record]:
    """The demo's customers, then the events after them (orders mostly, some customer
    changes), on the group's own topics."""
    from viewgate.demo_events import generate

    catalog = catalog_on_topics(demo.CATALOG, TOPIC_PREFIX)
    topics = {demo.CATALOG.sources[s.name].topic: s.topic for s in catalog.sources.values()}
    stream = generate(seed=21, customers=sizes.gateway_customers)
    return [(topics[t], k, v) for t, k, v in
            itertools.islice(stream, sizes.gateway_customers + sizes.gateway_events)]


def run_engine(spark: Any, settings: Settings, say: Say = print) -> dict[str, int]:
    """The engine, run once over all there is in the group's topics (every view, Spark's
    availableNow). Returns the rows per view in Redis."""
    catalog = catalog_on_topics(demo.CATALOG, TOPIC_PREFIX)
    started = time.monotonic()
    _run_engine_once(spark, settings, catalog)
    counts = _rows_per_view(settings, catalog)
    say(f"engine: Redis holds {counts} ({time.monotonic() - started:.0f} s)")
    return counts


def run_engine_in_child(settings: Settings, produced: Any) -> tuple[dict[str, int], int]:
    """run_engine with a SparkSession of this (worker) process, once `produced` is set:
    its JVM ends with the process. Returns the rows per view and the JVM's pid."""
    from engine.spark import build_spark

    spark = build_spark(settings, app_name="viewgate-bench-gateway")
    jvm_pid = spark.sparkContext._gateway.proc.pid
    try:
        if not produced.wait(600):
            raise BenchError("the demo events were not produced within 600 s")
        return run_engine(spark, settings, say=lambda text: print(text, flush=True)), jvm_pid
    finally:
        spark.stop()


def load_shop(ctx: BenchContext, settings: Settings) -> dict[str, int]:
    """The demo shop as the engine writes it. Spark runs in a worker process that ends
    before anything is measured (the JVM's threads must not compete with the servers),
    unless the context was given a SparkSession (the tests'); the events are produced
    while it starts."""
    events = shop_events(ctx.sizes)
    if ctx.spark_session is not None:
        _produce(settings.kafka_bootstrap, events)
        return run_engine(ctx.spark_session, settings, ctx.say)
    ctx.say(f"producing {len(events):,} demo events; starting Spark to run the engine")
    produced = new_event()
    worker = Worker("engine over the demo shop", run_engine_in_child, settings, produced)
    try:
        _produce(settings.kafka_bootstrap, events)
        produced.set()
        counts, jvm_pid = worker.result(timeout_s=900)
    finally:
        worker.stop()
    # The JVM exits after its Python process: wait, or its shutdown would take CPU from
    # the first server measured (the baseline) and flatter the ratio.
    wait_until(lambda: not pid_alive(jvm_pid), timeout_s=60, what="the engine's JVM to exit")
    return counts


def _rows_per_view(settings: Settings, catalog: Catalog) -> dict[str, int]:

    from schema.storage import META_GENERATION, meta_key, row_key

    client = connect_redis(settings.redis_url)
    try:
        out = {}
        for name in catalog.views:
            generation = int(client.hget(meta_key(name), META_GENERATION) or 0)
            out[name] = sum(1 for _ in client.scan_iter(match=row_key(name, generation, "*"),
                                                        count=10_000))
        return out
    finally:
        client.close()


def customer_rows(settings: Settings) -> dict[str, dict[str, Any]]:
    """Every Customer row in Redis, by key, as the engine stored it."""

    from schema.storage import META_GENERATION, decode_row, meta_key, row_key

    client = connect_redis(settings.redis_url)
    try:
        generation = int(client.hget(meta_key("Customer"), META_GENERATION) or 0)
        prefix = row_key("Customer", generation, "")
        keys = sorted(client.scan_iter(match=prefix + "*", count=10_000))
        values = client.mget(keys) if keys else []
        return {k.decode()[len(prefix):]: decode_row(v)
                for k, v in zip(keys, values, strict=True) if v is not None}
    finally:
        client.close()


def redis_pid(settings: Settings) -> int:

    client = connect_redis(settings.redis_url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


# --- Requests and checks --------------------------------------------------------------------


def _post(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/graphql", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def point_body(key: str) -> bytes:
    return json.dumps({"query": POINT_QUERY, "variables": {"id": key}}).encode()


def list_body(after: str | None) -> bytes:
    return json.dumps({"query": LIST_QUERY, "variables": {"after": after}}).encode()


def check_point(server: Server, key: str, row: dict[str, Any]) -> None:
    """The server answers the point query with the customer's row."""
    answer = _post(server, json.loads(point_body(key)))
    customer = (answer.get("data") or {}).get("customer") or {}
    name = customer.get("name")
    if answer.get("errors") or name != row["name"]:
        raise BenchError(f"the {server.name} server answered customer {key} with "
                         f"{json.dumps(answer)[:400]}; Redis holds {row}")


def list_cursors(server: Server, pages: int) -> list[str | None]:
    """Cursors of the first `pages` pages of 100 orders, each page checked: 100 orders,
    each with its customer's name."""
    cursors: list[str | None] = [None]
    while True:
        answer = _post(server, json.loads(list_body(cursors[-1])))
        orders = (answer.get("data") or {}).get("orders") or {}
        edges = orders.get("edges") or []
        if answer.get("errors") or len(edges) != 100 or not all(
                (e["node"].get("customer") or {}).get("name") for e in edges):
            raise BenchError(f"page {len(cursors)} of orders is not 100 orders with their "
                             f"customers: {json.dumps(answer)[:400]}")
        if len(cursors) == pages:
            return cursors
        cursors.append(orders["pageInfo"]["endCursor"])


# --- Runs -------------------------------------------------------------------------------------


def _checked(name: str, result: dict[str, Any]) -> dict[str, Any]:
    if result["bad"]:
        raise BenchError(f"{name}: {result['bad']} wrong answers, e.g. {result['errors']}")
    return result


def saturate(ctx: BenchContext, server: Server, requests: list[bytes], must: bytes,
             watch: list[int]) -> dict[str, Any]:
    sizes = ctx.sizes
    worker = Worker(f"load on {server.name}", closed_loop, "127.0.0.1", server.port, requests,
                    SATURATION_CONNECTIONS, sizes.gateway_warmup_s, sizes.gateway_seconds, must,
                    _BAD, [server.pid, *watch])
    try:
        result = worker.result(timeout_s=sizes.gateway_warmup_s + sizes.gateway_seconds + 90)
    finally:
        worker.stop()
    return _checked(f"closed loop on {server.name}", result)


def fixed_rate(ctx: BenchContext, server: Server, requests: list[bytes], rate: float,
               must: bytes, watch: list[int]) -> dict[str, Any]:
    sizes = ctx.sizes
    worker = Worker(f"{rate:.0f}/s on {server.name}", open_loop, "127.0.0.1", server.port,
                    requests, rate, sizes.gateway_warmup_s, sizes.gateway_latency_s,
                    OPEN_LOOP_CONNECTIONS, must, _BAD, [server.pid, *watch])
    try:
        result = worker.result(timeout_s=sizes.gateway_warmup_s + sizes.gateway_latency_s + 120)
    finally:
        worker.stop()
    result = _checked(f"{rate:.0f}/s on {server.name}", result)
    if result["answered"] != result["due"]:
        raise BenchError(f"{rate:.0f}/s on {server.name}: {result['due'] - result['answered']} "
                         "requests got no answer")
    return result


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the per-round ratios (rounds paired in order)."""
    if not numerators or len(numerators) != len(denominators):
        raise ValueError("ratios need as many rounds on each side, at least one")
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def list_rate(max_rps: float) -> float:
    """The list latency run's offered load: LIST_LOAD_SHARE of the measured saturation
    throughput (so the server can sustain it), at most LIST_RATE_CAP, in steps of 10/s
    (of 1/s below 20/s)."""
    rate = min(LIST_RATE_CAP, max_rps * LIST_LOAD_SHARE)
    step = 10 if rate >= 20 else 1
    return float(max(1, int(rate // step) * step))


def warnings(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What makes the saturation figures doubtful: a server that did not get a whole core
    (others competed for the CPU), or a generator that came close to using one itself."""
    out = []
    for name, results in runs.items():
        for i, result in enumerate(results, 1):
            server, generator = result["watched_cpu"][0], result["generator_cpu"]
            if server < SATURATED_CPU:
                out.append(f"{name} round {i}: the server used {server:.2f} of a core (the "
                           "machine was busy: others competed for the CPU)")
            if generator > GENERATOR_CPU_LIMIT:
                out.append(f"{name} round {i}: the load generator used {generator:.2f} of a "
                           "core: it may have been the bottleneck")
    return out


def _r(value: float, digits: int = 2) -> float:
    return round(value, digits)


def run(ctx: BenchContext) -> GroupResult:
    sizes = ctx.sizes
    settings = ctx.isolated("gateway")
    counts = load_shop(ctx, settings)
    rows = customer_rows(settings)
    if len(rows) < 10 or counts.get("Order", 0) < 100:
        raise BenchError(f"too little data for the gateway group: {counts}")
    keys = sorted(rows)
    random.Random(5).shuffle(keys)
    redis = redis_pid(settings)
    names = ["baseline", "gateway", "stock"]
    ctx.say("starting uvicorn: " + ", ".join(names))
    with running(names, settings, ctx.workdir / "servers") as servers:
        for server in servers.values():
            check_point(server, keys[0], rows[keys[0]])
        point = {name: [post_request("127.0.0.1", s.port, "/graphql", point_body(k))
                        for k in keys] for name, s in servers.items()}

        by_server: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for round_ in range(sizes.gateway_rounds):
            for name in names:
                result = saturate(ctx, servers[name], point[name], b'"name"', [redis])
                by_server[name].append(result)
                ctx.say(f"round {round_ + 1}: {name} {result['rps']:,.0f} req/s (server CPU "
                        f"{result['watched_cpu'][0]:.2f}, generator CPU "
                        f"{result['generator_cpu']:.2f})")
        rps = {name: [r["rps"] for r in runs] for name, runs in by_server.items()}

        gateway = servers["gateway"]
        # The bare Starlette server at the same load first: the tail this host gives any
        # Python server, against which the gateway's p99 reads.
        ctx.say(f"point lookups at {POINT_RATE:,.0f}/s for {sizes.gateway_latency_s:.0f} s: "
                "baseline, then gateway")
        raw_latency = fixed_rate(ctx, servers["baseline"], point["baseline"], POINT_RATE,
                                 b'"name"', [redis])
        point_latency = fixed_rate(ctx, gateway, point["gateway"], POINT_RATE, b'"name"',
                                   [redis])

        pages = min(LIST_PAGES, counts["Order"] // 100)
        cursors = list_cursors(gateway, pages)
        lists = [post_request("127.0.0.1", gateway.port, "/graphql", list_body(c))
                 for c in cursors]
        list_max = saturate(ctx, gateway, lists, b'"orderId"', [redis])
        rate = list_rate(list_max["rps"])
        ctx.say(f"100 orders: {list_max['rps']:,.0f} req/s closed loop; latency at {rate:,.0f}/s")
        list_latency = fixed_rate(ctx, gateway, lists, rate, b'"orderId"', [redis])

    ctx.say("re-warming the Order view from Delta into an emptied Redis")
    rewarm = measure_rewarm(settings, demo.CATALOG, "Order")
    doubts = warnings(by_server)
    for doubt in doubts:
        ctx.say(f"warning: {doubt}")
    point_summary = distribution(point_latency["latency_ms"])
    raw_summary = distribution(raw_latency["latency_ms"])
    list_summary = distribution(list_latency["latency_ms"])
    point_runs = [r for runs in by_server.values() for r in runs]
    figures: dict[str, Any] = {
        "query_point_rps": round(statistics.median(rps["gateway"])),
        "query_point_raw_rps": round(statistics.median(rps["baseline"])),
        "query_point_ratio": _r(median_ratio(rps["gateway"], rps["baseline"]), 3),
        "query_point_stock_rps": round(statistics.median(rps["stock"])),
        "query_point_stock_ratio": _r(median_ratio(rps["stock"], rps["baseline"]), 3),
        "query_point_rounds": {name: [round(v) for v in values] for name, values in rps.items()},
        "query_point_p50_ms": _r(point_summary["p50"]),
        "query_point_p99_ms": _r(point_summary["p99"]),
        "query_point_latency_ms": {k: _r(v) for k, v in point_summary.items()},
        "query_point_raw_p50_ms": _r(raw_summary["p50"]),
        "query_point_raw_p99_ms": _r(raw_summary["p99"]),
        "query_point_rate": POINT_RATE,
        "query_list100_rps": round(list_max["rps"]),
        "query_list100_rate": rate,
        "query_list100_p50_ms": _r(list_summary["p50"]),
        "query_list100_p99_ms": _r(list_summary["p99"]),
        "query_list100_latency_ms": {k: _r(v) for k, v in list_summary.items()},
        "query_point_generator_cpu": _r(max(r["generator_cpu"] for r in point_runs)),
        "query_point_raw_server_cpu": _r(statistics.median(
            r["watched_cpu"][0] for r in by_server["baseline"])),
        "query_cpu": {
            "saturation": {name: {
                "server": [_r(r["watched_cpu"][0]) for r in runs],
                "redis": [_r(r["watched_cpu"][1]) for r in runs],
                "generator": [_r(r["generator_cpu"]) for r in runs],
            } for name, runs in by_server.items()},
            **{label: {"server": _r(r["watched_cpu"][0]), "redis": _r(r["watched_cpu"][1]),
                       "generator": _r(r["generator_cpu"])}
               for label, r in (("point_latency", point_latency),
                                ("point_raw_latency", raw_latency), ("list100_max", list_max),
                                ("list100_latency", list_latency))},
        },
        "query_send_lag_p99_ms": {
            "point": _r(distribution(point_latency["send_lag_ms"])["p99"]),
            "point_raw": _r(distribution(raw_latency["send_lag_ms"])["p99"]),
            "list100": _r(distribution(list_latency["send_lag_ms"])["p99"]),
        },
        "query_data": {**{f"{k.lower()}_rows": v for k, v in counts.items()},
                       "point_keys": len(keys), "list_pages": pages},
        "query_connections": {"saturation": SATURATION_CONNECTIONS,
                              "open_loop": OPEN_LOOP_CONNECTIONS},
        "query_warnings": doubts,
        **rewarm,
    }
    notes = [f"{sizes.gateway_latency_s:.0f} s per run", "uvicorn, 1 worker",
             f"load avg {_load():.2f}"]
    plots = [
        Plot("gateway_point_latency.png",
             f"Point lookup through the gateway at {POINT_RATE:,.0f} req/s (open loop)",
             {"gateway point lookup": point_latency["latency_ms"],
              "bare Starlette, same load": raw_latency["latency_ms"]}, notes=notes),
        Plot("gateway_list100_latency.png",
             f"100 orders with their customers at {rate:,.0f} req/s (open loop)",
             {"gateway orders(first: 100)": list_latency["latency_ms"]}, notes=notes),
        Plot("gateway_point_rps.png", "Point lookups/s per interleaved round (closed loop, "
             f"{SATURATION_CONNECTIONS} connections)",
             {name: values for name, values in rps.items()}, kind="series", xlabel="round",
             ylabel="requests/s"),
    ]
    return GroupResult(figures, plots)


def _load() -> float:
    from viewgate.bench.results import load_average

    return load_average()


GROUP = Group(
    name="gateway",
    description="GraphQL point lookups/s vs bare Starlette; latency at a fixed load",
    figures=FIGURES,
    run=run,
)
