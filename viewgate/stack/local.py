"""The local development stack that `viewgate up` runs in the foreground.

Every process is a child we started and track by pid; on Ctrl-C, SIGTERM or the
death of any one of them, all are stopped in reverse order of start.
"""

from __future__ import annotations

import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from schema.settings import Settings
from viewgate.stack.errors import StackError
from viewgate.stack.kafka import KafkaBroker
from viewgate.stack.process import ManagedProcess, require_free_port, wait_until
from viewgate.stack.redis_server import RedisServer


class _Stop(Exception):
    pass


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def run_local_stack(settings: Settings, say: Callable[[str], None] = print) -> int:
    data = settings.data_dir.resolve()
    kafka = KafkaBroker(data / "kafka", settings.local_kafka_port, settings.jar_dir / "kafka")
    redis = RedisServer(data / "redis", settings.local_redis_port)
    require_free_port(settings.gateway_port, "Gateway", "VIEWGATE_GATEWAY_PORT")
    env = {
        "VIEWGATE_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "VIEWGATE_REDIS_URL": redis.url,
        "VIEWGATE_DATA_DIR": str(data),
        # The demo is open: requests without a token get the admin role unless set otherwise.
        "VIEWGATE_AUTH_ANONYMOUS_ROLE": settings.auth_anonymous_role or settings.auth_admin_role,
    }
    stoppers: list[Callable[[], None]] = []
    children: list[ManagedProcess] = []
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        kafka.start(timeout_s=settings.startup_timeout_s)
        stoppers.append(kafka.stop)
        say(f"kafka  : {kafka.bootstrap} (log {kafka.log_path})")
        redis.start(timeout_s=settings.startup_timeout_s)
        stoppers.append(redis.stop)
        say(f"redis  : {redis.url} (log {redis.log_path})")

        for name, args in (
            ("engine", ["engine"]),
            ("producer", ["produce", "--rate", str(settings.demo_rate)]),
        ):
            child = ManagedProcess(
                name,
                [sys.executable, "-m", "viewgate", *args],
                settings.log_dir / f"{name}.log",
                env=env,
            ).start()
            children.append(child)
            stoppers.append(child.stop)
            say(f"{name:7}: pid {child.pid} (log {child.log_path})")

        gateway = ManagedProcess(
            "gateway",
            [sys.executable, "-m", "viewgate", "gateway"],
            settings.log_dir / "gateway.log",
            env=env,
        ).start()
        children.append(gateway)
        stoppers.append(gateway.stop)
        url = f"http://{settings.gateway_host}:{settings.gateway_port}"
        wait_until(
            lambda: _http_ok(f"{url}/healthz"),
            timeout_s=settings.startup_timeout_s,
            what="gateway",
            alive=gateway.alive,
            log=gateway.log_path,
        )
        say(f"graphql: {url}/graphql  (Ctrl-C stops everything)")
        while True:
            for child in children:
                if not child.alive():
                    raise StackError(
                        f"{child.name} exited with code {child.popen.returncode}; "
                        f"see {child.log_path}"
                    )
            time.sleep(0.5)
    except _Stop as stop:
        say(f"{stop}: stopping")
        return 0
    finally:
        for stopper in reversed(stoppers):
            stopper()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        say("stopped")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def pid_file_process(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
