"""`viewgate engine`: run every view until SIGTERM or Ctrl-C."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import select
import signal
import threading
import time
from pathlib import Path

from prometheus_client import start_http_server

from engine.spark import build_spark
from schema.catalog import Catalog
from schema.logs import configure_logging
from schema.settings import Settings

log = logging.getLogger("viewgate.engine")


# The engine's own modules (the graph and what it brings: pandas, sqlglot, delta-rs, about
# 0.4 s of imports on 2 cores), loaded while Spark's JVM starts, which takes seconds and
# leaves this process waiting: a restart commits sooner.
_ENGINE_MODULES = ("engine.runner", "engine.commit", "engine.maintenance")


def run_engine(settings: Settings, catalog: Catalog, say=print) -> None:
    configure_logging(settings)
    loading = threading.Thread(target=_import, args=_ENGINE_MODULES, name="viewgate-imports",
                               daemon=True)
    loading.start()
    stop = SignalStop()
    received: list[signal.Signals] = []

    def on_signal(number: int, _frame: object) -> None:
        received.append(signal.Signals(number))
        if len(received) == 1:
            _stopping(received[0])
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    if settings.engine_metrics_port:
        try:
            start_http_server(settings.engine_metrics_port, addr=settings.engine_metrics_host)
            say(f"engine: metrics at http://{settings.engine_metrics_host}:"
                f"{settings.engine_metrics_port}/metrics")
        except OSError as error:  # the views matter more than their metrics
            say(f"engine: no metrics, port {settings.engine_metrics_port}: {error}")
    asked = time.monotonic()
    spark = build_spark(settings)
    log.info("Spark session in %.1f s (the process started %.1f s before)",
             time.monotonic() - asked, asked - _process_started())
    loading.join()
    from engine.runner import Engine

    engine = Engine(spark, settings, catalog)
    try:
        queries = engine.start()
        say(f"engine: {len(queries)} queries running: {', '.join(q.name for q in queries)}")
        engine.run_until_stopped(stop)
    finally:
        _stop_spark(spark)


def _import(*modules: str) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - imported again where used, which raises it
            return


def _process_started() -> float:
    """When this process started, on time.monotonic()'s clock (Linux: both count from
    boot), so a restart's log can say what the interpreter's start and imports took."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()


class SignalStop(threading.Event):
    """The engine's stop flag, set by its signal handler, whose `wait` wakes as soon as a
    signal arrives. Python runs signal handlers on the main thread only, when it next runs
    Python code; a signal the kernel hands to another thread (a batch's, when a failpoint
    or a container runtime signals the group mid-commit) would wait out the main thread's
    poll, and the stop line would name what was in flight a second later. The wakeup fd is
    written by whichever thread takes the signal, and wakes the main thread at once."""

    def __init__(self) -> None:
        super().__init__()
        self._wakeup, write = os.pipe()
        os.set_blocking(self._wakeup, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set():
            select.select([self._wakeup], [], [], timeout)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wakeup, 512)
        return self.is_set()  # the handler ran when the main thread woke


def _stopping(received: signal.Signals) -> None:
    """One line that says why the engine stops and what was in flight when it was asked to
    (Spark's JVM ignores SIGTERM, see engine.spark: the queries are stopped from here)."""
    cause = received.name
    from engine.commit import IN_FLIGHT
    from engine.maintenance import running_maintenance

    flight = ", ".join(f"{view} batch {batch}" for view, batch in sorted(IN_FLIGHT.items()))
    maintaining = ", ".join(running_maintenance())
    log.info("engine stopping on %s; %s%s", cause,
             f"commits in flight: {flight} (replayed from the checkpoint at the next start)"
             if flight else "no commit in flight",
             f"; Delta maintenance running for {maintaining} (it ends before the engine)"
             if maintaining else "")


def _stop_spark(spark) -> None:
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - the JVM is gone already (killed on its own)
        log.info("Spark's JVM had stopped already")
