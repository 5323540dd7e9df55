"""The views' analyses kept across starts (engine.analyzer), with real Spark: a start that
reads them gets the schemas and lineages Spark's analyzer gives, without asking it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException

from engine import analyzer
from engine.analysis import analyse
from engine.analyzer import ANALYSIS_CACHE_CONF, SQL_LOCK, analysed
from engine.lineage import lineage
from schema.catalog import ViewKind
from schema.demo import CATALOG

pytestmark = pytest.mark.integration


@contextmanager
def kept_in(spark, folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Analyses kept in `folder`, this process remembering none so far."""
    monkeypatch.setattr(analyzer, "_answers", {})
    before = spark.conf.get(ANALYSIS_CACHE_CONF, None)
    spark.conf.set(ANALYSIS_CACHE_CONF, str(folder))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(ANALYSIS_CACHE_CONF)
        else:
            spark.conf.set(ANALYSIS_CACHE_CONF, before)


def test_a_restart_reads_the_demos_analysis_without_spark(spark, tmp_path, monkeypatch):
    with kept_in(spark, tmp_path, monkeypatch):
        first = analyse(spark, CATALOG)
    assert len(list(tmp_path.glob("*.json"))) == len(CATALOG.views)

    def refused(*_args, **_kwargs):
        raise AssertionError("Spark analysed a view whose analysis was kept")

    with kept_in(spark, tmp_path, monkeypatch):  # as a new process would
        with monkeypatch.context() as no_spark:
            no_spark.setattr(spark, "sql", refused)
            no_spark.setattr(spark, "createDataFrame", refused)
            again = analyse(spark, CATALOG)
            tables = {v.name: analysed(spark, v.sql, {n: first[n] for n in v.reads})
                      for v in CATALOG.views.values() if v.kind is ViewKind.TABLE}
    assert again == first
    assert tables
    for name, kept in tables.items():
        view = CATALOG.views[name]
        with SQL_LOCK:
            for upstream in view.reads:
                spark.createDataFrame([], first[upstream]).createOrReplaceTempView(upstream)
            assert kept.lineage == lineage(spark, view.sql), name


def test_an_analysis_that_fails_is_not_kept(spark, tmp_path, monkeypatch):
    with kept_in(spark, tmp_path, monkeypatch):
        with pytest.raises(AnalysisException):
            analysed(spark, "SELECT no_such_column FROM t", {"t": "order_id STRING"})
    assert not list(tmp_path.iterdir())


def test_an_unreadable_answer_is_analysed_again(spark, tmp_path, monkeypatch):
    sql = "SELECT order_id, amount * 2 AS twice FROM t"
    inputs = {"t": "order_id STRING, amount DOUBLE"}
    with kept_in(spark, tmp_path, monkeypatch):
        first = analysed(spark, sql, inputs)
    [kept] = tmp_path.glob("*.json")
    kept.write_text("{")
    with kept_in(spark, tmp_path, monkeypatch):
        again = analysed(spark, sql, inputs)
    assert again.schema == first.schema
    assert [f.name for f in again.schema.fields] == ["order_id", "twice"]
    assert analyzer._read(kept) is not None  # written whole again
