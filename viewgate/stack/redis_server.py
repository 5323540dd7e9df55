"""A local Redis server from Debian's `redis-server`, with no persistence of its own:
Redis is a cache that the engine can always rebuild from the log and Delta."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import redis

from viewgate.stack.errors import StackError
from viewgate.stack.process import ManagedProcess, require_free_port, tail, wait_until


def redis_server_executable() -> str:
    executable = shutil.which("redis-server")
    if executable is None:
        raise StackError(
            "redis-server was not found on PATH. Run `viewgate setup` (it installs Debian's "
            "redis-server package) or `apt-get install redis-server`."
        )
    return executable


@dataclass
class RedisServer:
    data_dir: Path
    port: int
    cluster_bus_port: int | None = None  # set: a node of a Redis Cluster (redis_cluster.py)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "redis.pid"

    def start(self, timeout_s: float = 30.0, die_with_parent: bool = True) -> RedisServer:
        require_free_port(self.port, "Redis", "VIEWGATE_LOCAL_REDIS_PORT")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            redis_server_executable(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            # More than the default 16: the test session gives modules databases of their own.
            "--databases",
            "32",
        ]
        if self.cluster_bus_port is not None:
            args += ["--cluster-enabled", "yes", "--cluster-port", str(self.cluster_bus_port),
                     "--cluster-config-file", str(self.data_dir / "nodes.conf"),
                     # Failover within seconds when a master dies (the default is 15 s).
                     "--cluster-node-timeout", "2000"]
        self.process = ManagedProcess(
            "redis", args, self.log_path, die_with_parent=die_with_parent
        ).start()
        self.pid_path.write_text(str(self.process.pid))
        try:
            wait_until(
                self.healthy,
                timeout_s=timeout_s,
                what=f"Redis on port {self.port}",
                alive=self.process.alive,
                log=self.log_path,
            )
        except StackError:
            self.stop()
            raise
        return self

    def healthy(self) -> bool:
        return redis_healthy(self.url)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        self.pid_path.unlink(missing_ok=True)

    def log_tail(self) -> str:
        return tail(self.log_path)


def redis_healthy(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()
