"""Create the topics the engine reads and writes when they do not exist yet, so a view
whose source has no events so far starts (and waits) instead of failing."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from schema.catalog import Catalog
from schema.storage import changefeed_topic, deadletter_topic


def ensure_topics(bootstrap: str, catalog: Catalog, timeout_s: float = 30) -> None:
    topics = [s.topic for s in catalog.sources.values()]
    topics += [deadletter_topic(s) for s in catalog.sources]
    topics += [changefeed_topic(v) for v in catalog.views]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [NewTopic(t) for t in dict.fromkeys(topics) if t not in existing]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"cannot create topic {topic}: {exc}") from exc
