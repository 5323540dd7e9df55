"""Which client a Redis URL asks for."""

from __future__ import annotations

from redis import Redis
from redis.cluster import RedisCluster

from engine.sinks.redis_sink import RedisSink
from schema.catalog import graphql_fields
from schema.demo import CATALOG
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


LARGE = b"x" * 8_000_000  # a batch's apply: its writes and outbox as one argument each


def _packed(client) -> list[bytes]:
    """What `client` sends for an apply carrying LARGE."""
    connection = client.connection_pool.make_connection()
    return connection.pack_commands([("EVALSHA", "0" * 40, 1, "meta", LARGE)])


def test_a_client_for_large_arguments_sends_them_without_a_copy() -> None:
    for large_arguments in (True, False):
        client = connect("redis://127.0.0.1:1/0", large_arguments=large_arguments)
        packed = _packed(client)
        assert b"".join(packed).endswith(b"$8000000\r\n" + LARGE + b"\r\n")
        assert any(chunk is LARGE for chunk in packed) is large_arguments
        client.close()


def test_a_view_sink_reads_with_hiredis_and_applies_without_a_copy() -> None:
    # A batch's previous rows are one MGET of thousands of keys: hiredis packs them in C
    # (13,500 keys: 2.3 ms against 8.8 in Python), copying every argument (redis-py's own
    # packer sends a large one as it is). Its apply keeps the copy-free packer.
    view = CATALOG.view("Order")
    sink = RedisSink("redis://127.0.0.1:1/0", view, graphql_fields(view))
    assert not any(chunk is LARGE for chunk in _packed(sink.client))
    assert any(chunk is LARGE for chunk in _packed(sink.apply_client))
    sink.close()
