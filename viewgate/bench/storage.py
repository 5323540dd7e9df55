"""The storage group: what a batch's Delta commit costs as a view grows, and what the table
holds on disk after maintenance.

The Order view's table is written by the engine's own DeltaSink and maintained by the
engine's own maintenance (engine.maintenance). Two tables are grown with insert batches,
one to `storage_rows_small` rows and one to 100 times that, each compacted into files
ordered by key by maintenance, as the engine would leave it. Both then take the same
demo-shaped batches (700 new orders, 270 updates of recent ones, 300 updates anywhere in
the table and 30 deletes of any older order: the demo's mix of a second at 1,000
events/s), and their MERGE times and the bytes each writes are compared. The goal: a
batch on the large table costs at most 1.5 times what it costs on the small one.

The updates anywhere stand for a tier change's: the demo's Order follows its customer
through a view-to-view join, so a tier change rewrites every order of the customer, and a
customer's orders lie all over the key range. (Before 2026-11-25 the batches updated recent
orders only; the hour-long soak showed what they hid: once a batch's changes touch every
file, a copy-on-write MERGE rewrites the whole table.)
"""

from __future__ import annotations

import datetime
import random
import statistics
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from engine.maintenance import configure_table
from engine.sinks.delta_sink import DeltaSink
from schema import demo
from schema.storage import delta_app_id
from viewgate.bench.group import BenchContext, Group, GroupResult
from viewgate.bench.report import Figure

VIEW = demo.ORDER
GROWTH_BATCH_ROWS = 50_000  # inserts per MERGE while a table grows
# One measured batch: new orders, recent updates, updates anywhere, deletes of older ones.
NEW, RECENT, SPREAD, OLD = 700, 270, 300, 30
RECENT_WINDOW = 2_000  # how far back the recent updates reach

FIGURES = (
    Figure("delta_merge_ms_small_table", "one batch's Delta MERGE, small table (median)", "ms"),
    Figure("delta_merge_ms_large_table", "the same batches, table 100x larger (median)", "ms"),
    Figure("delta_merge_ratio", "large / small", "x", below=1.5),
    Figure("delta_rows_small_table", "rows of the small table at the end", "rows"),
    Figure("delta_rows_large_table", "rows of the large table at the end", "rows"),
    Figure("delta_merge_ms_large_first", "large table: median of the first fifth of batches",
           "ms"),
    Figure("delta_merge_ms_large_last", "large table: median of the last fifth of batches",
           "ms"),
    Figure("delta_mb_written_small_table", "bytes one batch writes, small table (median)",
           "MB"),
    Figure("delta_mb_written_large_table", "the same batches, table 100x larger (median)",
           "MB"),
    Figure("delta_maintenance_s_large_table", "maintenance of the large table", "s"),
    Figure("delta_bytes_per_row", "large table on disk per row after maintenance", "bytes"),
    Figure("delta_bytes_per_row_before_maintenance", "the same before it", "bytes"),
)

_SCHEMA = pa.schema([
    ("order_id", pa.string()), ("customer_id", pa.string()), ("product_id", pa.string()),
    ("amount", pa.float64()), ("status", pa.string()),
    ("ts", pa.timestamp("us", tz="UTC")), ("customer_tier", pa.string()),
    ("customer_country", pa.string()),
])


def _order(rng: random.Random, number: int, status: str = "placed") -> dict[str, Any]:
    return {
        "order_id": f"O{number:09d}",
        "customer_id": f"C{rng.randrange(20_000):05d}",
        "product_id": f"P{rng.randrange(200):04d}",
        "amount": round(rng.lognormvariate(3.3, 0.8), 2),
        "status": status,
        "ts": datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=number / 1000),
        "customer_tier": rng.choice(("bronze", "silver", "gold")),
        "customer_country": "NL",
    }


class _Table:
    """One Order table, written through the engine's DeltaSink, one batch id a MERGE."""

    def __init__(self, path: Path, target_file_bytes: int) -> None:
        self.path = str(path)
        self.target_file_bytes = target_file_bytes
        write_deltalake(self.path, pa.Table.from_pylist([], _SCHEMA),
                        configuration={"delta.enableChangeDataFeed": "true"})
        configure_table(self.path, VIEW, target_file_bytes)
        self.sink = DeltaSink(self.path, VIEW, delta_app_id(VIEW.name, 0))
        self.rows = 0
        self.batch = 0
        self.written_mb: list[float] = []  # bytes each demo batch added on disk

    def merge(self, rows: list[dict[str, Any]], deleted: list[dict[str, Any]],
              previous: dict[str, dict[str, Any]] | None = None) -> float:
        self.batch += 1
        started = time.perf_counter()
        self.sink.merge(self.batch, rows, deleted, VIEW.key, metadata={"batch_id": self.batch},
                        previous=previous)
        return (time.perf_counter() - started) * 1000

    def grow_to(self, rows: int, rng: random.Random) -> None:
        while self.rows < rows:
            count = min(GROWTH_BATCH_ROWS, rows - self.rows)
            self.merge([_order(rng, self.rows + i) for i in range(count)], [])
            self.rows += count
        self.sink.maintain(self.target_file_bytes)

    def demo_batch(self, rng: random.Random) -> float:
        """One second of the demo's traffic: its MERGE time in ms (and, in `written_mb`,
        what it wrote)."""
        new = [_order(rng, self.rows + i) for i in range(NEW)]
        recent = set(rng.sample(range(max(0, self.rows - RECENT_WINDOW), self.rows), RECENT))
        spread = set(rng.sample(range(self.rows), SPREAD)) - recent
        updated = [_order(rng, n, status="paid") for n in sorted(recent | spread)]
        older = range(max(OLD, self.rows - RECENT_WINDOW))
        deleted = [{"order_id": f"O{n:09d}"}
                   for n in set(rng.sample(older, OLD)) - recent - spread]
        self.rows += NEW
        # The rows' previous values, as the engine hands them over from Redis (it read them
        # for the change events): the change data's pre-images. Here rows of the same shape
        # in Redis's JSON form; their values are not checked.
        previous = {r["order_id"]: {**r, "status": "placed", "ts": r["ts"].isoformat() + "Z"}
                    for r in updated}
        previous |= {d["order_id"]: {**_order(rng, int(d["order_id"][1:])),
                                     "ts": "2026-01-01T00:00:00Z"} for d in deleted}
        before = _bytes_on_disk(self.path)
        ms = self.merge(new + updated, deleted, previous)
        self.written_mb.append((_bytes_on_disk(self.path) - before) / 1e6)
        return ms


def _bytes_on_disk(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run(ctx: BenchContext) -> GroupResult:
    sizes = ctx.sizes
    rng = random.Random(7)
    small, large = sizes.storage_rows_small, sizes.storage_rows_small * 100
    timings: dict[str, list[float]] = {}
    tables: dict[str, _Table] = {}
    for name, rows in (("small", small), ("large", large)):
        ctx.say(f"storage: growing a {rows:,}-row Order table")
        table = _Table(ctx.workdir / f"storage-{name}", ctx.settings.delta_target_file_bytes)
        table.grow_to(rows, rng)
        ctx.say(f"storage: {sizes.storage_batches} demo batches on {rows:,} rows")
        timings[name] = [table.demo_batch(rng) for _ in range(sizes.storage_batches)]
        tables[name] = table

    big = tables["large"]
    before = _bytes_on_disk(big.path) / big.rows
    maintenance = big.sink.maintain(big.target_file_bytes)
    # What maintenance keeps bounded: files older than the view's history go. The bench
    # cannot wait a day, so it vacuums with no retention to show what remains.
    DeltaTable(big.path).vacuum(retention_hours=0, dry_run=False,
                                enforce_retention_duration=False)
    after = _bytes_on_disk(big.path) / big.rows
    fifth = max(1, len(timings["large"]) // 5)
    figures = {
        "delta_merge_ms_small_table": round(statistics.median(timings["small"]), 1),
        "delta_merge_ms_large_table": round(statistics.median(timings["large"]), 1),
        "delta_rows_small_table": tables["small"].rows,
        "delta_rows_large_table": big.rows,
        "delta_merge_ms_large_first": round(statistics.median(timings["large"][:fifth]), 1),
        "delta_merge_ms_large_last": round(statistics.median(timings["large"][-fifth:]), 1),
        "delta_mb_written_small_table": round(statistics.median(tables["small"].written_mb), 2),
        "delta_mb_written_large_table": round(statistics.median(big.written_mb), 2),
        "delta_maintenance_s_large_table": round(maintenance.seconds, 2),
        "delta_bytes_per_row": round(after, 1),
        "delta_bytes_per_row_before_maintenance": round(before, 1),
    }
    figures["delta_merge_ratio"] = round(
        figures["delta_merge_ms_large_table"] / figures["delta_merge_ms_small_table"], 2)
    return GroupResult(figures)


GROUP = Group(
    name="storage",
    description="a batch's Delta MERGE on a table 100x larger; bytes per row after maintenance",
    figures=FIGURES,
    run=run,
)
