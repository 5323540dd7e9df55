"""The static side of a stream-static join: a dimension view's latest Delta snapshot.

Reading the dimension through Spark's Delta reader costs every batch a snapshot
reconstruction job and a Parquet scan, which dominated the freshness of the views that
join it. A small dimension is read once per Delta version with delta-rs into a local
relation instead; a large one (more rows than `dimension_local_max_rows`) stays a Spark
scan, so the driver never holds a big table.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from schema.delta_read import live_row_count, live_rows
from schema.settings import Settings
from schema.storage import delta_table_path, read_current_generation


@dataclass
class _Snapshot:
    path: str
    version: int
    frame: DataFrame


class Dimensions:
    """One per view query; the frames it hands out are that query's session's."""

    def __init__(self, settings: Settings, names: tuple[str, ...]) -> None:
        self.settings = settings
        self.names = names
        self._snapshots: dict[str, _Snapshot] = {}

    def register(self, session: SparkSession) -> None:
        """Make each dimension a temporary view of its latest snapshot."""
        for name in self.names:
            self.frame(session, name).createOrReplaceTempView(name)

    def frame(self, session: SparkSession, name: str) -> DataFrame:
        generation = read_current_generation(self.settings.delta_location, name)
        path = delta_table_path(self.settings.delta_location, name, generation)
        table = DeltaTable(path)
        version = table.version()
        cached = self._snapshots.get(name)
        if cached is not None and cached.path == path and cached.version == version:
            return cached.frame
        if live_row_count(table) > self.settings.dimension_local_max_rows:
            frame = session.read.format("delta").option("versionAsOf", version).load(path)
        else:
            frame = session.createDataFrame(live_rows(table))
        self._snapshots[name] = _Snapshot(path, version, frame)
        return frame
