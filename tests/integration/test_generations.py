"""Switching generations in Redis and the pointer file, and recovering a half-done switch
(real Redis; no Spark needed)."""

from __future__ import annotations

import pytest
import redis
from shop_views import isolated

from engine.generations import reconcile_generation, switch_generation
from schema.storage import (
    APPLY_BATCH_LUA,
    RETIRED,
    ViewMeta,
    apply_batch_args,
    meta_key,
    op_set,
    read_current_generation,
    row_key,
    write_current_generation,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def setup(settings, tmp_path):
    settings = isolated(settings, tmp_path, redis_db=5)
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    try:
        yield settings, client
    finally:
        client.close()


def _apply(client, view, batch, generation, meta):
    ops = [op_set(row_key(view, generation, "k"), f"b{batch}")]
    script = client.register_script(APPLY_BATCH_LUA)
    return script(keys=[meta_key(view)], args=apply_batch_args(batch, generation, meta, ops))


def test_a_switch_promotes_the_new_generations_meta_and_retires_the_old(setup):
    settings, client = setup
    _apply(client, "V", 7, 0, {"watermark": "2024-01-01T00:00:00.000Z"})
    _apply(client, "V", 2, 1, {"watermark": "2024-01-01T00:05:00.000Z"})  # a rebuild
    live = ViewMeta.from_fields(client.hgetall(meta_key("V")))
    assert (live.generation, live.version) == (0, 7), "a rebuild does not show through"

    switch_generation(settings, client, "V", 1)

    meta = ViewMeta.from_fields(client.hgetall(meta_key("V")))
    assert (meta.generation, meta.version, meta.watermark) == (1, 2, "2024-01-01T00:05:00.000Z")
    assert read_current_generation(settings.delta_location, "V") == 1
    assert _apply(client, "V", 8, 0, {}) == RETIRED
    assert client.get(row_key("V", 0, "k")) == b"b7", "the retired write changed nothing"


def test_start_up_completes_a_switch_a_crash_interrupted(setup):
    settings, client = setup
    _apply(client, "V", 7, 0, {})
    _apply(client, "V", 3, 1, {})
    write_current_generation(settings.delta_location, "V", 1)  # died before Redis' switch
    assert reconcile_generation(settings, client, "V") == 1
    meta = ViewMeta.from_fields(client.hgetall(meta_key("V")))
    assert (meta.generation, meta.version) == (1, 3)


def test_start_up_trusts_redis_when_the_pointer_file_was_lost(setup):
    settings, client = setup
    _apply(client, "V", 3, 2, {})
    assert reconcile_generation(settings, client, "V") == 2
    assert read_current_generation(settings.delta_location, "V") == 2
