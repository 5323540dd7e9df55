"""Create the topics the engine reads and writes when they do not exist yet, so a view
whose source has no events so far starts (and waits) instead of failing.

Change-feed topics get exactly one partition (a view's changes in one order, so a
subscriber's position is one offset) and the configured retention. Every topic gets the
configured replication and min.insync.replicas (else the brokers' defaults)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import CHANGEFEED_PREFIX, changefeed_topic, deadletter_topic


def ensure_topics(bootstrap: str, catalog: Catalog, timeout_s: float = 30,
                  changefeed_prefix: str = CHANGEFEED_PREFIX,
                  changefeed_retention_ms: int | None = None,
                  replication_factor: int | None = None,
                  min_insync_replicas: int | None = None) -> None:
    topics = [s.topic for s in catalog.sources.values()]
    topics += [deadletter_topic(s) for s in catalog.sources]
    feeds = {changefeed_topic(v, changefeed_prefix) for v in catalog.views}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=timeout_s).topics
    split = sorted(t for t in feeds if t in existing and len(existing[t].partitions) != 1)
    if split:
        raise RuntimeError(f"change-feed topics {', '.join(split)} have more than one "
                           "partition; subscriptions need one: delete and recreate them")
    replicas = -1 if replication_factor is None else replication_factor  # -1: the brokers'
    config = {} if min_insync_replicas is None else {
        "min.insync.replicas": str(min_insync_replicas)}
    feed_config = config if changefeed_retention_ms is None else {
        **config, "retention.ms": str(changefeed_retention_ms)}
    missing = [NewTopic(t, replication_factor=replicas, config=config)
               for t in dict.fromkeys(topics) if t not in existing]
    missing += [NewTopic(t, num_partitions=1, replication_factor=replicas, config=feed_config)
                for t in sorted(feeds) if t not in existing]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"cannot create topic {topic}: {exc}") from exc


def ensure_view_topics(settings: Settings, catalog: Catalog) -> None:
    """ensure_topics with the change feed's prefix and retention and the topics'
    replication from the settings."""
    ensure_topics(settings.kafka_bootstrap, catalog,
                  changefeed_prefix=settings.changefeed_prefix,
                  changefeed_retention_ms=settings.changefeed_retention_ms,
                  replication_factor=settings.kafka_replication_factor,
                  min_insync_replicas=settings.kafka_min_insync_replicas)
