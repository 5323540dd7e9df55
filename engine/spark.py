"""Build the SparkSession the engine runs on: Delta enabled, jars from local files."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from engine.analyzer import ANALYSIS_CACHE_CONF
from engine.class_archive import java_options
from schema.object_store import export_s3_environment, spark_s3_conf
from schema.settings import Settings


class MissingJarsError(RuntimeError):
    pass


@contextmanager
def _jvm_ignoring_sigterm() -> Iterator[None]:
    """Start Spark's JVM with SIGTERM ignored, as PySpark starts it with SIGINT ignored.

    systemd and Kubernetes send SIGTERM to the whole process group. Had the JVM taken it,
    it would die under a batch in flight while the driver still stops its queries
    (tracebacks from Py4J, Spark's accumulator server and the interrupted batch). Ignored,
    the driver alone handles it: it stops the queries, then Spark, and the JVM with it.
    SIGKILL still takes both, and the JVM exits on its own if the driver dies."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be changed from the main thread
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_spark(settings: Settings, app_name: str = "viewgate-engine",
                extra_java_options: str | None = None) -> SparkSession:
    """The engine's SparkSession. `extra_java_options` go to the driver's JVM (default: the
    class-data archive `viewgate setup` made, engine.class_archive, if there is one)."""
    jars = settings.spark_jar_paths()
    if not any("spark-sql-kafka" in j for j in jars) or not any("delta-spark" in j for j in jars):
        raise MissingJarsError(
            "Spark's Kafka connector and Delta jars were not found "
            f"(looked in {settings.jar_dir / 'spark'}). Run `viewgate setup`, or set "
            "VIEWGATE_SPARK_JARS to a comma-separated list of jar paths."
        )
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Collected Spark rows carry timestamps in the driver process's local time zone (PySpark's
    # TimestampType.fromInternal): run the process in UTC, as Spark's session runs.
    os.environ["TZ"] = "UTC"
    time.tzset()
    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark_master)
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        # Each batch writes only the state rows it changed to the checkpoint, instead of a
        # RocksDB snapshot (snapshots are made in the background); safe on old checkpoints.
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # Checkpoint files (offsets, commits, state changelogs) through Hadoop's FileSystem,
        # not its FileContext: without the native Hadoop library, FileContext's rename on
        # a local disk forks `readlink` for every file (a JVM fork costs tens of ms). On
        # 2 cores a no-op aggregation's batch went from 603 to 350 ms, its walCommit from
        # 82 to 22 ms and its state commit from 79 to 3 ms. One query writes a checkpoint,
        # so FileSystem's rename (not atomic on every store) is safe here; a cluster's
        # object store can set its own manager through VIEWGATE_SPARK_CONF.
        .config("spark.sql.streaming.checkpointFileManagerClass",
                "org.apache.spark.sql.execution.streaming.checkpointing."
                "FileSystemBasedCheckpointFileManager")
        # Small local defaults; a cluster overrides them through VIEWGATE_SPARK_CONF. One
        # state partition per aggregate: each partition costs every batch a state store
        # commit (measured alone on 2 cores: 166 ms with 2 partitions, 57 ms with 1), and
        # the views' queries already keep both cores busy. A checkpoint keeps the number it
        # was created with.
        .config("spark.sql.shuffle.partitions", "1")
        # Every view's query submits jobs to the one driver: share the cores between
        # them instead of letting one query's long job hold the others back.
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.databricks.delta.properties.defaults.enableChangeDataFeed", "true")
        # -Xrs: the JVM installs no SIGTERM handler of its own, so the SIGTERM it inherits
        # ignored (see _jvm_ignoring_sigterm) stays ignored.
        # TieredStopAtLevel=1: the JIT's quick compiler only. Every batch plans small
        # queries whose generated code is new to the JIT; the optimising compiler spent
        # more than half the JVM's CPU recompiling it (its threads' CPU under demo load).
        # A loop of the graph's shape (collect, aggregate, join over local rows, 1,000
        # rows/s) used 30% less JVM CPU and ran twice the batches with it. Without tiers
        # the JVM reserves 48 MiB for compiled code, which a long run filled ("CodeCache
        # is full. Compiler has been disabled"): reserve what tiered compilation does.
        .config("spark.driver.extraJavaOptions",
                "-Dlog4j2.level=WARN -Xrs -XX:TieredStopAtLevel=1 "
                "-XX:ReservedCodeCacheSize=240m " + (
                    java_options(settings) if extra_java_options is None
                    else extra_java_options))
        # Executors on a cluster run the same small generated queries: the same JIT setting.
        .config("spark.executor.extraJavaOptions",
                "-Dlog4j2.level=WARN -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m")
        # Checkpoints keep this many batches (offsets, commits, state versions), no more.
        # Python workers run this interpreter (the project's virtualenv), not whatever
        # `python3` comes first on PATH (PySpark reads PYSPARK_PYTHON, set below).
        .config("spark.pyspark.python", python)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.streaming.minBatchesToRetain",
                str(settings.spark_min_batches_to_retain))
        # Where the views' analyses are kept for the next start (engine.analyzer).
        .config(ANALYSIS_CACHE_CONF, str(settings.cache_dir / "analysis"))
    )
    # s3a:// roots: Spark through S3A; this process's delta-rs and pyarrow through the AWS
    # variables (schema.object_store).
    export_s3_environment(settings)
    for key, value in {**spark_s3_conf(settings), **settings.spark_conf}.items():
        builder = builder.config(key, value)
    with _jvm_ignoring_sigterm():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet(spark, _NOISY_LOGGERS)
    return spark


# Loggers that warn about what is normal here: a batch longer than its trigger interval (the
# next one then starts at once, which is what a busy view should do), and the scheduler pools
# each query creates for itself.
_NOISY_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",
    "org.apache.spark.scheduler.FairSchedulableBuilder",
)


def _quiet(spark: SparkSession, loggers: tuple[str, ...]) -> None:
    jvm = spark.sparkContext._jvm
    level = jvm.org.apache.logging.log4j.Level.ERROR
    for name in loggers:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
