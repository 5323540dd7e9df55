"""The service commands and their failure modes, against real processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from viewgate.stack import jars
from viewgate.stack.errors import StackError
from viewgate.stack.install import ensure_java
from viewgate.stack.kafka import KafkaBroker, broker_healthy
from viewgate.stack.process import free_port, pid_alive, wait_until
from viewgate.stack.redis_server import RedisServer, redis_healthy

pytestmark = pytest.mark.integration


def viewgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "viewgate", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("service", ["kafka", "redis"])
def test_start_status_stop_commands(service, tmp_path):
    port = free_port()
    started = viewgate(service, "start", "--port", str(port), "--data-dir", str(tmp_path))
    assert started.returncode == 0, started.stdout + started.stderr
    pid = int((tmp_path / f"{service}.pid").read_text())
    try:
        assert pid_alive(pid)
        status = viewgate(service, "status", "--port", str(port))
        assert status.returncode == 0 and "healthy" in status.stdout
        assert (tmp_path / f"{service}.log").exists()
    finally:
        stopped = viewgate(service, "stop", "--data-dir", str(tmp_path))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not pid_alive(pid)
    after = viewgate(service, "status", "--port", str(port))
    assert after.returncode == 1 and "not reachable" in after.stdout


def test_taken_port_fails_fast_with_the_setting_to_change(tmp_path, base_settings):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StackError, match="VIEWGATE_LOCAL_KAFKA_PORT"):
            KafkaBroker(tmp_path / "k", port, base_settings.jar_dir / "kafka").start()
        with pytest.raises(StackError, match="VIEWGATE_LOCAL_REDIS_PORT"):
            RedisServer(tmp_path / "r", port).start()
        assert time.monotonic() - started < 10


def test_broker_that_dies_fails_fast_with_its_log(tmp_path, base_settings):
    broker = KafkaBroker(tmp_path, free_port(), base_settings.jar_dir / "kafka", heap="not-a-size")
    with pytest.raises(StackError) as error:
        broker.start(timeout_s=60)
    assert "exited before it became ready" in str(error.value)
    assert "Last lines of" in str(error.value)
    assert not broker_healthy(broker.bootstrap)


def test_missing_broker_jars_say_to_run_setup(tmp_path):
    with pytest.raises(StackError, match="viewgate setup"):
        KafkaBroker(tmp_path, free_port(), tmp_path / "no-jars").start()


def test_missing_java_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="Java was not found"):
        ensure_java()


def test_unreachable_maven_repository_fails_fast(tmp_path):
    closed_port = free_port()
    started = time.monotonic()
    with pytest.raises(StackError, match="VIEWGATE_MAVEN_REPOSITORY") as error:
        jars.resolve(
            tmp_path / "jars",
            "spark",
            maven_repository=f"http://127.0.0.1:{closed_port}/maven2",
            local_repository=tmp_path / "m2",
        )
    assert "Maven said" in str(error.value)
    assert time.monotonic() - started < 120
    assert not (tmp_path / "jars" / "spark").exists()


def test_redis_health_is_false_without_a_server():
    assert redis_healthy(f"redis://127.0.0.1:{free_port()}/0") is False


def test_setup_reuses_the_cache(base_settings):
    # The session's services already ran from these jars; a second resolve is a no-op.
    for bundle in jars.BUNDLES:
        assert jars.is_resolved(base_settings.jar_dir, bundle)
        assert jars.resolve(base_settings.jar_dir, bundle) == base_settings.jar_dir / bundle
    spark_jars = {p.name for p in (base_settings.jar_dir / "spark").glob("*.jar")}
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in spark_jars)
    assert any(n.startswith("delta-spark_2.13-") for n in spark_jars)
    assert any(n.startswith("delta-storage-") for n in spark_jars)
    # pyspark ships Scala and Jackson; a second copy must not be handed to Spark.
    assert not any(n.startswith(("scala-library-", "jackson-core-")) for n in spark_jars)


def test_gateway_system_query_reads_the_real_services(settings):
    from starlette.testclient import TestClient

    from gateway.app import create_app

    query = "{ system { kafka { reachable brokers } redis { reachable version } } }"
    with TestClient(create_app(settings)) as client:
        response = client.post("/graphql", json={"query": query})
    assert response.status_code == 200
    system = response.json()["data"]["system"]
    assert system["kafka"] == {"reachable": True, "brokers": 1}
    assert system["redis"]["reachable"] is True and system["redis"]["version"]


def test_pid_files_hold_the_started_pid(tmp_path):
    server = RedisServer(Path(tmp_path), free_port()).start()
    try:
        assert int(server.pid_path.read_text()) == server.process.pid
    finally:
        server.stop()
    assert not server.pid_path.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_produce_stopped_by_a_signal_says_what_it_delivered(settings, sig):
    env = {**os.environ, "VIEWGATE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    before = _offsets(settings.kafka_bootstrap, "orders")
    process = subprocess.Popen([sys.executable, "-m", "viewgate", "produce", "--rate", "200"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # Running: it has connected and is producing (its first events are delivered).
        wait_until(lambda: _offsets(settings.kafka_bootstrap, "orders") > before, timeout_s=60,
                   what="produce delivers events")
        process.send_signal(sig)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + sig.value, err
    match = re.search(rf"produced (\d+) events \(stopped by {sig.name}\)", out)
    assert match, out + err
    assert int(match.group(1)) > 0
    assert "Traceback" not in err


def _offsets(bootstrap: str, topic: str) -> int:
    from engine.rebuild import log_range

    try:
        return sum(high for _, high in log_range(bootstrap, topic, timeout_s=5).values())
    except Exception:  # noqa: BLE001 - the topic does not exist yet
        return 0
