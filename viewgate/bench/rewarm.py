"""Re-warming Redis from a view's Delta table: what the gateway does after Redis lost its
data (gateway.reads.reads.Reads.warm_all, the same code, run here in-process)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from schema.catalog import Catalog
from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from viewgate.bench.group import BenchError


def measure_rewarm(settings: Settings, catalog: Catalog, view_name: str) -> dict[str, Any]:
    """Empty the Redis database, then re-warm `view_name` from Delta and time it."""

    from gateway.reads.reads import Reads
    from schema.storage import meta_key, row_key

    client = connect_redis(settings.redis_url)
    try:
        client.flushdb()
        view = catalog.views[view_name]

        async def warm() -> tuple[bool, float]:
            reads = Reads(catalog, settings)
            try:
                started = time.perf_counter()
                done = await reads.warm_all(view)
                return done, time.perf_counter() - started
            finally:
                await reads.close()

        done, seconds = asyncio.run(warm())
        if not done:
            raise BenchError(f"re-warming {view_name} from Delta did not complete")
        generation = int(client.hget(meta_key(view_name), "generation") or 0)
        rows = sum(1 for _ in client.scan_iter(match=row_key(view_name, generation, "*"),
                                               count=10_000))
    finally:
        client.close()
    if rows == 0:
        raise BenchError(f"re-warming {view_name} wrote no rows")
    return {"rebuild_rows_per_s": round(rows / seconds), "rebuild_rows": rows,
            "rebuild_view": view_name, "rebuild_s": round(seconds, 3)}
