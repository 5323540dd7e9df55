"""Apache Kafka in KRaft mode, broker and controller in one JVM per node: one node for
development (KafkaBroker), or three that form one quorum (KafkaCluster, the cluster
profile: topics replicated three times, two in sync to acknowledge a write).

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
from concurrent.futures import ThreadPoolExecutor
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
    # A node of a quorum (KafkaCluster): its id, its controller port, the quorum's voters
    # ("1@host:port,2@…"), its cluster id and the replication of Kafka's internal topics.
    node_id: int = 1
    controller_port: int | None = None
    voters: str | None = None
    cluster_id: str | None = None
    replication: int = 1

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
        in_sync = max(1, self.replication - 1)
        config.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={self.node_id}",
                    "controller.quorum.voters="
                    + (self.voters or f"{self.node_id}@127.0.0.1:{controller_port}"),
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                    f"CONTROLLER://127.0.0.1:{controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={self.data_dir / 'logs'}",
                    "num.partitions=2",
                    "auto.create.topics.enable=true",
                    f"default.replication.factor={self.replication}",
                    f"min.insync.replicas={in_sync}",
                    f"offsets.topic.replication.factor={self.replication}",
                    f"transaction.state.log.replication.factor={self.replication}",
                    f"transaction.state.log.min.isr={in_sync}",
                    f"share.coordinator.state.topic.replication.factor={self.replication}",
                    f"share.coordinator.state.topic.min.isr={in_sync}",
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
                self.cluster_id or _cluster_id(),
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
        self.launch(die_with_parent)
        self.wait_ready(timeout_s)
        return self

    def launch(self, die_with_parent: bool = True) -> None:
        """Start the JVM without waiting: a quorum's nodes must all be starting before any
        of them can elect a controller."""
        require_free_port(self.port, "Kafka", "VIEWGATE_LOCAL_KAFKA_PORT")
        self.controller_port = self.controller_port or free_port()
        config = self._write_config(controller_port=self.controller_port)
        self._format_storage(config)
        self.process = ManagedProcess(
            f"kafka-{self.node_id}",
            self._java("kafka.Kafka", str(config)),
            self.log_path,
            die_with_parent=die_with_parent,
        ).start()
        self.pid_path.write_text(str(self.process.pid))

    def wait_ready(self, timeout_s: float) -> None:
        assert self.process is not None
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

    def healthy(self) -> bool:
        return broker_healthy(self.bootstrap)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout_s=30)
            self.process = None
        self.pid_path.unlink(missing_ok=True)

    def log_tail(self) -> str:
        return tail(self.log_path)


@dataclass
class KafkaCluster:
    """Three (or `size`) KRaft nodes in one quorum, each a broker and a controller, so the
    loss of any one of them keeps both the controller quorum and `min.insync.replicas`."""

    data_dir: Path
    jar_dir: Path
    size: int = 3
    heap: str = "384m"

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        cluster_id = _cluster_id()
        ports = [(free_port(), free_port()) for _ in range(self.size)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        self.nodes = [KafkaBroker(self.data_dir / f"node{i + 1}", port, self.jar_dir,
                                  heap=self.heap, node_id=i + 1, controller_port=controller,
                                  voters=voters, cluster_id=cluster_id, replication=self.size)
                      for i, (port, controller) in enumerate(ports)]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self, timeout_s: float = 120.0) -> KafkaCluster:
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait_ready(timeout_s)
            wait_until(lambda: broker_count(self.bootstrap) == self.size, timeout_s=timeout_s,
                       what=f"{self.size} Kafka brokers in one cluster", interval_s=0.5)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        # At once: a node stopping alone waits to hand its partitions over to the others.
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(KafkaBroker.stop, self.nodes))


def broker_count(bootstrap: str, timeout_s: float = 2.0) -> int:
    """How many brokers the cluster's metadata lists (0 when none answers)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000}, logger=_quiet)
    try:
        return len(admin.list_topics(timeout=timeout_s).brokers)
    except Exception:  # noqa: BLE001 - any failure means none answers yet
        return 0


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
