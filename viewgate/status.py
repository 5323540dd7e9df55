"""`viewgate status`: every view's version, lag, watermark, rates and last error, from what
the engine records in Redis (schema.storage.ViewMeta) and the source topics' end offsets
in Kafka."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from rich.table import Table

from gateway.ops.readiness import end_offsets
from schema.catalog import Catalog
from schema.redis_client import connect as connect_redis
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


def collect(settings: Settings, catalog: Catalog) -> list[ViewStatus]:
    client = connect_redis(settings.redis_url, socket_timeout=5)
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
            lag=None if ends is None else meta.behind(topic, ends.get(topic, {})),
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
