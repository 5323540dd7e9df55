"""The stack that `viewgate up` runs in the foreground: the local development stack (one
broker, one Redis, Spark in the engine's process), or with `--cluster` the cluster profile
(three Kafka brokers, a Redis Cluster of three masters with a replica each, a Spark
standalone master with two workers, S3Proxy holding the Delta tables and checkpoints, and
two gateways).

Every process is a child we started and track by pid; on Ctrl-C, SIGTERM or the
death of any one of them, all are stopped in reverse order of start.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schema.settings import Settings
from viewgate.stack.errors import StackError
from viewgate.stack.kafka import KafkaBroker, KafkaCluster
from viewgate.stack.process import ManagedProcess, free_port, require_free_port, wait_until
from viewgate.stack.redis_cluster import RedisClusterServers
from viewgate.stack.redis_server import RedisServer


@dataclass
class Service:
    """One of the stack's services: what it is called, how it starts and stops, and what
    it tells the user once it runs."""

    name: str
    server: Any  # has start() and stop()
    address: Callable[[], str]


def local_services(settings: Settings, data: Path) -> tuple[list[Service], dict[str, str]]:
    kafka = KafkaBroker(data / "kafka", settings.local_kafka_port, settings.jar_dir / "kafka")
    redis = RedisServer(data / "redis", settings.local_redis_port)
    services = [Service("kafka", kafka, lambda: f"{kafka.bootstrap} (log {kafka.log_path})"),
                Service("redis", redis, lambda: f"{redis.url} (log {redis.log_path})")]
    return services, {"VIEWGATE_KAFKA_BOOTSTRAP": kafka.bootstrap,
                      "VIEWGATE_REDIS_URL": redis.url}


# The engine's settings on the cluster profile: every batch read, computed and written to
# Delta by Spark's tasks on the workers (engine.task_read, engine.task_tables,
# engine.task_delta), the driver applying and committing. The local profile keeps the
# defaults: on one machine's shared cores the driver's own path is the faster.
CLUSTER_ENGINE_PATH = {
    "VIEWGATE_ENGINE_TASK_READ": "true",
    "VIEWGATE_ENGINE_TASK_TABLES": "true",
    "VIEWGATE_ENGINE_TASK_DELTA": "true",
    "VIEWGATE_ENGINE_TASK_READ_MIN_RECORDS": "0",
    "VIEWGATE_ENGINE_DRIVER_FETCH_MAX_RECORDS": "0",
}


def cluster_services(settings: Settings, data: Path) -> tuple[list[Service], dict[str, str]]:
    from viewgate.stack.s3proxy import S3ProxyServer
    from viewgate.stack.spark_standalone import SparkStandalone

    kafka = KafkaCluster(data / "kafka-cluster", settings.jar_dir / "kafka")
    redis = RedisClusterServers(data / "redis-cluster")
    spark = SparkStandalone(data / "spark")
    s3 = S3ProxyServer(data / "s3", settings.jar_dir / "s3proxy")
    services = [
        Service("kafka", kafka, lambda: f"{kafka.bootstrap} (3 brokers, logs in {kafka.data_dir})"),
        Service("redis", redis, lambda: f"{redis.url} (3 masters + 3 replicas)"),
        Service("spark", spark, lambda: f"{spark.master_url} (2 workers, "
                                        f"http://127.0.0.1:{spark.ui_port})"),
        Service("s3", s3, lambda: f"{s3.endpoint} (S3Proxy: Delta tables and checkpoints in "
                                  "s3a://viewgate/)"),
    ]
    return services, {
        **s3.env(),
        "VIEWGATE_DELTA_ROOT": "s3a://viewgate/delta",
        "VIEWGATE_CHECKPOINT_ROOT": "s3a://viewgate/checkpoints",
        "VIEWGATE_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "VIEWGATE_KAFKA_REPLICATION_FACTOR": "3",
        "VIEWGATE_KAFKA_MIN_INSYNC_REPLICAS": "2",
        "VIEWGATE_REDIS_URL": redis.url,
        "VIEWGATE_SPARK_MASTER": spark.master_url,
        "VIEWGATE_SPARK_CONF": json.dumps({
            **settings.spark_conf, "spark.executor.memory": "768m", "spark.cores.max": "2"}),
        # The executors do the work, as on a real cluster: every batch read, computed and
        # written to Delta by Spark's tasks on the workers (test_cluster_profile runs this
        # path and the driver's).
        **CLUSTER_ENGINE_PATH,
    }


class _Stop(Exception):
    pass


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def run_local_stack(settings: Settings, say: Callable[[str], None] = print,
                    cluster: bool = False) -> int:
    data = settings.data_dir.resolve()
    require_free_port(settings.gateway_port, "Gateway", "VIEWGATE_GATEWAY_PORT")
    build = cluster_services if cluster else local_services
    services, env = build(settings, data)
    env |= {
        "VIEWGATE_DATA_DIR": str(data),
        # The demo is open: requests without a token get the admin role unless set otherwise.
        "VIEWGATE_AUTH_ANONYMOUS_ROLE": settings.auth_anonymous_role or settings.auth_admin_role,
    }
    # The cluster profile runs two gateways: nothing but Redis and Kafka is shared.
    gateway_ports = [settings.gateway_port] + ([free_port()] if cluster else [])
    stoppers: list[Callable[[], None]] = []
    children: list[ManagedProcess] = []
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for service in services:
            stoppers.append(service.server.stop)
            service.server.start(timeout_s=settings.startup_timeout_s)
            say(f"{service.name:7}: {service.address()}")

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

        for i, port in enumerate(gateway_ports):
            name = "gateway" if i == 0 else f"gateway{i + 1}"
            gateway = ManagedProcess(
                name,
                [sys.executable, "-m", "viewgate", "gateway"],
                settings.log_dir / f"{name}.log",
                env={**env, "VIEWGATE_GATEWAY_PORT": str(port)},
            ).start()
            children.append(gateway)
            stoppers.append(gateway.stop)
            url = f"http://{settings.gateway_host}:{port}"
            wait_until(
                lambda url=url: _http_ok(f"{url}/healthz"),
                timeout_s=settings.startup_timeout_s,
                what=name,
                alive=gateway.alive,
                log=gateway.log_path,
            )
            say(f"graphql: {url}/graphql")
        say("Ctrl-C stops everything")
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
