"""The engine's fenced apply of a batch (schema.storage.APPLY_BATCH_LUA) with its writes
grouped into commands of many arguments, on a real Redis (no Spark needed)."""

from __future__ import annotations

import orjson
import pytest
import redis
from shop_views import isolated

from schema.storage import (
    APPLIED,
    APPLY_BATCH_LUA,
    ViewMeta,
    apply_batch_args,
    meta_key,
    op_del,
    op_hdel,
    op_hset,
    op_set,
    op_zadd,
    op_zrem,
    row_key,
)

pytestmark = pytest.mark.integration

ROWS = 2_600  # more writes of one command than one call takes (1,000 arguments)
INDEX, STATES = "vg:{V}:g0:idx:amount", "vg:{V}:g0:state"


@pytest.fixture
def client(settings, tmp_path):
    settings = isolated(settings, tmp_path, redis_db=26)
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


def _apply(client, batch, ops):
    script = client.register_script(APPLY_BATCH_LUA)
    return script(keys=[meta_key("V")], args=apply_batch_args(batch, 0, {}, ops))


def test_a_large_batch_lands_whole_with_moves_and_replacements(client):
    first = [op_set(row_key("V", 0, f"k{i}"), f"r{i}") for i in range(ROWS)]
    first += [op_zadd(INDEX, float(i), f"k{i}") for i in range(ROWS)]
    first += [op_hset(STATES, f"k{i}", "s0") for i in range(3)]
    assert _apply(client, 0, first) == APPLIED

    second = [op_del(STATES), op_hset(STATES, "k0", "s1"), op_hdel(STATES, "k1")]
    for i in range(0, ROWS, 2):  # every other row moves to a new score
        second += [op_set(row_key("V", 0, f"k{i}"), f"v{i}"), op_zrem(INDEX, f"k{i}"),
                   op_zadd(INDEX, float(-i), f"k{i}")]
    second += [op_del(row_key("V", 0, "k1")), op_zrem(INDEX, "k1")]
    assert _apply(client, 1, second) == APPLIED

    assert client.get(row_key("V", 0, "k0")) == b"v0"
    assert client.get(row_key("V", 0, f"k{ROWS - 2}")) == f"v{ROWS - 2}".encode()
    assert client.get(row_key("V", 0, "k3")) == b"r3"
    assert client.get(row_key("V", 0, "k1")) is None
    assert client.zcard(INDEX) == ROWS - 1
    assert client.zscore(INDEX, f"k{ROWS - 2}") == -(ROWS - 2)
    assert client.zscore(INDEX, "k3") == 3
    assert client.hgetall(STATES) == {b"k0": b"s1"}, "dropped, then written anew"
    assert ViewMeta.from_fields(client.hgetall(meta_key("V"))).version == 1


@pytest.mark.parametrize("bad", [
    ["zadd", INDEX, ["not a score", "k"]],
    ["zadd", INDEX, [1, "k", 2, 3]],  # a member that is not text
    ["zadd", INDEX, [1, "k", 2]],  # a score without its member
    ["set", "", ["k2", 5]],  # a value that is not text
    ["set", "", ["k2"]],  # a key without its value
    ["del", "", [None]],
    ["hset", 7, ["f", "v"]],  # a key that is not text
    ["rename", "", ["a", "b"]],  # not a write the apply makes
], ids=["score", "member", "member-missing", "value", "value-missing", "null", "key",
        "command"])
def test_a_malformed_write_is_refused_before_anything_is_written(client, bad):
    args = apply_batch_args(0, 0, {}, [op_set(row_key("V", 0, "k"), "r")])
    writes = orjson.loads(args[3])
    writes.append(bad)
    args[3] = orjson.dumps(writes)
    script = client.register_script(APPLY_BATCH_LUA)
    with pytest.raises(redis.ResponseError, match="bad write #2"):
        script(keys=[meta_key("V")], args=args)
    assert client.get(row_key("V", 0, "k")) is None
    assert client.hgetall(meta_key("V")) == {}
