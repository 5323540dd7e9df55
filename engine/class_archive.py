"""A class-data sharing archive for Spark's JVM, so that an engine starts faster.

Every start of the engine loads and verifies tens of thousands of classes (Spark SQL,
Structured Streaming, Delta, the Kafka connector) before the first batch. The JVM can map
them from an archive made by an earlier run instead (JDK's dynamic CDS: the classes a run
loaded, dumped when its JVM exits). Measured on 2 cores: Spark's session 4.2 -> 2.4 s,
the catalog's analysis 2.4 -> 1.6 s, a first job 1.5 -> 1.0 s.

`viewgate setup` builds it once per machine (a warm-up run in a child process: the demo
catalog analysed, small queries, a Delta table, a streaming query), keyed by the Java
executable and the jars, since the archive is only good for the class path it was made
with. build_spark uses it when it exists; a JVM that finds it unusable ignores it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark

from schema.settings import Settings


def archive_path(settings: Settings) -> Path:
    """Where the archive of this machine's Java and jars lives (it may not exist)."""
    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")) \
        or shutil.which("java") or "java"
    spark_jars = Path(pyspark.__file__).parent / "jars"
    parts = [os.path.realpath(java), pyspark.__version__, str(spark_jars),
             *sorted(p.name for p in spark_jars.glob("*.jar")), *settings.spark_jar_paths()]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return settings.cache_dir / "jvm" / f"spark-{digest}.jsa"


def java_options(settings: Settings) -> str:
    """The driver JVM's option to use the archive, if there is one."""
    path = archive_path(settings)
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""


def build_archive(settings: Settings, timeout_s: float = 600) -> Path | None:
    """Make the archive (a warm-up run in a child process whose JVM dumps the classes it
    loaded when it exits); None if it could not be made (the engine runs without it)."""
    path = archive_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="viewgate-cds-") as work:
        child = subprocess.Popen(
            [sys.executable, "-m", "engine.class_archive", str(partial), work],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, errors = child.communicate(timeout=timeout_s)
            _wait_for_group(child.pid, deadline=time.monotonic() + 120)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return None
    if child.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        return None
    partial.rename(path)
    return path


def _wait_for_group(leader: int, deadline: float) -> None:
    """Wait until every process of the child's group (its JVM) has exited: the JVM writes
    the archive on its way out, after the Python process it served has ended."""
    while time.monotonic() < deadline:
        try:
            os.killpg(leader, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(leader, signal.SIGKILL)


def _warm_up(archive: str, work: str) -> None:
    """What the engine loads on its way to its first batches."""
    from engine.analysis import analyse
    from engine.sinks.delta_sink import ensure_table
    from engine.spark import build_spark
    from schema.demo import CATALOG

    settings = Settings()
    spark = build_spark(settings, app_name="viewgate-class-archive",
                        extra_java_options=f"-XX:ArchiveClassesAtExit={archive}")
    schemas = analyse(spark, CATALOG)
    for name, schema in schemas.items():
        ensure_table(spark, f"{work}/{name}", schema)
        spark.read.format("delta").load(f"{work}/{name}").collect()
    rows = spark.createDataFrame([(f"c{i % 7}", float(i)) for i in range(100)],
                                 "k string, v double")
    rows.createOrReplaceTempView("t")
    query = "SELECT t.k, count(*) AS n, max(u.v) AS m FROM t JOIN t AS u ON t.k = u.k GROUP BY t.k"
    spark.sql(query).collect()
    spark.sql(query).toArrow()
    # The Kafka connector's classes (no broker: nothing is read).
    kafka = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
    kafka.option("subscribe", "warm-up").load().selectExpr("CAST(value AS STRING)").explain()
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 100).load()
              .writeStream.foreachBatch(lambda batch, _: batch.collect())
              .option("checkpointLocation", f"{work}/checkpoint").start())
    deadline = time.monotonic() + 60
    while len(stream.recentProgress) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    stream.stop()
    spark.stop()


if __name__ == "__main__":
    _warm_up(sys.argv[1], sys.argv[2])
