"""delta-spark reads the deletion vectors the engine writes: the same rows as delta-rs,
at the latest version and at an older one. The table is created the engine's way (Spark,
engine.sinks.delta_sink.ensure_table) and written by the engine's DeltaSink."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import StringType, StructField, StructType

from engine.maintenance import configure_table
from engine.sinks.delta_sink import DeltaSink, ensure_table
from schema import demo
from schema.delta_read import live_rows
from schema.storage import delta_app_id

pytestmark = pytest.mark.integration

VIEW = demo.CUSTOMER
SCHEMA = StructType([StructField(c, StringType(), c != "customer_id")
                     for c in ("customer_id", "name", "tier", "country")])


def _row(n: int, tier: str) -> dict:
    return {"customer_id": f"C{n:06d}", "name": f"n{n}", "tier": tier, "country": "NL"}


def _spark_rows(spark, path: str, version: int | None = None) -> dict[str, str]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    rows = reader.load(path).select("customer_id", "tier").collect()
    assert len(rows) == len({r.customer_id for r in rows}), "Spark sees a key twice"
    return {r.customer_id: r.tier for r in rows}


def test_spark_reads_the_engines_deletion_vectors(spark, tmp_path):
    path = str(tmp_path / "Customer")
    ensure_table(spark, path, SCHEMA)
    configure_table(path, VIEW, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    rng = random.Random(3)
    expected: dict[str, str] = {}
    middle = None
    last = ({}, set(), [])  # the last batch: its inserts, updates and deletes
    for batch in range(1, 9):
        new = [_row(n, "gold") for n in range(batch * 500, batch * 500 + 500)]
        old = sorted(expected)
        changed = [_row(int(k[1:]), f"t{batch}") for k in rng.sample(old, min(100, len(old)))]
        gone = [k for k in rng.sample(old, min(20, len(old)))
                if k not in {r["customer_id"] for r in changed}]
        sink.merge(batch, new + changed, [{"customer_id": k} for k in gone], VIEW.key,
                   metadata={"batch_id": batch})
        last = ({r["customer_id"] for r in new}, {r["customer_id"] for r in changed}, gone)
        expected.update({r["customer_id"]: r["tier"] for r in new + changed})
        for k in gone:
            del expected[k]
        if batch == 4:
            middle = (DeltaTable(path).version(), dict(expected))

    table = DeltaTable(path)
    assert pa.table(table.deletion_vectors()).num_rows > 0, "no deletion vector written"
    delta_rs = live_rows(table)
    assert dict(zip(delta_rs["customer_id"].to_pylist(), delta_rs["tier"].to_pylist(),
                    strict=True)) == expected
    assert _spark_rows(spark, path) == expected
    version, then = middle
    assert _spark_rows(spark, path, version) == then
    # Spark's change data feed of the last batch: what the engine's cdc file says.
    changes = (spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", table.version()).load(path)
               .select("customer_id", "_change_type").collect())
    by_type: dict[str, set[str]] = {}
    for change in changes:
        by_type.setdefault(change._change_type, set()).add(change.customer_id)
    inserted, updated, deleted = last
    assert by_type == {"insert": inserted, "update_preimage": updated,
                       "update_postimage": updated, "delete": set(deleted)}
