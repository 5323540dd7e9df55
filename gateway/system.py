"""The `system` query: what the gateway can see of the services it depends on.

Every value here is read live from Kafka and Redis at query time.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
import strawberry
from confluent_kafka.admin import AdminClient

from schema.settings import Settings


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
