"""Generations of a view: the one readers are served, and switching them to a rebuilt one.

A view's Delta table, checkpoint and Redis keys all carry a generation number. A rebuild
fills generation N+1 beside the live N; the switch then moves readers over atomically
(Redis meta in one script, the `_current` pointer file by rename) and retires N.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import redis

from schema.object_store import delete_tree, subfolders
from schema.redis_client import is_cluster
from schema.settings import Settings
from schema.storage import (
    GRAPH_APPLYING,
    GRAPH_VERSION,
    META_GENERATION,
    SWITCH_GENERATION_LUA,
    generation_pattern,
    graph_key,
    meta_key,
    read_current_generation,
    write_current_generation,
)

_GENERATION_DIR = re.compile(r"^g(\d+)$")


def generation_dirs(settings: Settings, view: str) -> dict[int, list[str]]:
    """Every generation with a Delta table or checkpoint folder, on a local disk or in a
    bucket (schema.object_store)."""
    found: dict[int, list[str]] = {}
    for location in (settings.delta_location, settings.checkpoint_location):
        folder = f"{location.rstrip('/')}/{view}"
        for name in subfolders(folder):
            match = _GENERATION_DIR.match(name)
            if match:
                found.setdefault(int(match.group(1)), []).append(f"{folder}/{name}")
    return found


def _remove_dirs(settings: Settings, view: str, which: Callable[[int], bool]) -> list[int]:
    """Delete the Delta tables and checkpoints of the generations `which` picks."""
    removed = []
    for generation, paths in generation_dirs(settings, view).items():
        if which(generation):
            for path in paths:
                delete_tree(path)
            removed.append(generation)
    return removed


def drop_redis_generation(client: redis.Redis, view: str, generation: int) -> int:
    """UNLINK every Redis key of one generation; returns how many went."""
    dropped = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=generation_pattern(view, generation), count=1000):
        batch.append(key)
        if len(batch) == 1000:
            dropped += client.unlink(*batch)
            batch.clear()
    if batch:
        dropped += client.unlink(*batch)
    return dropped


def discard_generations_above(
    settings: Settings, client: redis.Redis, view: str, live: int
) -> None:
    """Remove what an abandoned rebuild left above the live generation."""
    for generation in _remove_dirs(settings, view, lambda g: g > live):
        drop_redis_generation(client, view, generation)


def switch_generation(settings: Settings, client: redis.Redis, view: str, generation: int) -> None:
    """Serve `generation` from now on. The pointer file first: should we die between the
    two writes, the engine's start-up finishes the switch (see reconcile_generation)."""
    write_current_generation(settings.delta_location, view, generation)
    client.register_script(SWITCH_GENERATION_LUA)(keys=[meta_key(view)], args=[generation])


def switch_generations(settings: Settings, client: redis.Redis,
                       generations: dict[str, int]) -> None:
    """Serve several views' new generations at once: the pointer files first, then every
    Redis meta in one transaction, so a reader never sees some of the views switched and
    others not (a view over views with the view it reads)."""
    for view, generation in generations.items():
        write_current_generation(settings.delta_location, view, generation)
    switch = client.register_script(SWITCH_GENERATION_LUA)
    if is_cluster(client):
        # No transaction spans a cluster's slots. The views switch one by one while the new
        # generation's graph mark says a batch is applying: a reader of several of them
        # waits for the mark or runs again (gateway.reads.consistency), as during a batch.
        marker = graph_key(max(generations.values()))
        client.hset(marker, GRAPH_APPLYING, client.hget(marker, GRAPH_VERSION) or -1)
        for view, generation in generations.items():
            switch(keys=[meta_key(view)], args=[generation])
        client.hdel(marker, GRAPH_APPLYING)
        return
    with client.pipeline(transaction=True) as pipe:
        for view, generation in generations.items():
            switch(keys=[meta_key(view)], args=[generation], client=pipe)
        pipe.execute()


def reconcile_generation(settings: Settings, client: redis.Redis, view: str) -> int:
    """The generation to serve: the newer of the pointer file and Redis' meta, completing
    a switch that a crash interrupted (or a pointer file that was lost)."""
    generation = read_current_generation(settings.delta_location, view)
    in_redis = int(client.hget(meta_key(view), META_GENERATION) or -1)
    if in_redis > generation:
        write_current_generation(settings.delta_location, view, in_redis)
        return in_redis
    client.register_script(SWITCH_GENERATION_LUA)(keys=[meta_key(view)], args=[generation])
    return generation


def retire_generation(settings: Settings, client: redis.Redis, view: str, old: int) -> None:
    """After a switch from `old`: its Redis keys go at once (writes to it are refused
    already), its Delta table stays for one more rebuild (time travel, a way back), and
    anything older than it goes."""
    drop_redis_generation(client, view, old)
    _remove_dirs(settings, view, lambda g: g < old)
