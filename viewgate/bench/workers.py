"""Load generators and watchers that run in processes of their own, so that they never
compete with the engine's Python for its interpreter lock: a fair load generator.

Each worker is a plain function run in a fresh (spawned) interpreter by `Worker`; its
return value comes back through a pipe. Workers get SIGTERM if the bench process dies.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schema.redis_client import connect as connect_redis

_SPAWN = multiprocessing.get_context("spawn")


class WorkerError(RuntimeError):
    pass


def _main(target: Callable[..., Any], conn: Any, args: tuple[Any, ...]) -> None:
    from viewgate.stack.process import _die_with_parent

    _die_with_parent()
    try:
        conn.send(("ok", target(*args)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class Worker:
    """`target(*args)` in a spawned process; `result()` waits for its return value.
    A worker that starts workers of its own must not be a daemon (multiprocessing's rule);
    it still dies with its parent (see _main)."""

    def __init__(
        self, name: str, target: Callable[..., Any], *args: Any, daemon: bool = True
    ) -> None:
        self.name = name
        self._conn, child_conn = _SPAWN.Pipe(duplex=False)
        self.process = _SPAWN.Process(
            target=_main, args=(target, child_conn, args), name=name, daemon=daemon
        )
        self.process.start()
        child_conn.close()

    def done(self, timeout_s: float) -> bool:
        """Whether its result (or failure) is in, waiting up to `timeout_s` for it."""
        return self._conn.poll(timeout_s)

    def result(self, timeout_s: float) -> Any:
        if not self._conn.poll(timeout_s):
            alive = self.process.is_alive()
            self.stop()
            raise WorkerError(
                f"{self.name}: no result within {timeout_s:.0f} s"
                + ("" if alive else f" (it exited with code {self.process.exitcode})")
            )
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise WorkerError(f"{self.name} died (exit code {self.process.exitcode})") from None
        self.process.join(10)
        if status != "ok":
            raise WorkerError(f"{self.name} failed:\n{value}")
        return value

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(10)
        self._conn.close()


def new_event() -> Any:
    return _SPAWN.Event()


# --- Workers (module-level functions, so a spawned interpreter can import them) ---------


def preload_orders(
    bootstrap: str, topic: str, seed: int, events: int, chunks: Sequence[int], chunk_events: int
) -> dict[str, int]:
    """Write `events` of the demo shop's order events (new orders, status updates,
    tombstones) into `topic` as fast as Kafka takes them. Each of `chunks` is a fresh demo
    generator of at most `chunk_events` events with order ids of its own, so memory and the
    cost per event stay flat however many events are asked for.
    Returns {"events": written, "placed": how many of them are orders with status placed,
    "current": orders whose last event leaves them neither deleted nor cancelled}."""
    from confluent_kafka import Producer

    from viewgate.demo_events import ORDERS_TOPIC, generate, send

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
        }
    )
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    written = placed = 0
    current: dict[str, bool] = {}  # order id -> counted by CustomerStats
    for chunk in chunks:
        stream = generate(seed + chunk, first_order=chunk * chunk_events + 1)
        for topic_name, key, value in itertools.islice(stream, chunk_events):
            if written == events:
                break
            if topic_name != ORDERS_TOPIC:
                continue
            send(producer, topic, key, value, on_delivery)
            producer.poll(0)
            written += 1
            placed += value is not None and b'"status":"placed"' in value
            current[key] = value is not None and b'"status":"cancelled"' not in value
    if producer.flush(120) or failures:
        raise RuntimeError(f"preload into {topic}: undelivered events; errors {failures[:3]}")
    if written != events:
        raise RuntimeError(
            f"preload into {topic}: {written} events for {events} asked; more chunks"
        )
    return {"events": written, "placed": placed, "current": sum(current.values())}


def produce_paced(
    bootstrap: str, topics: Mapping[str, str], rate: float, duration_s: float, seed: int
) -> list[tuple[str, int, int, int, bool]]:
    """Demo traffic at `rate` events/s for `duration_s` (viewgate.demo_events.produce).
    Returns every delivered event as (topic, partition, offset, produced at ms, placed):
    the produced-at time is the Kafka record's create time, set when produce() was called."""
    from viewgate.demo_events import produce

    delivered: list[tuple[str, int, int, int, bool]] = []

    def observe(msg: Any) -> None:
        value = msg.value()
        placed = value is not None and b'"status":"placed"' in value
        delivered.append((msg.topic(), msg.partition(), msg.offset(), msg.timestamp()[1], placed))

    produce(bootstrap, rate=rate, seed=seed, duration=duration_s, topics=topics, observe=observe)
    return delivered


# Fields of a view's meta hash (schema.storage): the Redis apply sets `version` and the
# batch's Kafka end offsets with the rows, atomically.
_WATCHED = ("version", "offsets")


def watch_meta(
    redis_url: str, views: Sequence[str], stop: Any, interval_s: float
) -> dict[str, dict[str, Any]]:
    """Poll each view's meta hash every `interval_s` until `stop` is set. Returns, per
    view, when each new version was first seen in Redis ("seen": [(version, ms)]) and
    the Kafka end offsets of each batch ("offsets": {batch: {topic: {partition: end}}})."""
    import json

    from schema.storage import meta_key

    client = connect_redis(redis_url)
    out: dict[str, dict[str, Any]] = {v: {"seen": [], "offsets": {}} for v in views}
    last: dict[str, Any] = {v: None for v in views}
    while not stop.is_set():
        pipe = client.pipeline(transaction=False)
        for view in views:
            pipe.hmget(meta_key(view), _WATCHED)
        answers = pipe.execute()
        now_ms = time.time() * 1000
        for view, (version, offsets) in zip(views, answers, strict=True):
            if version is not None and version != last[view]:
                out[view]["seen"].append((int(version), now_ms))
                if offsets:
                    out[view]["offsets"][int(version)] = json.loads(offsets)
            last[view] = version
        time.sleep(interval_s)
    client.close()
    return out
