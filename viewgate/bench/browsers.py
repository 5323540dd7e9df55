"""The browsers group: one gateway process holding 10,000 browser tabs, each a websocket of
its own with three subscriptions, while tabs come and go.

Everything runs live, as in the subscriptions group: the demo views in the engine (Spark in
this group's process), demo traffic from a producer process, the gateway as `viewgate
gateway` serves it (`browser_workers` uvicorn workers, one by default), and the tabs
(viewgate.bench.tab_clients) spread over `TAB_PROCESSES` client processes. Each tab
watches the live value of one hot customer, the changes of the hot customer and of a
customer of its own, and a live page of its own customer's orders.

Phases, in one run:
1. Open: the tabs open (paced), and each gets its live value's and its list's first
   message. `ws_rss_kb_per_subscription` is the gateway's resident memory growth over the
   subscriptions opened (connections included).
2. Fan-out: the hot customer is renamed through Kafka; every tab's live value and change
   stream receive it. `ws_fanout_10k_connections_s` is first to last copy of the live
   values (every tab), `fanout_from_event_s` produced -> last copy.
3. Idle: demo traffic stops; the gateway's CPU share while the tabs only keep alive
   (uvicorn's websocket pings every `ws_ping_interval` s, the tabs' graphql-transport-ws
   `ping` every `TAB_PING_S` s).
4. Churn: demo traffic again, and `CHURN_RATE` new tabs a second (more than the goal,
   `CHURN_GOAL`: the tabs served a second show whether it holds) for `browser_churn_s`,
   each subscribing, receiving its first messages, then closing. The hot customer is
   renamed again in the middle (`ws_fanout_churn_s`). Afterwards the gateway must hold
   as many websockets, subscriptions and tasks as before, and memory not grow.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schema import demo
from schema.settings import Settings
from viewgate.bench.group import BenchContext, BenchError, Group, GroupResult
from viewgate.bench.load import cpu_seconds, rss_kb
from viewgate.bench.report import Figure
from viewgate.bench.servers import LIMITS_OFF, settings_env, uvicorn_args
from viewgate.bench.stats import percentile
from viewgate.bench.workers import Worker, new_event, produce_paced
from viewgate.serving import WEBSOCKETS, WORKER_HEALTHCHECK_S
from viewgate.stack.process import ManagedProcess, free_port, wait_until

TOPIC_PREFIX = "bench-browsers"
TAB_PROCESSES = 4  # client processes holding the tabs
CHURN_PROCESSES = 2  # client processes opening and closing tabs
CHURN_GOAL = 200.0  # tabs a second the gateway must serve while churning (issue 18)
# New tabs a second offered during the churn: more than the goal, so that the tabs served a
# second can show whether the goal holds (a rate measured against an offer of exactly the
# goal can only come out at or under it).
CHURN_RATE = 220.0
CHURN_HOLD_S = 1.0  # how long a churning tab stays after its first messages
OPEN_RATE = 200.0  # new tabs a second while opening (all processes together)
TAB_PING_S = 20.0  # a tab's graphql-transport-ws keep-alive ping
IDLE_S = 20.0  # the idle window
QUIET_S = 2.0  # no change-feed event for this long before the idle window starts
QUIET_WAIT_S = 60.0  # ... waited for at most this long
TRAFFIC_RATE = 20.0  # demo events a second while tabs are open
TAB_COMPRESSION = "deflate"  # what the tabs offer, as browsers do
MAX_CONNECTIONS = 30_000  # the gateway's VIEWGATE_GATEWAY_MAX_CONNECTIONS in this group

FIGURES = (
    Figure("ws_connections_open", "websockets held by one gateway process, all answered"),
    Figure("ws_subscriptions_open", "their subscriptions, each with a message", ""),
    Figure("ws_fanout_10k_connections_s", "one change to every tab, first to last copy", "s",
           below=1),
    Figure("ws_fanout_from_event_s", "the same change, produced -> last copy", "s", below=2),
    Figure("ws_rss_kb_per_subscription", "gateway memory per subscription (tabs included)",
           "KiB", below=12),
    Figure("ws_idle_cpu_share", "idle tabs' keep-alive: gateway CPU share", "cores",
           below=0.1),
    Figure("ws_churn_per_s", "tabs opened, subscribed and closed a second (served)", "",
           at_least=CHURN_GOAL),
    Figure("ws_fanout_churn_s", "one change to every tab during the churn", "s", below=1),
    Figure("ws_churn_rss_growth_kb", "gateway memory after the churn, against before", "KiB"),
    Figure("ws_churn_tasks_left", "gateway tasks after the churn, against before", ""),
    Figure("ws_generator_cpu", "busiest client process's CPU while opening", "cores"),
)


def _rss_kb(pids: list[int]) -> int:
    return sum(rss_kb(pid) for pid in pids)


def _workers(pid: int) -> list[int]:
    """uvicorn's worker processes under its supervisor `pid` (not multiprocessing's
    resource tracker, also a child of it)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"resource_tracker" not in cmdline:
                out.append(int(child))
    return out


class Gateway:
    """The gateway under test: uvicorn with `workers` processes behind one port. With
    one, the process serving is uvicorn's own; with more, its workers (children)."""

    def __init__(self, settings: Settings, log_dir: Path, workers: int) -> None:
        self.port = free_port()
        self.workers = workers
        # 10,000 tabs and the churn's on top: uvicorn's limit_concurrency counts every
        # websocket (its task) for as long as it is open, and past the limit refuses new
        # connections and requests (503). The default, 10,000, would refuse the last tabs.
        settings = settings.model_copy(update={"gateway_max_connections": MAX_CONNECTIONS})
        args = uvicorn_args("gateway.app:create_app", self.port, settings)
        args[args.index("--workers") + 1] = str(workers)
        if workers > 1:  # as `viewgate gateway --workers N` runs them
            args += ["--timeout-worker-healthcheck", str(WORKER_HEALTHCHECK_S)]
        self.process = ManagedProcess(
            "gateway", args, log_dir / "gateway.log",
            env={**settings_env(settings), **LIMITS_OFF,
                 "VIEWGATE_GATEWAY_MAX_CONNECTIONS": str(MAX_CONNECTIONS)})

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/graphql"

    def pids(self) -> list[int]:
        """The processes serving (uvicorn's workers, or uvicorn itself)."""
        if self.workers == 1:
            return [self.process.pid]
        return _workers(self.process.pid)

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/subscriptions",
                                    timeout=30) as answer:
            return json.loads(answer.read())

    def upgrades_waited(self) -> float:
        """Websocket upgrades that waited at the opening gate so far (viewgate.opening_gate),
        from /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                    timeout=30) as answer:
            text = answer.read().decode()
        return sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples
                   if sample.name == "viewgate_gateway_websocket_upgrades_waited_total")

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids())

    @contextlib.contextmanager
    def running(self) -> Iterator[Gateway]:
        self.process.start()
        try:
            def up() -> bool:
                try:
                    stats = self.stats()
                except OSError:
                    return False
                return bool(stats["feedReady"]) and len(self.pids()) == self.workers
            wait_until(up, timeout_s=120, what="the gateway (uvicorn)",
                       alive=self.process.alive, log=self.process.log_path)
            yield self
        finally:
            self.process.stop()


def _feed_events(gateway: Gateway) -> int:
    """Change-feed events the gateway has read so far, all views together."""
    return sum(gateway.stats()["positions"].values())


def _wait_quiet(gateway: Gateway) -> float:
    """Wait until the gateway has read no change-feed event for QUIET_S (at most
    QUIET_WAIT_S); how long that took."""
    started = time.monotonic()
    seen, since = _feed_events(gateway), time.monotonic()
    while time.monotonic() - since < QUIET_S and time.monotonic() - started < QUIET_WAIT_S:
        time.sleep(0.25)
        now = _feed_events(gateway)
        if now != seen:
            seen, since = now, time.monotonic()
    return round(time.monotonic() - started, 1)


def _in_feed_ms(settings: Settings, view: str, marker: str, since_ms: float,
                timeout_s: float = 20) -> float | None:
    """When the engine wrote the change carrying `marker` to `view`'s change feed (its
    Kafka timestamp, ms), looked for from `since_ms` on; None if not found."""
    from confluent_kafka import Consumer, TopicPartition

    from schema.storage import changefeed_topic

    topic = changefeed_topic(view, settings.changefeed_prefix)
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"bench-browsers-{time.time_ns()}",
                         "enable.auto.commit": False})
    try:
        start = consumer.offsets_for_times([TopicPartition(topic, 0, int(since_ms) - 1000)],
                                           timeout=10)
        consumer.assign(start)
        needle = marker.encode()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            if needle in (message.value() or b""):
                return float(message.timestamp()[1])
        return None
    finally:
        consumer.close()


def _scheduled(pid: int) -> tuple[float, float]:
    """A process's seconds on a CPU and seconds runnable but waiting for one, so far, over
    its live threads (/proc/<pid>/task/*/schedstat)."""
    ran = waited = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:  # the thread ended while we read
            continue
        ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return ran / 1e9, waited / 1e9


def _schedule_over(pids: dict[str, list[int]], before: dict[str, list[tuple[float, float]]],
                   seconds: float) -> dict[str, dict[str, float]]:
    """Per kind of process: the cores it ran on and the cores' worth it waited for one
    since `before` (the busiest process of the kind)."""
    out = {}
    for kind, group in pids.items():
        now = [_scheduled(pid) for pid in group]
        spans = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(before[kind], now, strict=True)]
        out[kind] = {"ran": round(max(r for r, _ in spans) / seconds, 3),
                     "waited": round(max(w for _, w in spans) / seconds, 3)}
    return out


def _spread(values: list[float]) -> float:
    return round((max(values) - min(values)) / 1000, 4)


def _wait(events: list[Any], deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    for event in events:
        if not event.wait(max(0.0, deadline - time.monotonic())):
            raise BenchError(f"{what}: not within {deadline_s:.0f} s")


def _rename(settings: Settings, catalog: Any, row: dict[str, Any], marker: str) -> float:
    """Rename the hot customer to `marker` through Kafka; when it was produced (ms)."""
    from viewgate.bench.gateway import produce_records

    produced_ms = time.time() * 1000
    key = row["customer_id"]
    produce_records(settings.kafka_bootstrap, [(catalog.sources["customers"].topic, key,
                                                json.dumps(dict(row, name=marker)).encode())],
                    catalog)
    return produced_ms


def measure(ctx: BenchContext, settings: Settings, catalog: Any, workers: int) -> dict:
    from viewgate.bench.gateway import customer_rows

    sizes = ctx.sizes
    tabs = sizes.browser_tabs
    churn_s = sizes.browser_churn_s
    rows = customer_rows(settings)
    if len(rows) < 2:
        raise BenchError("no Customer rows to subscribe to")
    keys = sorted(rows)
    hot, own = keys[0], keys[1:]
    markers = [f"fan-{time.time_ns()}", f"churn-{time.time_ns()}"]
    renamed = {demo.CATALOG.sources[n].topic: s.topic for n, s in catalog.sources.items()}
    stop = new_event()
    readies = [new_event() for _ in range(TAB_PROCESSES)]
    reached = [[new_event() for _ in markers] for _ in range(TAB_PROCESSES)]
    per_process = tabs // TAB_PROCESSES
    tabs = per_process * TAB_PROCESSES
    gateway = Gateway(settings, ctx.workdir / f"servers-{workers}", workers)
    workers_started: list[Worker] = []
    out: dict[str, Any] = {}
    with gateway.running():
        pids = gateway.pids()
        try:
            traffic = Worker("demo traffic", produce_paced, settings.kafka_bootstrap, renamed,
                             TRAFFIC_RATE, 3600, 41)
            workers_started.append(traffic)
            rss_before = _rss_kb(pids)
            gc_start = gateway.stats()["gcCollections"] if workers == 1 else None
            waited_start = gateway.upgrades_waited() if workers == 1 else None
            ctx.say(f"opening {tabs:,} tabs ({3 * tabs:,} subscriptions) over "
                    f"{TAB_PROCESSES} client processes; gateway pid(s) {pids}")
            started = time.monotonic()
            holders = [Worker(f"tabs {i}", _hold, gateway.url, per_process, hot,
                              own[i::TAB_PROCESSES], readies[i], stop, markers, reached[i],
                              TAB_COMPRESSION, TAB_PING_S, OPEN_RATE / TAB_PROCESSES)
                       for i in range(TAB_PROCESSES)]
            workers_started += holders
            client_cpu = [cpu_seconds(w.process.pid) for w in holders]
            _wait(readies, 300, f"{tabs:,} tabs with their first messages")
            open_s = time.monotonic() - started
            client_cpu = [cpu_seconds(w.process.pid) - c for w, c in zip(holders, client_cpu,
                                                                          strict=True)]
            time.sleep(2)  # the last sends leave the gateway's buffers
            rss_open = _rss_kb(pids)
            gc_open = gateway.stats()["gcCollections"] if workers == 1 else None
            ctx.say(f"{tabs:,} tabs open in {open_s:.0f} s; renaming the hot customer {hot}")
            produced = _rename(settings, catalog, rows[hot], markers[0])
            _wait([r[0] for r in reached], 120, "the change to every tab")
            in_feed = _in_feed_ms(settings, "Customer", markers[0], produced)
            noted = gateway.stats().get("lastFanout") if workers == 1 else None
            traffic.stop()
            # The engine's last batches of the demo traffic reach the gateway seconds after
            # it stops: their fan-out is not keep-alive. Wait for the feed to be quiet.
            quiet_s = _wait_quiet(gateway) if workers == 1 else None
            ctx.say(f"idle for {IDLE_S:.0f} s (no demo traffic)")
            if workers != 1:
                time.sleep(3)  # the engine's last batches
            feed0 = _feed_events(gateway) if workers == 1 else None
            cpu0 = gateway.cpu()
            time.sleep(IDLE_S)
            idle = (gateway.cpu() - cpu0) / IDLE_S
            idle_events = _feed_events(gateway) - feed0 if feed0 is not None else None
            before = gateway.stats() if workers == 1 else {}
            waited_open = gateway.upgrades_waited() if workers == 1 else None
            rss_churn0 = _rss_kb(pids)
            ctx.say(f"churn: {CHURN_RATE:.0f} new tabs a second for {churn_s:.0f} s")
            traffic = Worker("demo traffic", produce_paced, settings.kafka_bootstrap, renamed,
                             TRAFFIC_RATE, 3600, 43)
            workers_started.append(traffic)
            churners = [Worker(f"churn {i}", _churn, gateway.url, CHURN_RATE / CHURN_PROCESSES,
                               churn_s, hot, own, CHURN_HOLD_S, TAB_COMPRESSION)
                        for i in range(CHURN_PROCESSES)]
            workers_started += churners
            churn_cpu0 = gateway.cpu(), time.monotonic()
            time.sleep(churn_s / 2)
            # Who had the cores while the change went out (the tabs read their copies on
            # the same two cores as the gateway, the churning tabs and the engine).
            sched_pids = {"gateway": pids, "tabs": [w.process.pid for w in holders],
                          "churning_tabs": [w.process.pid for w in churners],
                          "engine": [os.getpid()]}
            sched0 = {k: [_scheduled(p) for p in v] for k, v in sched_pids.items()}
            sched_t0 = time.monotonic()
            produced_churn = _rename(settings, catalog, rows[hot], markers[1])
            # Counted below: without copies (the engine stopped, say) the figure is None.
            deadline = time.monotonic() + 120
            for event in (r[1] for r in reached):
                event.wait(max(0.0, deadline - time.monotonic()))
            churn_schedule = _schedule_over(sched_pids, sched0, time.monotonic() - sched_t0)
            noted_churn = gateway.stats().get("lastFanout") if workers == 1 else None
            churned = [w.result(timeout_s=churn_s + 120) for w in churners]
            in_feed_churn = _in_feed_ms(settings, "Customer", markers[1], produced_churn)
            # The gateway's CPU over the churn (cores; one worker is one core at most).
            churn_cpu = round((gateway.cpu() - churn_cpu0[0])
                              / (time.monotonic() - churn_cpu0[1]), 3)
            traffic.stop()
            after: dict[str, Any] = {}
            if workers == 1:
                def settled() -> bool:
                    try:  # an overloaded gateway answers late: ask again
                        after.update(gateway.stats())
                    except OSError:
                        return False
                    return after["websockets"] == before["websockets"] \
                        and after["subscribers"] == before["subscribers"]
                deadline = time.monotonic() + 180
                while not settled() and time.monotonic() < deadline:
                    time.sleep(1)
                out["ws_churn_settled_s"] = round(time.monotonic() - deadline + 180, 1)
                if not settled():
                    raise BenchError(f"the churned tabs' websockets did not close: {after} "
                                     f"against {before} before the churn")
                time.sleep(2)
                after.update(gateway.stats())
                after["upgrades_waited"] = gateway.upgrades_waited()
            rss_churn1 = _rss_kb(pids)
            stop.set()
            held = [w.result(timeout_s=120) for w in holders]
        finally:
            stop.set()
            for worker in workers_started:
                worker.stop()
    # A tab that failed (refused, or closed by the gateway) is counted and reported, with
    # what the gateway logged: the figures are those of the tabs that stayed.
    failures = sum(h["failures"] for h in held)
    copies = [t for h in held for t in h["arrivals"][markers[0]]["v"]]
    changes = [t for h in held for t in h["arrivals"][markers[0]]["c"]]
    churn_copies = [t for h in held for t in h["arrivals"][markers[1]]["v"]]
    if not copies or len(copies) < tabs - failures or len(changes) < tabs - failures:
        raise BenchError(f"{len(copies):,} live values and {len(changes):,} change streams "
                         f"of {tabs - failures:,} tabs got the change")
    opened = sum(sum(h["firsts"].values()) for h in held)
    completed = sum(c["completed"] for c in churned)
    churn_failures = sum(c["failures"] for c in churned)
    first_ms = [t for c in churned for t in c["first_ms"]]
    out.update({
        "ws_tab_failures": failures,
        "ws_tab_failed": [f for h in held for f in h["failed"]][:5],
        "ws_gateway_log": _log_excerpt(gateway.process.log_path),
        "ws_gateway_workers": workers,
        "ws_connections_open": sum(h["firsts"]["v"] for h in held),
        "ws_subscriptions_open": opened,
        "ws_open_s": round(open_s, 1),
        "ws_fanout_10k_connections_s": _spread(copies),
        "ws_fanout_from_event_s": round((max(copies) - produced) / 1000, 3),
        "ws_fanout_first_copy_s": round((min(copies) - produced) / 1000, 3),
        # The split of the first copy: produced -> the engine wrote it to the change feed
        # (the engine's share), -> the first tab had it (the gateway's: its feed reader,
        # the fan-out to that tab, the tab's read).
        "ws_fanout_in_feed_s": round((in_feed - produced) / 1000, 3)
        if in_feed is not None else None,
        "ws_fanout_feed_to_first_copy_s": round((min(copies) - in_feed) / 1000, 3)
        if in_feed is not None else None,
        "ws_fanout_gateway_split_s": _gateway_split(noted, in_feed, min(copies), max(copies)),
        "ws_fanout_changes_last_copy_s": round((max(changes) - produced) / 1000, 3),
        "ws_rss_kb_per_subscription": round((rss_open - rss_before) / opened, 2),
        "ws_rss_kb": {"before": rss_before, "open": rss_open, "churn_before": rss_churn0,
                      "churn_after": rss_churn1},
        "ws_idle_cpu_share": round(idle, 4),
        "ws_idle_feed_events": idle_events,
        "ws_idle_quiet_wait_s": quiet_s,
        "ws_churn_per_s": round(sum(_served_per_s(c) for c in churned), 1),
        "ws_churn_offered_per_s": CHURN_RATE,
        "ws_churn_gateway_cpu": churn_cpu,
        "ws_churn_seconds": [round(c["seconds"], 1) for c in churned],
        "ws_churn_tabs": completed,
        "ws_churn_failures": churn_failures,
        "ws_churn_failed": [f for c in churned for f in c["failed"]][:5],
        "ws_churn_first_messages_ms": _p50_p99(first_ms),
        # Connect -> acknowledged: the handshake, and the wait at the opening gate.
        "ws_churn_open_ms": _p50_p99([t for c in churned for t in c["open_ms"]]),
        "ws_fanout_churn_s": _spread(churn_copies) if churn_copies else None,
        "ws_fanout_churn_copies": len(churn_copies),
        "ws_fanout_churn_from_event_s": round((max(churn_copies) - produced_churn) / 1000, 3)
        if churn_copies else None,
        # The same split for the fan-out during the churn, and each tab process's own
        # first to last copy (the tabs' share: how long each took to read its copies).
        "ws_fanout_churn_gateway_split_s": _gateway_split(
            noted_churn, in_feed_churn, min(churn_copies), max(churn_copies))
        if churn_copies else None,
        "ws_fanout_churn_schedule": churn_schedule,
        "ws_fanout_churn_per_process_s": [
            _spread(h["arrivals"][markers[1]]["v"]) if h["arrivals"][markers[1]]["v"] else None
            for h in held],
        # The load generator's own cost of a message: each tab process's CPU from its first
        # to its last copy of a fan-out, per copy (microseconds).
        "ws_tab_cpu_us_per_copy": {
            "fanout": [h["copy_cpu_us"][markers[0]] for h in held],
            "churn": [h["copy_cpu_us"][markers[1]] for h in held]},
        "ws_churn_rss_growth_kb": rss_churn1 - rss_churn0,
        "ws_generator_cpu": round(max(client_cpu) / open_s, 3),
        "ws_generator_cpu_all": [round(c / open_s, 3) for c in client_cpu],
        "ws_pongs": sum(h["pongs"] for h in held),
        "ws_implementation": WEBSOCKETS,
    })
    if workers == 1:
        out["ws_churn_tasks_left"] = after["tasks"] - before["tasks"]
        out["ws_tasks"] = {"before_churn": before["tasks"], "after_churn": after["tasks"]}
        # Websocket upgrades that waited for the gateway's event loop to catch up.
        out["ws_upgrades_waited"] = {"open": round(waited_open - waited_start),
                                     "churn": round(after["upgrades_waited"] - waited_open)}
        # The garbage collector's passes (young, middle, full) while the tabs opened, and
        # from the idle window's end through the churn.
        out["ws_gc_collections"] = {
            "open": [b - a for a, b in zip(gc_start, gc_open, strict=True)],
            "churn": [b - a for a, b in zip(before["gcCollections"], after["gcCollections"],
                                            strict=True)]}
    return out


def _p50_p99(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": round(percentile(values, 50), 1), "p99": round(percentile(values, 99), 1)}


def _gateway_split(noted: dict[str, float] | None, in_feed_ms: float | None,
                   first_ms: float, last_ms: float) -> dict[str, float] | None:
    """The gateway's share of the first copy, from its note of the fan-out's batch
    (/subscriptions `lastFanout`): the change feed to its reader (Kafka's delivery),
    the reader to the dispatch's start (the event loop's turn), the dispatch (every
    subscriber's message framed), and its end to the first tab's copy (the writes, which
    leave at the end of the loop's turn, and the tab's read). Then the writes' end (when
    the gateway had written every frame) and from there to the last tab's copy (the
    tabs' reading)."""
    if not noted or in_feed_ms is None:
        return None
    dispatched = noted["dispatch_started_ms"] + noted["dispatch_ms"]
    split = {"feed_to_reader": round((noted["received_ms"] - in_feed_ms) / 1000, 3),
             "reader_to_dispatch": round((noted["dispatch_started_ms"]
                                          - noted["received_ms"]) / 1000, 3),
             "dispatch": round(noted["dispatch_ms"] / 1000, 3),
             "dispatch_to_first_copy": round((first_ms - dispatched) / 1000, 3),
             "messages": noted["delivered"]}
    written = noted.get("written_ms")
    if written is not None:
        split["dispatch_to_written"] = round((written - dispatched) / 1000, 3)
        split["written_to_last_copy"] = round((last_ms - written) / 1000, 3)
    return split


def _served_per_s(churned: dict[str, Any]) -> float:
    """A churn process's tabs served a second: those that had their first messages, over
    the time from the first to the last of them. (Over the time from the first start to the
    last close, as measured before, the tabs' own hold of 1 s counted: 200 tabs a second
    served without delay came out as 196.)"""
    served = churned["served"]
    if not served or served[1] <= served[0]:
        return 0.0
    return (len(churned["first_ms"]) - 1) / (served[1] - served[0])


def _log_excerpt(path: Path, lines: int = 8) -> list[str]:
    """The gateway log's last warnings and errors (uvicorn logs at warning level)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in text if line.strip()][-lines:]


def _hold(*args: Any) -> dict[str, Any]:
    from viewgate.bench.tab_clients import hold_tabs

    return hold_tabs(*args)


def _churn(*args: Any) -> dict[str, Any]:
    from viewgate.bench.tab_clients import churn_tabs

    return churn_tabs(*args)


def run(ctx: BenchContext) -> GroupResult:
    from engine.runner import start_all
    from viewgate.bench.engine import catalog_on_topics, wait_started
    from viewgate.bench.subscriptions import seed_customers

    settings = ctx.isolated("browsers")
    catalog = catalog_on_topics(demo.CATALOG, TOPIC_PREFIX)
    spark = ctx.spark()
    ctx.say(f"starting the engine on the demo views ({', '.join(catalog.views)})")
    seed_customers(settings, catalog)
    queries = start_all(spark, settings, catalog)
    try:
        wait_started(queries, 300)
        wait_until(lambda: _customers(settings) > 1, timeout_s=120,
                   what="the seeded customers in Redis")
        workers = ctx.sizes.browser_workers
        figures = measure(ctx, settings, catalog, workers)
    finally:
        for query in queries:
            query.stop()
    if workers != 1:  # one against two: the figures of N workers sit beside one's
        figures = {f"{k}_w{workers}": v for k, v in figures.items()}
    figures["ws_python"] = sys.version.split()[0]
    return GroupResult(figures)


def _customers(settings: Settings) -> int:
    from viewgate.bench.gateway import customer_rows

    return len(customer_rows(settings))


GROUP = Group(
    name="browsers",
    description="10,000 browser tabs on one gateway process: fan-out, memory, idle, churn",
    figures=FIGURES,
    run=run,
    by_default=False,  # about 5 minutes of its own: `--only browsers`
)
