"""The engine stops cleanly when SIGTERM reaches its whole process group (as systemd and
Kubernetes send it), in the middle of a commit: one line says what was in flight, no
traceback, nothing lost; and its Python workers run the project's interpreter."""

from __future__ import annotations

import re
import sys

import pytest
import redis
from engine_process import EngineProcess, delta_rows, in_time_events
from shop_views import expected_customers, isolated, produce, view_mismatches

from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "stop"


def test_sigterm_to_the_process_group_mid_commit_stops_cleanly(settings, tmp_path):
    settings = isolated(settings, tmp_path / "data", redis_db=21)
    client = redis.Redis.from_url(settings.redis_url)
    engine = EngineProcess(settings, tmp_path, PREFIX)
    customers, orders = in_time_events(PREFIX, 3000)
    try:
        # Customers first, so that every order's enrichment sees its customer (the
        # stream-static join reads Customer's Delta table).
        produce(settings.kafka_bootstrap, customers)
        # SIGTERM to the whole group in the middle of an Order commit, past its Redis apply.
        engine.start(failpoint="sigterm_after_redis:Order")
        want = len(expected_customers(customers))
        wait_until(lambda: delta_rows(settings, "Customer") == want, timeout_s=240,
                   what="the customers to be in Delta",
                   alive=lambda: engine.process.poll() is None)
        produce(settings.kafka_bootstrap, orders)
        code = engine.process.wait(300)
        log = (tmp_path / "engine-1.log").read_text()
        # Order's commit is in flight (and others may be: a view's Delta step runs while
        # the views after it commit).
        stop_line = re.search(r"engine stopping on SIGTERM; commits in flight: (.*)", log)
        assert stop_line and "Order batch" in stop_line.group(1), log[-3000:]
        assert "Traceback" not in log and "Exception" not in log, log[-6000:]
        assert code == 0, f"exit {code}: {log[-3000:]}"
        # Stopped mid-commit, nothing is lost: started again, every view becomes exact.
        engine.start()
        wait_until(lambda: not view_mismatches(client, customers, orders), timeout_s=300,
                   what="every view exact after the restart",
                   alive=lambda: engine.process.poll() is None)
    finally:
        engine.stop()
        client.close()


def test_python_workers_run_the_projects_interpreter(spark):
    ran = spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect()
    assert ran == [sys.executable]
