"""`viewgate engine` as a subprocess for the tests that kill or starve it, and the events
they feed it."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from deltalake.exceptions import TableNotFoundError
from prometheus_client.parser import text_string_to_metric_families
from shop_views import (
    Record,
    delta_frame,
    expected_customer_stats,
    expected_customers,
    produce,
    shop_events,
    ts,
)

from engine.rebuild import log_range
from schema.storage import CHANGEFEED_PREFIX, ChangeEvent, changefeed_topic
from viewgate.stack.process import free_port, wait_until

HERE = Path(__file__).resolve().parent


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


class EngineProcess:
    """`viewgate engine` in a process group of its own, so that one SIGKILL takes the
    driver and its JVM together, and nothing outlives the test."""

    def __init__(self, settings, log_dir: Path, prefix: str, **env: str) -> None:
        self.settings = settings
        self.env = {
            **os.environ,
            **env,
            "VIEWGATE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "VIEWGATE_REDIS_URL": settings.redis_url,
            "VIEWGATE_DATA_DIR": str(settings.data_dir),
            "VIEWGATE_CATALOG": "shop_views:PREFIXED_CATALOG",
            "SHOP_TOPIC_PREFIX": prefix,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "PYSPARK_SUBMIT_ARGS": "--driver-memory 1g pyspark-shell",
            "VIEWGATE_ENGINE_METRICS_PORT": str(free_port()),
        }
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None
        self.runs = 0

    def start(self, failpoint: str | None = None, **env: str) -> None:
        """`env`: settings of this run only, on top of the process's."""
        env = {**self.env, **env}
        env.pop("VIEWGATE_FAILPOINT", None)
        if failpoint:
            env["VIEWGATE_FAILPOINT"] = failpoint
        self.runs += 1
        log = (self.log_dir / f"engine-{self.runs}.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "viewgate", "engine"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def log_tail(self) -> str:
        return (self.log_dir / f"engine-{self.runs}.log").read_text()[-3000:]

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the running engine's /metrics, the one with these `labels`; None
        when it is not there (yet), or the engine does not answer."""
        url = f"http://127.0.0.1:{self.env['VIEWGATE_ENGINE_METRICS_PORT']}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in labels.items()):
                    return sample.value
        return None

    def wait_killed(self, timeout_s: float = 180) -> None:
        """The failpoint fired: the process died of SIGKILL (and its group with it)."""
        assert self.process is not None
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the failpoint never fired:\n{self.log_tail()}") from None
        assert code == -signal.SIGKILL, f"engine exited {code}:\n{self.log_tail()}"
        self._reap()

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._reap()

    def _reap(self) -> None:
        assert self.process is not None
        wait_until(
            lambda: _group_gone(self.process.pid), timeout_s=60, what="the engine's JVM to exit"
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        if self.process is not None and not _group_gone(self.process.pid):
            os.killpg(self.process.pid, signal.SIGKILL)


def in_time_events(prefix: str, count: int) -> tuple[list[Record], list[Record]]:
    """Customers and orders on `prefix`'s topics, without events behind the watermark:
    whether Spark drops those depends on where batches happen to end (the late-event
    count is checked in test_engine)."""
    customers, orders = shop_events(prefix, seed=11, count=count)
    in_time = []
    newest = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    for order in orders:
        if order[2] is not None:
            event_time = ts(json.loads(order[2])["ts"])
            if event_time < newest - datetime.timedelta(seconds=20):
                continue
            newest = max(newest, event_time)
        in_time.append(order)
    return customers, in_time


def delta_rows(settings, view: str) -> int:
    try:
        return len(delta_frame(settings, view))
    except TableNotFoundError:
        return 0


def start_on_customers(engine: EngineProcess, customers: list[Record]) -> None:
    """Customers first, so every order finds its customer; then the engine, until every
    customer is in Delta."""
    settings = engine.settings
    produce(settings.kafka_bootstrap, customers)
    engine.start()
    want = len(expected_customers(customers))
    wait_until(lambda: delta_rows(settings, "Customer") == want, timeout_s=300,
               what="the customers to be in Delta")


def delta_stats_exact(settings, orders: list[Record]) -> bool:
    """CustomerStats in Delta holds exactly one count per placed order."""
    want = expected_customer_stats(orders)
    got = delta_frame(settings, "CustomerStats").set_index("customer_id")
    return set(got.index) == set(want.index) and all(
        got.at[c, "order_count"] == row.order_count for c, row in want.iterrows())


def feed_ends(bootstrap: str, view: str, prefix: str = CHANGEFEED_PREFIX) -> dict[int, int]:
    """Where the view's change feed ends now (partition -> next offset)."""
    topic = changefeed_topic(view, prefix)
    return {p: high for p, (_, high) in log_range(bootstrap, topic).items()}


def feed_changes(bootstrap: str, view: str, since: dict[int, int],
                 prefix: str = CHANGEFEED_PREFIX) -> list[tuple[int, ChangeEvent]]:
    """The view's change events (offset, event) from the offsets `since` to the end."""
    topic = changefeed_topic(view, prefix)
    wanted = {p: high - since.get(p, 0) for p, (_, high) in log_range(bootstrap, topic).items()}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"feed-{view}"})
    consumer.assign([TopicPartition(topic, p, since.get(p, 0)) for p in wanted])
    events: list[tuple[int, ChangeEvent]] = []
    try:
        deadline = time.monotonic() + 60
        while len(events) < sum(wanted.values()) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                events.append((message.offset(), ChangeEvent.from_bytes(message.value())))
    finally:
        consumer.close()
    assert len(events) == sum(wanted.values()), f"read {len(events)} of {view}'s changes"
    return events
