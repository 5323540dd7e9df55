"""Real services for the test session: one Kafka broker, one Redis, one SparkSession.

Each starts once per session on a free port in a temporary folder and is stopped at
the end, also when tests fail or the run is interrupted (pytest tears fixtures down
on Ctrl-C; every child also gets SIGTERM if this process dies, see
viewgate.stack.process).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from schema.settings import Settings
from viewgate.stack.kafka import KafkaBroker
from viewgate.stack.process import free_port
from viewgate.stack.redis_server import RedisServer


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    # Tests send no tokens unless they test authentication: anonymous is the admin role.
    return Settings(auth_anonymous_role="admin")


@pytest.fixture(scope="session")
def kafka_broker(
    tmp_path_factory: pytest.TempPathFactory, base_settings: Settings
) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(
        tmp_path_factory.mktemp("kafka"), free_port(), base_settings.jar_dir / "kafka"
    )
    broker.start(timeout_s=base_settings.startup_timeout_s)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def settings(
    tmp_path_factory: pytest.TempPathFactory,
    base_settings: Settings,
    kafka_broker: KafkaBroker,
    redis_server: RedisServer,
) -> Settings:
    """Settings pointing at the session's services and a temporary data folder."""
    data_dir: Path = tmp_path_factory.mktemp("data")
    return base_settings.model_copy(
        update={
            "kafka_bootstrap": kafka_broker.bootstrap,
            "redis_url": redis_server.url,
            "data_dir": data_dir,
        }
    )


@pytest.fixture(scope="session")
def spark(settings: Settings):
    from engine.spark import build_spark

    # Spark's JVM would otherwise inherit a huge default heap on a 24 GiB machine.
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 2g pyspark-shell")
    session = build_spark(settings, app_name="viewgate-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A name unique to this test, for topics, tables and keys."""
    return request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:60]
