"""A single-node Apache Kafka broker in KRaft mode (broker and controller in one JVM).

The broker runs from the jars `viewgate setup` resolved from Maven Central, with its
storage formatted once in `data_dir` and its output in `data_dir/kafka.log`.
"""

from __future__ import annotations

import base64
import logging
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from viewgate.stack.errors import StackError
from viewgate.stack.process import (
    ManagedProcess,
    free_port,
    require_free_port,
    tail,
    wait_until,
)

_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = stdout
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = stdout
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


def _cluster_id() -> str:
    # Kafka's Uuid text form: URL-safe base64 of 16 bytes, unpadded. Like Kafka's
    # Uuid.randomUuid, never one starting with "-": the storage tool would take it for an
    # option and fail (one start in 64).
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def java_executable() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError(
            "Java was not found on PATH. Install a Java 17 runtime "
            "(Debian: `apt-get install openjdk-17-jre-headless`) and try again."
        )
    return java


@dataclass
class KafkaBroker:
    data_dir: Path
    port: int
    jar_dir: Path
    heap: str = "512m"

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.process: ManagedProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "kafka.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "kafka.pid"

    def _classpath(self) -> str:
        if not any(self.jar_dir.glob("kafka_*.jar")):
            raise StackError(
                f"Kafka broker jars are missing in {self.jar_dir}. Run `viewgate setup` "
                "(or `./dev up`), which resolves them from Maven Central."
            )
        return str(self.jar_dir / "*")

    def _write_config(self, controller_port: int) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        config = self.data_dir / "server.properties"
        config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={self.data_dir / 'logs'}",
                    "num.partitions=2",
                    "auto.create.topics.enable=true",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "",
                ]
            )
        )
        return config

    def _java(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        return [
            java_executable(),
            f"-Xmx{heap or self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp",
            self._classpath(),
            main,
            *args,
        ]

    def _format_storage(self, config: Path) -> None:
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        result = subprocess.run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "-t",
                _cluster_id(),
                "-c",
                str(config),
                heap="256m",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise StackError(
                f"Formatting Kafka storage in {self.data_dir} failed:\n"
                f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )

    def start(self, timeout_s: float = 90.0, die_with_parent: bool = True) -> KafkaBroker:
        require_free_port(self.port, "Kafka", "VIEWGATE_LOCAL_KAFKA_PORT")
        config = self._write_config(controller_port=free_port())
        self._format_storage(config)
        self.process = ManagedProcess(
            "kafka",
            self._java("kafka.Kafka", str(config)),
            self.log_path,
            die_with_parent=die_with_parent,
        ).start()
        self.pid_path.write_text(str(self.process.pid))
        try:
            wait_until(
                self.healthy,
                timeout_s=timeout_s,
                what=f"Kafka broker on port {self.port}",
                alive=self.process.alive,
                log=self.log_path,
                interval_s=0.5,
            )
        except StackError:
            self.stop()
            raise
        return self

    def healthy(self) -> bool:
        return broker_healthy(self.bootstrap)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout_s=30)
            self.process = None
        self.pid_path.unlink(missing_ok=True)

    def log_tail(self) -> str:
        return tail(self.log_path)


_quiet = logging.getLogger("viewgate.kafka.probe")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def broker_healthy(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when a broker answers a metadata request."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000}, logger=_quiet)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure means "not healthy yet"
        return False
    return len(metadata.brokers) > 0
