"""A local Redis Cluster of Debian's `redis-server`: masters with a replica each, created
with `redis-cli --cluster create`, on free ports in a folder of its own."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis

from viewgate.stack.errors import StackError
from viewgate.stack.process import free_port, wait_until
from viewgate.stack.redis_server import RedisServer

HOST = "127.0.0.1"
BUS_PORT_TRIES = 3


@dataclass
class RedisClusterServers:
    data_dir: Path
    masters: int = 3
    replicas_per_master: int = 1
    nodes: list[RedisServer] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        # Client ports are chosen now, so the URL is known before the nodes start; each
        # bus port again when its node starts (_start_node).
        self.nodes = [RedisServer(self.data_dir / f"node{i}", free_port(),
                                  cluster_bus_port=free_port())
                      for i in range(self.masters * (1 + self.replicas_per_master))]

    @property
    def url(self) -> str:
        """Any node will do: the cluster client asks it for the others."""
        return f"redis+cluster://{HOST}:{self.nodes[0].port}"

    def start(self, timeout_s: float = 60.0) -> RedisClusterServers:
        try:
            for node in self.nodes:
                self._start_node(node, timeout_s)
            self._create(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, node: RedisServer, timeout_s: float) -> None:
        """Start `node` with a cluster bus port chosen just now, and chosen again if
        something bound it first: a free port is free only until someone binds it, and the
        services started before the nodes (Kafka's brokers) open connections from the same
        range of ports (a CI run lost a node so)."""
        for attempt in range(BUS_PORT_TRIES):
            node.cluster_bus_port = free_port()
            try:
                node.start(timeout_s=timeout_s)
                return
            except StackError as exc:
                if attempt == BUS_PORT_TRIES - 1 or "Address already in use" not in str(exc):
                    raise
                # The failed start may have written the node's config with that port.
                (node.data_dir / "nodes.conf").unlink(missing_ok=True)

    def _create(self, timeout_s: float) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise StackError("redis-cli was not found on PATH (Debian's redis-tools).")
        done = subprocess.run(
            [cli, "--cluster", "create", *(f"{HOST}:{n.port}" for n in self.nodes),
             "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise StackError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        wait_until(self.healthy, timeout_s=timeout_s, what="the Redis Cluster's slots")

    def healthy(self) -> bool:
        """Every running node says the cluster is ok and counts the masters asked for."""
        running = [n for n in self.nodes if n.process is not None and n.process.alive()]
        return bool(running) and all(_cluster_ok(n.port, self.masters) for n in running)

    def master_of(self, key: str) -> RedisServer:
        """The node that serves `key`'s slot now (a replica once its master failed)."""
        live = next(n for n in self.nodes if n.process is not None and n.process.alive())
        with redis.Redis(host=HOST, port=live.port) as client:
            slot = client.cluster("keyslot", key)
            slots = client.execute_command("CLUSTER", "SLOTS")
        # [start, end, [master host, port, id], replicas...] per range
        port = next(int(master[1]) for start, end, master, *_ in slots if start <= slot <= end)
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _cluster_ok(port: int, masters: int) -> bool:
    try:
        with redis.Redis(host=HOST, port=port, socket_timeout=2) as client:
            info = client.cluster("info")
    except redis.RedisError:
        return False
    return info.get("cluster_state") == "ok" and int(info.get("cluster_size", 0)) == masters
