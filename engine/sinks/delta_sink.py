"""MERGE one batch into the view's Delta table, idempotent on (app id, batch id)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import BooleanType, StructField, StructType

from schema.catalog import View

DELETED = "_deleted"


def ensure_table(session: SparkSession, path: str, schema: StructType) -> None:
    """Create the table with the change data feed on, if it does not exist yet."""
    (
        DeltaTable.createIfNotExists(session)
        .location(path)
        .addColumns(schema)
        .property("delta.enableChangeDataFeed", "true")
        .execute()
    )


class DeltaSink:
    """One per view; `session` is the view's own SparkSession, so the idempotency
    settings below never leak into another view's concurrent batch."""

    def __init__(
        self, session: SparkSession, path: str, view: View, schema: StructType, app_id: str
    ):
        self.session = session
        # The MERGE source is a local collection of the batch's rows: deterministic, so
        # Delta need not materialize it first (one Spark job less), and small, so adaptive
        # execution would only split each MERGE phase into a job per stage (12 jobs -> 5).
        session.conf.set("spark.databricks.delta.merge.materializeSource", "none")
        session.conf.set("spark.sql.adaptive.enabled", "false")
        self.path = path
        self.view = view
        self.schema = schema
        self.app_id = app_id
        self.source_schema = StructType(
            [*schema.fields, StructField(DELETED, BooleanType(), False)]
        )

    def merge(
        self,
        batch_id: int,
        rows: Sequence[Mapping[str, Any]],
        deleted: Sequence[Mapping[str, Any]],
        delete_on: Sequence[str],
        metadata: Mapping[str, Any],
    ) -> None:
        if not rows and not deleted:
            return
        columns = self.schema.fieldNames()
        data = [tuple(r.get(c) for c in columns) + (False,) for r in rows]
        data += [tuple(d.get(c) for c in columns) + (True,) for d in deleted]
        changes = self.session.createDataFrame(data, self.source_schema)
        upsert_on = " AND ".join(f"t.`{c}` = s.`{c}`" for c in self.view.key)
        delete_match = " AND ".join(f"t.`{c}` = s.`{c}`" for c in delete_on)
        condition = (
            f"(NOT s.{DELETED} AND {upsert_on}) OR (s.{DELETED} AND {delete_match})"
            if deleted
            else upsert_on
        )
        conf = self.session.conf
        conf.set("spark.databricks.delta.write.txnAppId", self.app_id)
        conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps(dict(metadata)))
        try:
            (
                DeltaTable.forPath(self.session, self.path)
                .alias("t")
                .merge(changes.alias("s"), condition)
                .whenMatchedDelete(condition=f"s.{DELETED}")
                .whenMatchedUpdate(
                    condition=f"NOT s.{DELETED}", set={c: f"s.`{c}`" for c in columns}
                )
                .whenNotMatchedInsert(
                    condition=f"NOT s.{DELETED}", values={c: f"s.`{c}`" for c in columns}
                )
                .execute()
            )
        finally:
            conf.unset("spark.databricks.delta.write.txnAppId")
            conf.unset("spark.databricks.delta.write.txnVersion")
            conf.unset("spark.databricks.delta.commitInfo.userMetadata")
