"""Redis clients for one server or a Redis Cluster, chosen by the URL.

`redis://host:port/0` (or `rediss://`) is one server; `redis+cluster://host:port` (or
`rediss+cluster://`) is a Redis Cluster reached through any of its nodes, which redis-py's
cluster client asks for the rest. Everything viewgate keeps of one view carries the view's
hash tag (schema.storage), so a view's fenced apply runs on the one master that holds its
slot and the views spread over the cluster's masters.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.cluster import ClusterPipeline, RedisCluster
from redis.connection import Encoder, PythonRespSerializer

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def cluster_url(url: str) -> str | None:
    """The plain URL of a cluster URL's seed node; None if `url` names one server."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    return f"{plain}{sep}{rest}" if sep and plain else None


def is_cluster(client: Any) -> bool:
    return isinstance(client, (RedisCluster, aioredis.RedisCluster))


# Packs a command's arguments for redis-py without copying the large ones: each argument
# past the cutoff is sent as it is. hiredis's packer (redis-py's default when hiredis is
# installed) copies every argument into one buffer: for a batch's apply of 8 MB, 2.5 to 3 ms
# a view, against 0.15 ms here (docs/engine-plan.md, "The garbage collector's full passes,
# and three costs of the interpreter").
_LARGE_ARGUMENTS_PACKER = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)


def connect(url: str, *, large_arguments: bool = False, **options: Any
            ) -> redis.Redis | RedisCluster:
    """A blocking client (the engine's, the command line's). `large_arguments`: its
    commands carry megabytes (the engine's batch applies), packed without a copy. A cluster
    client keeps redis-py's packer (its nodes' connections take no packer)."""
    if large_arguments:
        options["command_packer"] = _LARGE_ARGUMENTS_PACKER
    seed = cluster_url(url)
    if seed is None:
        return redis.Redis.from_url(url, **options)
    return RedisCluster.from_url(seed, **options)


def connect_async(url: str, **options: Any) -> aioredis.Redis | aioredis.RedisCluster:
    """An asyncio client (the gateway's)."""
    seed = cluster_url(url)
    if seed is None:
        return aioredis.Redis.from_url(url, **options)
    return aioredis.RedisCluster.from_url(seed, **options)


def is_cluster_pipeline(pipe: Any) -> bool:
    return isinstance(pipe, (ClusterPipeline, AsyncClusterPipeline))


def queue_script(pipe: Any, script: Any, keys: list[Any], args: list[Any]) -> None:
    """Queue a registered script on a pipeline of either client. A cluster pipeline refuses
    EVALSHA (it could not load the script into a master that lacks it, say a replica just
    promoted) and has no `eval` method of its own, so it is sent EVAL with the script's
    text, which it routes by the first key; a plain pipeline loads the script if needed."""
    if is_cluster_pipeline(pipe):
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    else:
        pipe.scripts.add(script)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
