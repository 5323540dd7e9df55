"""`viewgate status`: every view's version, lag, watermark, rates and last error, from what
the engine records in Redis (schema.storage.ViewMeta) and the source topics' end offsets
in Kafka."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import redis
from rich.table import Table

from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import ViewMeta, meta_key


@dataclass
class ViewStatus:
    view: str
    generation: int
    version: int  # -1: never committed
    committed_at_ms: int
    watermark: str
    lag: int | None  # source events not yet committed; None: Kafka did not answer
    input_rate: float
    processing_rate: float
    batch_ms: int
    late_events: int
    dead_letters: int
    last_error: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def end_offsets(bootstrap: str, topics: Sequence[str],
                timeout_s: float = 5) -> dict[str, dict[str, int]] | None:
    """topic -> partition -> the next offset to be written; None if Kafka is unreachable."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "viewgate-status",
                         "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        out: dict[str, dict[str, int]] = {}
        for topic in topics:
            partitions = metadata.topics.get(topic)
            if partitions is None or partitions.error is not None:
                out[topic] = {}
                continue
            out[topic] = {
                str(p): consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=timeout_s)[1]
                for p in partitions.partitions
            }
        return out
    except KafkaException:
        return None
    finally:
        consumer.close()


def lag(covered: Mapping[str, Mapping[str, int]], ends: Mapping[str, int], topic: str) -> int:
    """Events in `topic` past what the view's last batch covered (its next offsets)."""
    done = covered.get(topic, {})
    return sum(max(0, end - int(done.get(partition, 0))) for partition, end in ends.items())


def collect(settings: Settings, catalog: Catalog) -> list[ViewStatus]:
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    try:
        pipe = client.pipeline(transaction=False)
        for name in catalog.views:
            pipe.hgetall(meta_key(name))
        metas = [ViewMeta.from_fields(fields) for fields in pipe.execute()]
    finally:
        client.close()
    topics = sorted({s.topic for s in catalog.sources.values()})
    ends = end_offsets(settings.kafka_bootstrap, topics)
    out = []
    for (name, view), meta in zip(catalog.views.items(), metas, strict=True):
        topic = catalog.source_of(view).topic
        out.append(ViewStatus(
            view=name, generation=meta.generation, version=meta.version,
            committed_at_ms=meta.committed_at_ms, watermark=meta.watermark,
            lag=None if ends is None else lag(meta.offsets, ends.get(topic, {}), topic),
            input_rate=meta.input_rate, processing_rate=meta.processing_rate,
            batch_ms=meta.batch_ms, late_events=meta.late_events,
            dead_letters=meta.dead_letters, last_error=meta.last_error))
    return out


def _age(ms: int, now_ms: float) -> str:
    if not ms:
        return "never"
    seconds = max(0.0, (now_ms - ms) / 1000)
    return f"{seconds:.1f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def render(rows: Sequence[ViewStatus], now_ms: float | None = None) -> Table:
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    table = Table(title="viewgate views")
    for column in ("view", "gen", "version", "committed", "watermark", "lag", "in/s",
                   "out/s", "batch", "late", "dead", "last error"):
        table.add_column(column, justify="left" if column in ("view", "watermark",
                                                                "last error") else "right")
    for r in rows:
        error = f"[red]{r.last_error}[/red]" if r.last_error else ""
        lag_text = "?" if r.lag is None else f"{r.lag:,}"
        if r.lag:
            lag_text = f"[yellow]{lag_text}[/yellow]"
        table.add_row(
            r.view, str(r.generation), "-" if r.version < 0 else str(r.version),
            _age(r.committed_at_ms, now_ms), r.watermark or "-", lag_text,
            f"{r.input_rate:,.0f}", f"{r.processing_rate:,.0f}",
            f"{r.batch_ms:,} ms" if r.batch_ms else "-", f"{r.late_events:,}",
            f"{r.dead_letters:,}", error)
    if rows and all(r.lag is None for r in rows):
        table.caption = "Kafka did not answer: lag unknown"
    return table
