"""How long the engine takes to commit again after a SIGKILL (`engine_restart_to_commit_s`).

`viewgate engine` runs the demo catalog in a process group of its own while a producer
writes demo traffic; it is killed with SIGKILL (driver and JVM together, as a crashed
machine or an OOM kill leaves it) right after a commit of the deepest view, started again
at once, and timed from the kill until that view's version in Redis grows: JVM start,
Spark session, catalog analysis, tables checked, the replay of the batch in flight and the
first new batch. Repeated `engine_restarts` times (Sizes); the median and the worst are
reported.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from viewgate.bench.group import BenchContext, BenchError
from viewgate.bench.workers import Worker, produce_paced

VIEW = "CustomerStats"  # the demo's deepest view over views
_RATE = 200.0  # demo events per second while the engine is killed and restarted
_TIMEOUT_S = 180.0


def _version(redis_url: str) -> int:

    from schema.storage import ViewMeta, meta_key

    client = connect_redis(redis_url)
    try:
        return ViewMeta.from_fields(client.hgetall(meta_key(VIEW))).version
    finally:
        client.close()


def _wait_version_above(redis_url: str, version: int, engine: subprocess.Popen,
                        log: Path) -> float:
    deadline = time.monotonic() + _TIMEOUT_S
    while _version(redis_url) <= version:
        if engine.poll() is not None:
            raise BenchError(f"the engine exited ({engine.returncode}): "
                             f"{log.read_text()[-1500:]}")
        if time.monotonic() > deadline:
            raise BenchError(f"{VIEW} did not commit within {_TIMEOUT_S:.0f} s of a start")
        time.sleep(0.02)
    return time.monotonic()


def _start(settings: Settings, log: Path) -> subprocess.Popen:
    env = {**os.environ,
           "VIEWGATE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "VIEWGATE_REDIS_URL": settings.redis_url,
           "VIEWGATE_DATA_DIR": str(settings.data_dir),
           "VIEWGATE_ENGINE_METRICS_PORT": "0"}
    with log.open("a") as out:
        return subprocess.Popen([sys.executable, "-m", "viewgate", "engine"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _kill(engine: subprocess.Popen) -> None:
    os.killpg(engine.pid, signal.SIGKILL)
    engine.wait(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the JVM goes with its group, a moment later
        try:
            os.killpg(engine.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise BenchError("the engine's process group outlived its SIGKILL by a minute")


def measure_restart(ctx: BenchContext) -> dict[str, Any]:
    settings = ctx.isolated("restart")
    log = ctx.workdir / "restart-engine.log"
    restarts = ctx.sizes.engine_restarts
    producer = Worker("producer", produce_paced, settings.kafka_bootstrap, {}, _RATE,
                      _TIMEOUT_S * (restarts + 2), 7)
    seconds: list[float] = []
    engine = _start(settings, log)
    try:
        _wait_version_above(settings.redis_url, -1, engine, log)
        for run in range(restarts):
            version = _version(settings.redis_url)
            _wait_version_above(settings.redis_url, version, engine, log)  # just committed
            killed_at = time.monotonic()
            _kill(engine)
            version = _version(settings.redis_url)
            engine = _start(settings, log)
            seconds.append(_wait_version_above(settings.redis_url, version, engine, log)
                           - killed_at)
            ctx.say(f"restart {run + 1}/{restarts}: {VIEW} committed again "
                    f"{seconds[-1]:.1f} s after the SIGKILL")
    finally:
        if engine.poll() is None:
            _kill(engine)
        producer.stop()
    return {"engine_restart_to_commit_s": round(statistics.median(seconds), 1),
            "engine_restart_to_commit_max_s": round(max(seconds), 1)}
