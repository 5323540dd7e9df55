"""The settings object and the deployment files agree on every variable name."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from schema.settings import Settings
from viewgate.stack.local import CLUSTER_ENGINE_PATH

ROOT = Path(__file__).resolve().parents[2]
KNOWN = {f"VIEWGATE_{name.upper()}" for name in Settings.model_fields}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_sets_only_variables_the_settings_know():
    compose = _compose()
    assert {"kafka", "redis", "engine", "gateway"} <= set(compose["services"])
    unknown = []
    for name, service in compose["services"].items():
        env = service.get("environment", {})
        names = env.keys() if isinstance(env, dict) else [e.split("=", 1)[0] for e in env]
        for var in names:
            ours = name.startswith(("engine", "gateway")) or var.startswith("VIEWGATE_")
            if ours and var not in KNOWN:
                unknown.append(f"{name}: {var}")
    assert unknown == [], f"compose.yaml sets variables Settings does not read: {unknown}"


def test_compose_values_parse_as_settings(monkeypatch):
    for name in ("engine", "gateway"):
        for var, value in _compose()["services"][name]["environment"].items():
            monkeypatch.setenv(var, str(value))
        settings = Settings()
        assert settings.kafka_bootstrap == "kafka:9092"
        assert settings.redis_url == "redis://redis:6379/0"
    assert Settings().spark_conf == {"spark.driver.memory": "2g"}


def test_the_cluster_profile_services_parse_as_cluster_settings(monkeypatch):
    services = _compose()["services"]
    for name in ("engine-cluster", "gateway-1", "gateway-2"):
        for var in [v for v in Settings.model_fields]:
            monkeypatch.delenv(f"VIEWGATE_{var.upper()}", raising=False)
        for var, value in services[name]["environment"].items():
            monkeypatch.setenv(var, str(value))
        settings = Settings()
        assert settings.kafka_bootstrap.count(",") == 2
        assert settings.redis_url.startswith("redis+cluster://")
        assert (settings.kafka_replication_factor, settings.kafka_min_insync_replicas) == (3, 2)
    assert services["engine-cluster"]["environment"]["VIEWGATE_SPARK_MASTER"].startswith(
        "spark://")
    # Compose's cluster engine runs the path `viewgate up --cluster` runs (and the tests).
    engine = services["engine-cluster"]["environment"]
    assert {var: engine.get(var) for var in CLUSTER_ENGINE_PATH} == CLUSTER_ENGINE_PATH


@pytest.mark.parametrize("profile", [[], ["--profile", "cluster"]], ids=["default", "cluster"])
def test_compose_file_is_valid_for_a_real_compose_implementation(profile):
    """Debian's docker-compose (`viewgate setup` installs it) validates the file against the
    Compose Specification without a Docker engine."""
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose is missing: run `viewgate setup`"
    done = subprocess.run([compose, "-f", str(ROOT / "compose.yaml"), *profile, "config",
                           "--services"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    services = set(done.stdout.split())
    assert {"kafka", "redis", "engine", "gateway"} <= services
    cluster = {"kafka-1", "kafka-2", "kafka-3", "redis-cluster-init", "s3", "s3-bucket",
               "spark-master",
               "spark-worker-1", "spark-worker-2", "engine-cluster", "gateway-1", "gateway-2"}
    assert cluster <= services  # Compose 1.29 lists every service, in a profile or not


def test_every_setting_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    missing = sorted(var for var in KNOWN if f"`{var}`" not in readme)
    assert missing == [], f"README.md's configuration table lacks {missing}"


def test_readme_quick_start_has_exactly_two_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```(?:\w+)?\n(.*?)```", section, re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1].strip() in ci


def test_environment_overrides_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("VIEWGATE_KAFKA_BOOTSTRAP", "b1:9092,b2:9092")
    monkeypatch.setenv("VIEWGATE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("VIEWGATE_SPARK_JARS", "/a.jar, /b.jar")
    settings = Settings()
    assert settings.kafka_bootstrap == "b1:9092,b2:9092"
    assert settings.delta_location == str(tmp_path.resolve() / "delta")
    assert settings.spark_jar_paths() == ["/a.jar", "/b.jar"]
