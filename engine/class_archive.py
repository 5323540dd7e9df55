"""A class-data sharing archive for Spark's JVM, so that an engine starts faster.

Every start of the engine loads and verifies tens of thousands of classes (Spark SQL,
Structured Streaming, Delta, the Kafka connector) before the first batch. The JVM can map
them from an archive made by an earlier run instead (JDK's dynamic CDS: the classes a run
loaded, dumped when its JVM exits). Measured on 2 cores: Spark's session 4.2 -> 2.4 s,
the catalog's analysis 2.4 -> 1.6 s, a first job 1.5 -> 1.0 s.

`viewgate setup` builds it once per machine (a warm-up run in a child process: the demo
catalog analysed, small queries, a Delta table, a streaming query, and the graph's read of
its sources through a broker `setup` starts for it), keyed by the Java executable, the jars
(their paths, sizes and times) and the warm-up's version, since the archive is only good
for the class path it was made with and holds only what its warm-up loaded; building one
deletes those no JVM can use any more. build_spark uses it when it exists; a JVM that
finds it unusable ignores it.

Only classes the warm-up loads are archived. Without a broker the warm-up read nothing,
and every start loaded 1,346 of the Kafka client's classes from its jar while its query
started and read its first batch; with the read, 288 (class loading logged, 2026-11-28;
docs/engine-plan.md, "The class archive's warm-up reads through a broker").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import SparkSession

from schema.settings import Settings

log = logging.getLogger("viewgate.engine.class_archive")


def archive_path(settings: Settings) -> Path:
    """Where the archive of this machine's Java and jars lives (it may not exist)."""
    return _path_of(settings, _digest(_inputs(settings)))


# The warm-up's note (on its stderr) that its read failed, passed on by build_archive.
_READ_FAILED = "viewgate class archive: the warm-up's read failed"

# What the warm-up runs, by version: an archive made by an older warm-up lacks classes a
# newer one loads, so it is made again (and pruned).
WARM_UP = 2


def _inputs(settings: Settings) -> dict[str, Any]:
    """What an archive is only good for: the Java executable and the class path's jars;
    and the warm-up that made it."""
    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")) \
        or shutil.which("java") or "java"
    spark_jars = Path(pyspark.__file__).parent / "jars"
    jars = [*sorted(spark_jars.glob("*.jar")), *map(Path, settings.spark_jar_paths())]
    return {"java": os.path.realpath(java), "pyspark": pyspark.__version__,
            "jars": [str(jar) for jar in jars], "warm_up": WARM_UP}


def _digest(inputs: dict[str, Any]) -> str:
    # The JVM refuses an archive whose class path's jars changed size or time ("The top
    # archive failed to load"): a virtualenv made again at the same path (a fresh clone)
    # has the same jars with new times, and needs an archive of its own.
    parts = [inputs["java"], inputs["pyspark"], *map(_stamp, inputs["jars"]),
             f"warm-up {inputs['warm_up']}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _stamp(jar: str) -> str:
    try:
        stat = os.stat(jar)
    except OSError:
        return jar
    return f"{jar} {stat.st_size} {stat.st_mtime_ns}"


def _path_of(settings: Settings, digest: str) -> Path:
    return settings.cache_dir / "jvm" / f"spark-{digest}.jsa"


def prune_stale_archives(settings: Settings) -> list[Path]:
    """Delete the archives (about 180 MB each) that no JVM can use any more: their jars are
    gone or changed (each archive's inputs are kept beside it), or they were made before
    their inputs were kept. Returns what was deleted."""
    deleted = []
    for archive in sorted((settings.cache_dir / "jvm").glob("spark-*.jsa")):
        inputs = archive.with_suffix(".json")
        try:
            # Inputs recorded before the warm-up had a version lack it: stale (KeyError).
            recorded = json.loads(inputs.read_text())
            stale = (_digest(recorded) != archive.stem.removeprefix("spark-")
                     or recorded["warm_up"] != WARM_UP)
        except (OSError, ValueError, KeyError, TypeError):
            stale = True
        if stale:
            archive.unlink(missing_ok=True)
            inputs.unlink(missing_ok=True)
            deleted.append(archive)
    return deleted


def java_options(settings: Settings) -> str:
    """The driver JVM's option to use the archive, if there is one."""
    path = archive_path(settings)
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""


def build_archive(settings: Settings, timeout_s: float = 600,
                  kafka_bootstrap: str | None = None) -> Path | None:
    """Make the archive (a warm-up run in a child process whose JVM dumps the classes it
    loaded when it exits); None if it could not be made (the engine runs without it).
    `kafka_bootstrap`: a broker the warm-up may write topics of its own to, so that it
    reads as the engine does (without one, the archive lacks the read's classes)."""
    inputs = _inputs(settings)
    path = _path_of(settings, _digest(inputs))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="viewgate-cds-") as work:
        child = subprocess.Popen(
            [sys.executable, "-m", "engine.class_archive", str(partial), work,
             kafka_bootstrap or ""],
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
    for line in errors.decode(errors="replace").splitlines():
        if line.startswith(_READ_FAILED):  # made, but without the read's classes
            log.warning("%s", line)
    path.with_suffix(".json").write_text(json.dumps(inputs))
    partial.rename(path)
    prune_stale_archives(settings)
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


def _warm_up(archive: str, work: str, kafka_bootstrap: str = "") -> None:
    """What the engine loads on its way to its first batches."""
    from engine.analysis import analyse
    from engine.analyzer import ANALYSIS_CACHE_CONF
    from engine.sinks.delta_sink import ensure_table
    from engine.spark import build_spark
    from schema.demo import CATALOG

    settings = Settings()
    spark = build_spark(settings, app_name="viewgate-class-archive",
                        extra_java_options=f"-XX:ArchiveClassesAtExit={archive}")
    spark.conf.unset(ANALYSIS_CACHE_CONF)  # Spark's analyzer runs: its classes are archived
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
    if kafka_bootstrap:
        try:
            warm_up_read(spark, settings.model_copy(update={"kafka_bootstrap": kafka_bootstrap}),
                         f"{work}/read-checkpoint")
        except Exception as error:  # noqa: BLE001 - the rest of the archive is still worth it
            print(f"{_READ_FAILED}; archived without it: {error}", file=sys.stderr)
    else:  # the Kafka connector's classes at least (nothing is read)
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


def warm_up_read(spark: SparkSession, settings: Settings, checkpoint: str,
                 records: int = 50) -> int:
    """The graph query's read (engine.sources, engine.frames) of the demo's sources, each
    renamed to a warm-up topic of its own on `settings.kafka_bootstrap`: records of every
    kind (good, malformed, a tombstone) produced, then read in one batch with Kafka's
    admin and consumer clients, parsed by Spark's generated code and collected through
    Arrow. Returns how many records the batch held."""
    from dataclasses import replace

    from confluent_kafka import Producer

    from engine.frames import rows_of
    from engine.graph import graph_sources
    from engine.sources import classify_sources, read_kafka
    from schema.demo import CATALOG

    run = f"viewgate-warm-up-{os.getpid()}-{time.time_ns()}"
    sources = [replace(s, topic=f"{run}.{s.topic}") for s in graph_sources(CATALOG)]
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for source in sources:
        for i in range(records):
            # Empty objects parse as rows of nulls: the same generated code as real ones.
            value = b"not json" if i == 0 else b"{}"
            producer.produce(source.topic, key=f"k{i % 7}".encode(), value=value)
        producer.produce(source.topic, key=b"k0", value=None)
    if producer.flush(60):
        raise RuntimeError("the warm-up's records were not delivered within 60 s")
    read: list[int] = []
    classified = classify_sources(
        read_kafka(spark, settings, ",".join(s.topic for s in sources)), sources)
    query = (classified.writeStream.foreachBatch(lambda batch, _: read.append(len(rows_of(batch))))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    finally:
        query.stop()
    return sum(read)


if __name__ == "__main__":
    _warm_up(*sys.argv[1:4])
