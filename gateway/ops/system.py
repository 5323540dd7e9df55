"""The `system` and `views` queries: what the gateway can see of the services it depends
on and of each view's last commit. Every value is read live at query time.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
import strawberry
import strawberry.scalars
from confluent_kafka.admin import AdminClient

from gateway.ops.long_scalar import Long
from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import ViewMeta, meta_key


@strawberry.type
class KafkaStatus:
    bootstrap: str
    reachable: bool
    brokers: int
    topics: list[str]
    error: str | None = None


@strawberry.type
class RedisStatus:
    url: str
    reachable: bool
    version: str | None = None
    error: str | None = None


@strawberry.type
class SystemStatus:
    kafka: KafkaStatus
    redis: RedisStatus


def _kafka_status(bootstrap: str) -> KafkaStatus:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000})
    try:
        metadata = admin.list_topics(timeout=2)
    except Exception as exc:  # noqa: BLE001 - reported to the client as data
        return KafkaStatus(
            bootstrap=bootstrap, reachable=False, brokers=0, topics=[], error=str(exc)
        )
    topics = sorted(t for t in metadata.topics if not t.startswith("__"))
    return KafkaStatus(
        bootstrap=bootstrap, reachable=True, brokers=len(metadata.brokers), topics=topics
    )


async def _redis_status(client: aioredis.Redis, url: str) -> RedisStatus:
    try:
        info = await client.info("server")
    except aioredis.RedisError as exc:
        return RedisStatus(url=url, reachable=False, error=str(exc))
    return RedisStatus(url=url, reachable=True, version=str(info.get("redis_version")))


def system_resolver(settings: Settings, redis_client: aioredis.Redis):
    async def system() -> SystemStatus:
        kafka = await asyncio.to_thread(_kafka_status, settings.kafka_bootstrap)
        return SystemStatus(
            kafka=kafka, redis=await _redis_status(redis_client, settings.redis_url)
        )

    return system


@strawberry.type(name="ViewStatus", description=(
    "What the engine last recorded for a view (its Redis meta), read live."))
class PublicViewStatus:
    """A view's status as roles other than the admin role see it: how fresh it is, not
    the engine's input (Kafka offsets, late and dead-lettered events of whole topics)."""

    name: str
    committed: bool
    version: int | None
    generation: int
    committed_at_ms: Long | None = strawberry.field(
        description="When the view's last commit happened, in epoch milliseconds (UTC).")
    since_commit_ms: Long | None = strawberry.field(
        description="Milliseconds since the view's last commit, by the gateway's clock.")
    watermark: str | None


@strawberry.type(description="What the engine last recorded for a view (its Redis meta), "
                 "read live.")
class ViewStatus(PublicViewStatus):
    """The admin role's: also what the engine read of its sources."""

    late_events: Long
    dead_letters: Long
    kafka_offsets: strawberry.scalars.JSON


def views_resolver(catalog: Catalog, redis_client: aioredis.Redis, admin: bool = True):
    """Each of the catalog's views (a role's catalog: the views granted to it); roles other
    than the admin role get `PublicViewStatus`."""
    async def views() -> list[PublicViewStatus]:
        async with redis_client.pipeline(transaction=False) as pipe:
            for name in catalog.views:
                pipe.hgetall(meta_key(name))
            metas = await pipe.execute()
        now_ms = int(time.time() * 1000)
        result: list[PublicViewStatus] = []
        for name, fields in zip(catalog.views, metas, strict=True):
            meta = ViewMeta.from_fields(fields)
            committed = meta.version >= 0
            status = dict(
                name=name,
                committed=committed,
                version=meta.version if committed else None,
                generation=meta.generation,
                committed_at_ms=meta.committed_at_ms or None,
                since_commit_ms=max(0, now_ms - meta.committed_at_ms)
                if meta.committed_at_ms else None,
                watermark=meta.watermark or None,
            )
            result.append(ViewStatus(**status, late_events=meta.late_events,
                                     dead_letters=meta.dead_letters,
                                     kafka_offsets=meta.offsets) if admin
                          else PublicViewStatus(**status))
        return result

    return views
