"""Which client a Redis URL asks for."""

from __future__ import annotations

from redis import Redis
from redis.cluster import RedisCluster

from schema.redis_client import cluster_url, connect


def test_a_cluster_url_names_its_seed_node() -> None:
    assert cluster_url("redis+cluster://node1:7000") == "redis://node1:7000"
    assert cluster_url("rediss+cluster://user:pw@node1:7000") == "rediss://user:pw@node1:7000"
    assert cluster_url("REDIS+CLUSTER://node1:7000") == "redis://node1:7000"


def test_a_plain_url_is_one_server() -> None:
    assert cluster_url("redis://127.0.0.1:6379/0") is None
    assert cluster_url("rediss://cache:6380/1") is None
    assert cluster_url("unix:///run/redis.sock") is None
    client = connect("redis://127.0.0.1:1/0")  # connects lazily: nothing listens there
    assert isinstance(client, Redis) and not isinstance(client, RedisCluster)
    client.close()
