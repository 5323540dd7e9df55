"""`viewgate bench --soak`: the gateway at a share of its measured capacity (half unless
`--soak-load` says otherwise) for minutes, with live subscriptions open and the engine fed
demo traffic; every error counted and the memory of the gateway and of the engine's
driver sampled.

The stack: Kafka and Redis of the run's own (runner.bench_stack), the demo views in the
engine (Spark in the soak's process, engine.runner.start_all), a producer process writing
demo traffic (`demo_rate` events/s: customer changes, orders, deletes), the gateway as
`viewgate gateway` serves it (one uvicorn worker, the gateway's uvicorn limits).

1. Subscriptions: `subscriptions` live `customer(customerId:)` subscriptions over
   `connections` websockets (ws_clients.hold_and_count), spread over every customer, so
   the demo's customer changes reach them throughout.
2. Probe: the soak's mix (point lookups, one request in `list_share` a list page of 10
   customers) at saturation (load.closed_loop, `probe_s`), with the subscriptions open:
   `capacity_rps`.
3. Soak: for `minutes`, open-loop load (load.open_loop) of that mix at `load_share` of
   `capacity_rps`. Every `sample_s` the
   resident memory (VmRSS) of the gateway, of the engine's JVM and of its Python driver,
   and what the engine keeps (engine_storage: Delta and Redis bytes per row, checkpoint
   bytes, batch time), whose start and end are compared (flat within 20%), and the mean
   time of each step of the view graph's batches (engine_graph_steps). What the
   engine keeps is sampled by a process of its own: reading Delta logs in the engine's
   driver would take its CPU and memory and count them as the engine's.

The engine's long run (`--soak-rate 1000`) is the engine's test, not the gateway's: give
it `--soak-load 0.1` or so, so that the gateway's load does not take the cores the engine
needs (on two cores, the gateway at half its capacity and the engine at 1,000 events/s
together ask for more than the machine has, and the engine falls behind).

Errors: wrong HTTP answers (not 200, or GraphQL `errors`), subscription errors, websocket
closes the client did not ask for, changes whose version did not grow, and engine queries
that stopped. Memory growth: the median RSS over the last `window` seconds against the
median over the `window` after a warm-up of `window`, where `window` is 60 s (a quarter
of the run when it is shorter than 4 minutes). Pass: no error, gateway growth under 10%.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from schema import demo
from schema.catalog import Catalog, parse_duration_ms
from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from viewgate.bench import driver_memory, engine_storage
from viewgate.bench.load import proc_kb
from viewgate.bench.stats import percentile

TOPIC_PREFIX = "bench-soak"
GROWTH_LIMIT = 0.10
WINDOW_S = 60.0
PROBE_CONNECTIONS = 32
LOAD_CONNECTIONS = 64
SUBSCRIBER_WORKERS = 2
LIST_QUERY = ("query Page { customers(first: 10) "
              "{ totalCount edges { node { customerId name tier } } } }")


@dataclass(frozen=True)
class SoakSizes:
    minutes: float = 10.0
    probe_s: float = 5.0
    probe_warmup_s: float = 1.0
    subscriptions: int = 2_000
    connections: int = 200
    list_share: int = 10  # one request in this many is a list page
    demo_rate: float = 50.0  # demo events per second into the engine, all along
    sample_s: float = 5.0
    # What the engine keeps is sampled less often: reading every table's log and listing
    # its files costs more as the history grows (every 5 s, an hour's soak spent half a
    # core on it by its end, on the cores the engine measured needs).
    storage_sample_s: float = 30.0
    load_share: float = 0.5  # of the probed capacity, offered during the soak
    # Every view's `history` for the run ("" keeps the views' own, a day): a history the
    # run outlasts shows whether maintenance holds Delta's storage at live rows plus the
    # history, which a day's history cannot show in an hour.
    history: str = ""


# --- Pure figures -----------------------------------------------------------------------


def growth_window(duration_s: float) -> float:
    return min(WINDOW_S, duration_s / 4)


def settled_window(history: str, maintenance_s: float, duration_s: float
                   ) -> tuple[float, float] | None:
    """(start, length) of the first window in which what the engine keeps has stopped
    filling, or None when the run cannot hold two such windows.

    Until the views' `history` has passed and one maintenance has vacuumed behind it,
    Delta's bytes grow by design: every version is kept for `history`. From then on they
    rise with each batch and fall with each vacuum, so a window of one maintenance interval
    holds one whole rise and fall, wherever it starts. A day's history (the views' own)
    never settles within an hour's soak."""
    if not history or maintenance_s <= 0:
        return None
    start = parse_duration_ms(history) / 1000 + maintenance_s
    if start + 2 * maintenance_s > duration_s:
        return None
    return start, maintenance_s


def settled(window: tuple[float, float] | None, duration_s: float,
            held: Sequence[tuple[float, Mapping[str, float]]],
            driver: Sequence[tuple[float, Mapping[str, float]]], driver_kinds: Sequence[str],
            rss: Mapping[str, Sequence[tuple[float, int]]]) -> dict[str, Any] | None:
    """The engine's storage, the driver's memory and every process's RSS compared between
    the settled window and the run's last window of the same length."""
    if window is None:
        return None
    start, length = window

    def compare(samples: Sequence[tuple[float, Mapping[str, float]]],
                series: Sequence[str]) -> dict[str, dict[str, Any]]:
        return engine_storage.flatness(samples, duration_s, length, series, start_s=start)

    return {
        "from_s": start, "window_s": length,
        "engine": compare(held, engine_storage.FLAT_SERIES),
        "engine_driver_memory": compare(driver, driver_kinds),
        "rss_kb": {name: compare([(t, {"rss_kb": kb}) for t, kb in series], ["rss_kb"])["rss_kb"]
                   for name, series in rss.items()},
    }


def memory_growth(samples: Sequence[tuple[float, float]], duration_s: float
                  ) -> dict[str, float] | None:
    """From (seconds since the start, KiB) samples: the median of the last window
    against the median of the window after the warm-up window. None without samples in
    both."""
    window = growth_window(duration_s)
    baseline = [kb for t, kb in samples if window <= t < 2 * window]
    final = [kb for t, kb in samples if t >= duration_s - window]
    if not baseline or not final:
        return None
    first, last = statistics.median(baseline), statistics.median(final)
    return {"window_s": round(window, 2), "baseline_kb": first, "final_kb": last,
            "growth": round(last / first - 1, 4)}


def latency_over_time(latency_ms: Sequence[float], rate: float, bucket_s: float
                      ) -> list[dict[str, float]]:
    """Request i of an open-loop run was due at i / rate s: p50 and p99 per bucket."""
    per_bucket = max(1, round(rate * bucket_s))
    out = []
    for start in range(0, len(latency_ms), per_bucket):
        chunk = latency_ms[start:start + per_bucket]
        out.append({"t_s": round(start / rate, 2), "p50_ms": round(percentile(chunk, 50), 3),
                    "p99_ms": round(percentile(chunk, 99), 3)})
    return out


def verdict(errors: dict[str, int], growth: dict[str, Any] | None) -> list[str]:
    """Why the soak failed; empty when it passed."""
    problems = [f"{count} {kind}" for kind, count in errors.items() if count]
    if growth is None:
        problems.append("too few memory samples to measure growth")
    elif growth["growth"] >= GROWTH_LIMIT:
        problems.append(f"gateway memory grew {growth['growth']:.1%} (limit "
                        f"{GROWTH_LIMIT:.0%})")
    return problems


# --- The run ----------------------------------------------------------------------------


def with_history(catalog: Catalog, history: str) -> Catalog:
    """The catalog with every view's `history` set to `history` ("" leaves them)."""
    if not history:
        return catalog
    views = [dataclasses.replace(v, history=history) for v in catalog.views.values()]
    changed = Catalog.of(catalog.sources.values(), views)
    changed.validate()  # an unreadable history is refused with the fix
    return changed


def _rss_kb(pid: int | None) -> int | None:
    return None if pid is None else proc_kb(f"/proc/{pid}/status", "VmRSS")


def _jvm_pid(spark: Any) -> int | None:
    """The pid of the engine's JVM (PySpark starts it as a child of the driver)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    return proc.pid if proc is not None else None


def measure(ctx: Any, sizes: SoakSizes) -> dict[str, Any]:
    """The soak in this process (Spark here); returns the report (see the module doc)."""
    import os

    from engine.metrics import graph_step_totals, maintenance_totals, rows_changed_total
    from engine.runner import start_all
    from viewgate.bench.engine import catalog_on_topics, wait_started
    from viewgate.bench.gateway import customer_rows, point_body
    from viewgate.bench.group import BenchError
    from viewgate.bench.load import closed_loop, open_loop, post_request
    from viewgate.bench.servers import running
    from viewgate.bench.subscriptions import LIVE_CUSTOMER, seed_customers
    from viewgate.bench.workers import Worker, new_event, produce_paced
    from viewgate.bench.ws_clients import hold_and_count
    from viewgate.stack.process import wait_until

    settings = ctx.isolated("soak")
    catalog = with_history(catalog_on_topics(demo.CATALOG, TOPIC_PREFIX), sizes.history)
    renamed = {demo.CATALOG.sources[n].topic: s.topic for n, s in catalog.sources.items()}
    duration_s = sizes.minutes * 60
    spark = ctx.spark()
    seed_customers(settings, catalog)
    ctx.say(f"starting the engine on the demo views ({', '.join(catalog.views)})")
    queries = start_all(spark, settings, catalog)
    workers: list[Worker] = []
    stop = new_event()
    try:
        wait_started(queries, 300)
        # Demo traffic for as long as anything could take; stopped at the end.
        workers.append(Worker("producer", produce_paced, settings.kafka_bootstrap, renamed,
                              sizes.demo_rate, duration_s + 3600, 17))
        with running(["gateway"], settings, ctx.workdir / "servers") as servers:
            gateway = servers["gateway"]
            wait_until(lambda: len(customer_rows(settings)) > 0, timeout_s=300,
                       what="the Customer view's first rows")
            keys = sorted(customer_rows(settings))
            host, port = "127.0.0.1", gateway.port
            points = [post_request(host, port, "/graphql", point_body(k)) for k in keys]
            listed = post_request(host, port, "/graphql",
                                  json.dumps({"query": LIST_QUERY}).encode())


            per_worker = max(1, sizes.connections // SUBSCRIBER_WORKERS)
            per_connection = max(1, sizes.subscriptions // (per_worker * SUBSCRIBER_WORKERS))
            readies = [new_event() for _ in range(SUBSCRIBER_WORKERS)]
            ctx.say(f"opening {per_worker * SUBSCRIBER_WORKERS * per_connection:,} live "
                    f"subscriptions over {per_worker * SUBSCRIBER_WORKERS:,} websockets")
            subscribers = [Worker(f"soak subscribers {i}", hold_and_count, f"ws://{host}:{port}"
                                  "/graphql", per_worker, per_connection, LIVE_CUSTOMER,
                                  "customer", keys[i::SUBSCRIBER_WORKERS] or keys, ready, stop)
                           for i, ready in enumerate(readies)]
            workers += subscribers
            for ready in readies:
                if not ready.wait(300):
                    raise BenchError("the soak's subscriptions were not all open within 300 s")

            mix = [listed if i % sizes.list_share == sizes.list_share - 1 else p
                   for i, p in enumerate(points * sizes.list_share)]
            # The capacity the soak halves: the same mix at saturation, with the
            # subscriptions open and the engine running, as during the soak.
            ctx.say(f"probe: the soak's mix at saturation for {sizes.probe_s:.0f} s")
            probe = Worker("probe", closed_loop, host, port, mix, PROBE_CONNECTIONS,
                           sizes.probe_warmup_s, sizes.probe_s, b'"data"', [b'"errors"'],
                           [gateway.pid]).result(timeout_s=sizes.probe_s + 120)
            if probe["bad"]:
                raise BenchError(f"the probe got wrong answers: {probe['errors']}")
            rate = max(1.0, float(int(probe["rps"] * sizes.load_share)))
            ctx.say(f"soak: {rate:,.0f} requests/s ({sizes.load_share:.0%} of "
                    f"{probe['rps']:,.0f}) for {sizes.minutes:g} min, one in "
                    f"{sizes.list_share} a list page")
            load = Worker("soak load", open_loop, host, port, mix, rate, 0.0, duration_s,
                          LOAD_CONNECTIONS, b'"data"', [b'"errors"'], [gateway.pid])
            workers.append(load)
            pids = {"gateway": gateway.pid, "engine_jvm": _jvm_pid(spark),
                    "engine_driver": os.getpid()}
            samples: dict[str, list[tuple[float, int]]] = {name: [] for name in pids}
            step_totals: list[tuple[float, dict[str, tuple[float, int]]]] = []
            changed: list[tuple[float, int]] = []  # rows the graph's batches changed
            maintained: list[tuple[float, dict[str, tuple[float, int]]]] = []
            driver: list[tuple[float, dict[str, int]]] = []  # the driver's memory by kind
            sampled = new_event()
            started_at = time.time()
            storage = Worker("engine storage", sample_engine_storage, settings, catalog,
                             sizes.storage_sample_s, started_at, sampled)
            workers.append(storage)
            while True:
                now = round(time.time() - started_at, 2)
                for name, pid in pids.items():
                    kb = _rss_kb(pid)
                    if kb is not None:
                        samples[name].append((now, kb))
                step_totals.append((now, graph_step_totals()))  # the engine runs here
                changed.append((now, rows_changed_total()))
                maintained.append((now, maintenance_totals()))
                if not driver or now - driver[-1][0] >= sizes.storage_sample_s:
                    driver.append((now, driver_memory.sample()))
                if load.done(sizes.sample_s):
                    break
            sampled.set()
            held = storage.result(timeout_s=120)  # what the engine keeps
            loaded = load.result(timeout_s=60)
            stop.set()
            subscribed = [w.result(timeout_s=120) for w in subscribers]
            gateway_alive = gateway.process.alive()
        stopped = [q.name for q in queries if not q.isActive or q.exception() is not None]
    finally:
        stop.set()
        for worker in workers:
            worker.stop()
        for query in queries:
            with contextlib.suppress(Exception):
                query.stop()

    def total(key: str) -> int:
        return sum(s[key] for s in subscribed)

    errors = {
        "http_wrong_answers": loaded["bad"],
        "subscription_errors": total("errors"),
        "websocket_closes": total("closes"),
        "stale_versions": total("stale_versions"),
        "engine_queries_stopped": len(stopped),
        "gateway_died": int(not gateway_alive),
    }
    growth = {name: memory_growth(series, duration_s) for name, series in samples.items()}
    engine_flat = engine_storage.flatness(held, duration_s, growth_window(duration_s))
    steps = engine_storage.graph_steps(step_totals, duration_s, growth_window(duration_s))
    per_row = engine_storage.per_changed_row(step_totals, changed, duration_s,
                                             growth_window(duration_s))
    maintenance = engine_storage.maintenance_runs(maintained)
    driver_kinds = sorted({kind for _, sample in driver for kind in sample})
    latency = loaded["latency_ms"]
    problems = verdict(errors, growth["gateway"])
    return {
        "passed": not problems,
        "problems": problems,
        "minutes": sizes.minutes,
        "capacity_rps": round(probe["rps"], 1),
        "rate": rate,
        "requests": loaded["due"],
        "answered": loaded["answered"],
        "latency_ms": {k: round(v, 3) for k, v in (
            ("p50", percentile(latency, 50)), ("p99", percentile(latency, 99)),
            ("max", max(latency)))} if latency else {},
        "errors": errors,
        "error_samples": loaded["errors"] + [x for s in subscribed for x in s["samples"]],
        "http_wrong_statuses": loaded.get("bad_statuses", {}),
        "engine_queries_stopped": stopped,
        "subscriptions": total("subscriptions"),
        "subscriptions_not_found": total("not_found"),
        "subscription_current": total("current"),
        "subscription_changes": total("changes"),
        "memory_growth": growth,
        "rss_kb": samples,
        "engine_storage": held,
        "engine_flatness": engine_flat,
        "engine_graph_steps": steps,
        "engine_per_changed_row": per_row,
        "engine_maintenance": maintenance,
        "engine_driver_memory": driver,
        "engine_driver_memory_change": engine_storage.flatness(
            driver, duration_s, growth_window(duration_s), driver_kinds),
        # The same, from when the history has filled (settled_window); the figures above
        # compare from the second minute, as the rule says.
        "settled": settled(settled_window(sizes.history, settings.delta_maintenance_interval_s,
                                          duration_s),
                           duration_s, held, driver, driver_kinds, samples),
        "engine_slowest_batches": engine_storage.slowest_batches(step_totals, maintenance),
        "history": sizes.history or "the views' own",
        "latency_over_time": latency_over_time(latency, rate, sizes.sample_s),
        "sizes": asdict(sizes),
    }


def sample_engine_storage(settings: Settings, catalog: Any, interval_s: float,
                          started_at: float, stop: Any) -> list[tuple[float, dict[str, float]]]:
    """What the engine keeps (engine_storage.sample), every `interval_s` until `stop` is
    set, stamped in seconds since `started_at` (wall clock, shared with the soak).

    Paced by the clock, not by a pause after each sample: a sample reads every view's Delta
    log, and with a pause of `interval_s` after each one a 15-second soak on a loaded host
    got 9 samples instead of 15."""
    client = connect_redis(settings.redis_url)
    held: list[tuple[float, dict[str, float]]] = []
    due = time.monotonic()
    try:
        while True:
            held.append((round(time.time() - started_at, 2),
                         engine_storage.sample(settings, catalog, client)))
            # A sample longer than the interval delays the next one, never bunches them.
            due = max(due + interval_s, time.monotonic())
            if stop.wait(max(0.0, due - time.monotonic())):
                return held
    finally:
        client.close()


def soak_in_child(settings: Settings, sizes: SoakSizes, workdir: Path) -> dict[str, Any]:
    """The soak in a (worker) process of its own: its SparkSession and Kafka clients end
    with it, before the runner stops the services they talk to."""
    from viewgate.bench.group import BenchContext
    from viewgate.bench.runner import MODES

    ctx = BenchContext(settings, MODES["quick"], workdir,
                       say=lambda text: print(text, flush=True))
    try:
        return measure(ctx, sizes)
    finally:
        ctx.close()


# --- Report -----------------------------------------------------------------------------


def save_soak_plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (memory, latency, engine) = plt.subplots(3, 1, figsize=(11, 11), sharex=True)
    for name, series in report["rss_kb"].items():
        if series:
            memory.plot([t for t, _ in series], [kb / 1024 for _, kb in series], label=name)
    memory.set_ylabel("RSS (MiB)")
    memory.grid(True, alpha=0.3)
    memory.legend()
    buckets = report["latency_over_time"]
    for key in ("p50_ms", "p99_ms"):
        latency.plot([b["t_s"] for b in buckets], [b[key] for b in buckets],
                     label=key.replace("_ms", ""))
    latency.set_ylabel(f"latency (ms) per {report['sizes']['sample_s']:g} s")
    latency.grid(True, alpha=0.3)
    latency.legend()
    held = report.get("engine_storage", [])
    engine.plot([t for t, _ in held], [s["batch_ms"] / 1000 for _, s in held],
                label="engine batch (s)")
    engine.plot([t for t, _ in held], [s["delta_bytes_per_row"] / 100 for _, s in held],
                label="Delta bytes per row / 100")
    live = [(t, s["delta_live_data_bytes_per_row"]) for t, s in held
            if "delta_live_data_bytes_per_row" in s]
    if live:
        engine.plot([t for t, _ in live], [b / 100 for _, b in live],
                    label="latest version's data bytes per row / 100")
    engine.set_xlabel("seconds into the soak")
    calm = report.get("settled")
    if calm is not None:  # the two windows the `settled` block compares
        end = report["minutes"] * 60
        for axis in (memory, engine):
            for begin in (calm["from_s"], end - calm["window_s"]):
                axis.axvspan(begin, begin + calm["window_s"], color="grey", alpha=0.12)
    engine.grid(True, alpha=0.3)
    engine.legend()
    fig.suptitle(f"Soak: {report['rate']:,.0f} requests/s "
                 f"({report['sizes'].get('load_share', 0.5):.0%} of "
                 f"{report['capacity_rps']:,.0f}) for {report['minutes']:g} min, "
                 f"{report['subscriptions']:,} subscriptions, "
                 f"{report['sizes']['demo_rate']:,.0f} events/s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def print_report(console: Any, report: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="viewgate soak")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("capacity_rps (probe of the mix)", f"{report['capacity_rps']:,.0f}"),
        ("offered load", f"{report['rate']:,.0f}/s for {report['minutes']:g} min"),
        ("requests answered", f"{report['answered']:,} of {report['requests']:,}"),
        ("latency p50 / p99 / max", " / ".join(
            f"{report['latency_ms'].get(k, 0):.2f} ms" for k in ("p50", "p99", "max"))),
        ("subscriptions", f"{report['subscriptions']:,} ({report['subscription_changes']:,} "
                          "changes received)"),
    ]
    rows += [(kind, str(count)) for kind, count in report["errors"].items()]
    for name, growth in report["memory_growth"].items():
        rows.append((f"{name} RSS growth", "n/a" if growth is None else
                     f"{growth['growth']:+.1%} ({growth['baseline_kb'] / 1024:,.0f} -> "
                     f"{growth['final_kb'] / 1024:,.0f} MiB)"))
    for name, flat in report.get("engine_flatness", {}).items():
        rows.append((f"engine {name}", "n/a" if flat["change"] is None else
                     f"{flat['change']:+.1%} ({flat['start']:,.1f} -> {flat['end']:,.1f})"))
    for name, flat in report.get("engine_per_changed_row", {}).items():
        rows.append((f"engine {name}", "n/a" if flat["change"] is None else
                     f"{flat['change']:+.1%} ({flat['start']:,.1f} -> {flat['end']:,.1f})"))
    for step, mean in report.get("engine_graph_steps", {}).items():
        if mean["start_ms"] is not None and mean["end_ms"] is not None:
            rows.append((f"engine step {step}", f"{mean['start_ms']:,.1f} -> "
                         f"{mean['end_ms']:,.1f} ms a batch"))
    for kind, change in report.get("engine_driver_memory_change", {}).items():
        if change["change"] is not None:
            rows.append((f"engine driver {kind}", f"{change['change']:+.1%} "
                         f"({change['start']:,.0f} -> {change['end']:,.0f})"))
    calm = report.get("settled")
    if calm is not None:
        span = (f"minutes {calm['from_s'] / 60:g}-{(calm['from_s'] + calm['window_s']) / 60:g}"
                f" -> the last {calm['window_s'] / 60:g}")
        changes = [(f"settled engine {name}", flat) for name, flat in calm["engine"].items()]
        changes += [(f"settled driver {kind}", flat)
                    for kind, flat in calm["engine_driver_memory"].items()]
        changes += [(f"settled {name} RSS", flat) for name, flat in calm["rss_kb"].items()]
        rows += [(name, f"{flat['change']:+.1%} ({span})") for name, flat in changes
                 if flat["change"] is not None]
    runs = report.get("engine_maintenance", [])
    if runs:
        longest = max(runs, key=lambda r: r["seconds"])
        rows.append(("engine maintenance and compactions", f"{sum(r['runs'] for r in runs)} "
                     f"runs, {sum(r['seconds'] for r in runs):,.1f} s; longest "
                     f"{longest['seconds']:,.1f} s ({longest['view']})"))
    for slow in report.get("engine_slowest_batches", [])[:3]:
        longest = ", ".join(f"{step} {ms:,.0f}" for step, ms in slow["steps_ms"].items())
        rows.append((f"engine slow batches at {slow['t_s']:,.0f} s", f"{slow['batch_ms']:,.0f} ms"
                     f" ({longest}; {', '.join(slow['maintenance']) or 'no'} maintenance)"))
    rows.append(("views' history", report.get("history", "the views' own")))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    window = growth_window(report["minutes"] * 60)
    console.print(f"growth: median RSS of the last {window:.0f} s against the median of "
                  f"the {window:.0f} s after a {window:.0f} s warm-up")
    if report["passed"]:
        console.print("[green]PASS[/green]: no error, gateway memory growth under "
                      f"{GROWTH_LIMIT:.0%}")
    else:
        console.print(f"[red]FAIL[/red]: {'; '.join(report['problems'])}")


def run_soak(base: Settings, sizes: SoakSizes, out_dir: Path, console: Any) -> dict[str, Any]:
    """Start Kafka and Redis, run the soak in a worker process, write
    <out_dir>/soak.json and soak.png, print the table."""
    from viewgate.bench.runner import _sigterm_raises, bench_stack
    from viewgate.bench.workers import Worker

    with _sigterm_raises(), tempfile.TemporaryDirectory(prefix="viewgate-soak-") as tmp:
        workdir = Path(tmp)
        with bench_stack(base, workdir, console.print) as settings:
            worker = Worker("soak", soak_in_child, settings, sizes, workdir, daemon=False)
            try:
                report = worker.result(timeout_s=sizes.minutes * 60 + 1200)
            finally:
                worker.stop()
    return write_report(report, out_dir, console)


def write_report(report: dict[str, Any], out_dir: Path, console: Any) -> dict[str, Any]:
    from viewgate.bench import results

    report = {**results.run_meta("soak"), **report}
    results.write(out_dir / "soak.json", report)
    save_soak_plot(report, out_dir / "soak.png")
    console.print(f"wrote {out_dir / 'soak.json'} and {out_dir / 'soak.png'}")
    print_report(console, report)
    return report
