"""Spark's analysis of a SQL over temporary views, remembered across the engine's starts.

Every start analyses each view's SQL over its inputs' schemas (engine.analysis), and the
graph's setup analyses its lineages and aggregate plans again, on a JVM that has run none
of the analyzer's code yet: 1.5 s and 0.6 s of a restart's ~14 s for the demo's views
(measured on 2 cores). The answer, the output schema and the analyzed plan, depends only
on the SQL, the inputs' names and schemas and Spark's version. So it is kept in a file
named by their digest, in the folder build_spark names in the session's conf
(ANALYSIS_CACHE_CONF, under the cache folder), and read back by the next start, or by the
next use in the same process. A SQL that fails to analyse is not kept: it fails again,
with Spark's own error, at every start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from engine.lineage import Lineage, lineage_of_plan, plan_json

# The session's conf that names the cache's folder; unset, nothing is kept on disk.
ANALYSIS_CACHE_CONF = "spark.viewgate.analysisCache"
# An answer no start has read for this long is removed (its views changed since).
KEPT_S = 30 * 24 * 3600
_FORMAT = 1  # bumped when what a file holds changes

# Temp views are per session and named after sources and views; registering one and
# analysing SQL against it must not interleave with another thread doing the same.
SQL_LOCK = threading.RLock()


@dataclass(frozen=True)
class Analysed:
    schema: StructType  # the SQL's output columns
    plan_json: str  # the analyzed plan, as LogicalPlan.toJSON gives it (engine.lineage)

    @property
    def lineage(self) -> Lineage:
        return lineage_of_plan(self.plan_json)


_answers: dict[str, Analysed] = {}  # this process's, by digest


def analysed(spark: SparkSession, sql: str, inputs: Mapping[str, StructType | str]
             ) -> Analysed:
    """`sql`'s output schema and analyzed plan, over temporary views named as `inputs` with
    their schemas (a source's as DDL text; registered in `spark`, with no rows, when Spark
    has to analyse it)."""
    digest = _digest(sql, inputs)
    found = _answers.get(digest)
    if found is not None:
        return found
    folder = _folder(spark)
    found = _read(folder / f"{digest}.json") if folder is not None else None
    if found is None:
        with SQL_LOCK:
            for name, schema in inputs.items():
                spark.createDataFrame([], schema).createOrReplaceTempView(name)
            frame = spark.sql(sql)
            found = Analysed(frame.schema, plan_json(frame))
        if folder is not None:
            _write(folder, digest, found)
    _answers[digest] = found
    return found


_SOURCE = "__vg_source"  # the temp view struct_of names a source's schema by


def struct_of(spark: SparkSession, ddl: str) -> StructType:
    """A source's schema (DDL text) as Spark's StructType, as Spark parses it: a Spark
    call that costs a cold JVM a quarter of a second per source, kept like an analysis."""
    return analysed(spark, f"SELECT * FROM {_SOURCE}", {_SOURCE: ddl}).schema


def _digest(sql: str, inputs: Mapping[str, StructType | str]) -> str:
    schemas = {name: schema if isinstance(schema, str) else schema.json()
               for name, schema in inputs.items()}
    parts = [str(_FORMAT), pyspark.__version__, sql,
             *(f"{name}\n{schema}" for name, schema in sorted(schemas.items()))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _folder(spark: SparkSession) -> Path | None:
    named = spark.conf.get(ANALYSIS_CACHE_CONF, None)
    return Path(named) if named else None


def _read(path: Path) -> Analysed | None:
    """The kept answer; None if there is none or it cannot be read (then it is analysed
    again and written over)."""
    try:
        kept = json.loads(path.read_text())
        found = Analysed(StructType.fromJson(kept["schema"]), kept["plan"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # read: kept for another KEPT_S
    return found


def _write(folder: Path, digest: str, found: Analysed) -> None:
    """Keep the answer (written whole, then renamed: a reader never sees half of it), and
    remove the answers no start has read for KEPT_S. A folder that cannot be written
    costs the next start its analysis, nothing else."""
    text = json.dumps({"schema": found.schema.jsonValue(), "plan": found.plan_json})
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{digest}.{os.getpid()}.partial"
        partial.write_text(text)
        partial.replace(folder / f"{digest}.json")
        old = time.time() - KEPT_S
        for kept in folder.glob("*.json"):
            if kept.stat().st_mtime < old:
                kept.unlink(missing_ok=True)
    except OSError:
        return
