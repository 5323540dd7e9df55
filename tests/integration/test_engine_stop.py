"""The engine stops cleanly when SIGTERM reaches its whole process group (as systemd and
Kubernetes send it), Spark's JVM included: one line says what was in flight, no Py4J
traceback; and its Python workers run the project's interpreter."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import redis
from engine_process import EngineProcess, in_time_events
from shop_views import isolated, produce

from schema.storage import ViewMeta, meta_key
from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "stop"


def test_sigterm_to_the_process_group_stops_cleanly(settings, tmp_path):
    settings = isolated(settings, tmp_path / "data", redis_db=21)
    client = redis.Redis.from_url(settings.redis_url)
    engine = EngineProcess(settings, tmp_path, PREFIX)
    customers, orders = in_time_events(PREFIX, 3000)
    try:
        engine.start()
        produce(settings.kafka_bootstrap, customers + orders[:500])
        wait_until(lambda: ViewMeta.from_fields(client.hgetall(meta_key("Order"))).version >= 0,
                   timeout_s=240, what="the engine's first Order commit",
                   alive=lambda: engine.process.poll() is None)
        produce(settings.kafka_bootstrap, orders[500:])  # batches are running when it stops
        os.killpg(engine.process.pid, signal.SIGTERM)
        code = engine.process.wait(120)
        log = (tmp_path / "engine-1.log").read_text()
    finally:
        engine.stop()
        client.close()
    assert "engine stopping on SIGTERM" in log, log[-3000:]
    assert "Traceback" not in log, log[-6000:]
    assert code in (0, 128 + signal.SIGTERM, -signal.SIGTERM), f"exit {code}: {log[-3000:]}"


def test_python_workers_run_the_projects_interpreter(spark):
    ran = spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect()
    assert ran == [sys.executable]
