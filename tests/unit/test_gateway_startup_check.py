"""The gateway refuses to start when a view's GraphQL type and the engine's Delta table
disagree (a catalog changed on one side only); delta-rs writes the tables here."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from gateway.ops.startup_check import check_against_delta
from schema.demo import CATALOG
from schema.errors import CatalogError
from schema.storage import delta_table_path

STATS = pa.schema(
    [
        ("customer_id", pa.string()),
        ("order_count", pa.int64()),
        ("total_spent", pa.float64()),
        ("avg_order", pa.float64()),
        ("max_order", pa.float64()),
        ("min_order", pa.float64()),
        ("last_order_at", pa.timestamp("us", tz="UTC")),
    ]
)


def _write(root: Path, schema: pa.Schema) -> None:
    path = delta_table_path(str(root), "CustomerStats", 0)
    write_deltalake(path, pa.Table.from_pylist([], schema=schema))


def test_a_matching_table_passes_and_unwritten_views_are_reported(tmp_path: Path) -> None:
    _write(tmp_path, STATS)
    unwritten = check_against_delta(CATALOG, str(tmp_path))
    assert "CustomerStats" not in unwritten
    assert set(unwritten) == {"Customer", "OrderRecord", "Order", "ProductSales"}


def test_a_type_mismatch_names_the_view_the_field_and_the_fix(tmp_path: Path) -> None:
    index = STATS.get_field_index("order_count")
    _write(tmp_path, STATS.set(index, pa.field("order_count", pa.float64())))
    with pytest.raises(CatalogError) as error:
        check_against_delta(CATALOG, str(tmp_path))
    message = str(error.value)
    assert "CustomerStats" in message and "order_count" in message
    assert "viewgate rebuild CustomerStats" in message
