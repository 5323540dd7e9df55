"""`viewgate engine`: run every view until SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import threading

from prometheus_client import start_http_server

from engine.runner import Engine
from engine.spark import build_spark
from schema.catalog import Catalog
from schema.logs import configure_logging
from schema.settings import Settings


def run_engine(settings: Settings, catalog: Catalog, say=print) -> None:
    configure_logging(settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if settings.engine_metrics_port:
        try:
            start_http_server(settings.engine_metrics_port, addr=settings.engine_metrics_host)
            say(f"engine: metrics at http://{settings.engine_metrics_host}:"
                f"{settings.engine_metrics_port}/metrics")
        except OSError as error:  # the views matter more than their metrics
            say(f"engine: no metrics, port {settings.engine_metrics_port}: {error}")
    spark = build_spark(settings)
    try:
        engine = Engine(spark, settings, catalog)
        queries = engine.start()
        say(f"engine: {len(queries)} queries running: {', '.join(q.name for q in queries)}")
        engine.run_until_stopped(stop)
    finally:
        spark.stop()
