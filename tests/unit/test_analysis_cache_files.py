"""The analyses kept across starts (engine.analyzer): named by everything the answer
depends on, read back without Spark, and removed once no start has read them for long."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from engine import analyzer
from engine.analyzer import ANALYSIS_CACHE_CONF, KEPT_S, analysed

SCHEMA = StructType([StructField("order_id", StringType())])
PLAN = json.dumps([{"class": "org.apache.spark.sql.catalyst.plans.logical.Project"}])


class _Conf:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get(self, key: str, default: str | None = None) -> str | None:
        return str(self.folder) if key == ANALYSIS_CACHE_CONF else default


class _NoSpark:
    """A session whose only working part is its conf: a kept answer needs no more."""

    def __init__(self, folder: Path) -> None:
        self.conf = _Conf(folder)

    def __getattr__(self, name: str):
        raise AssertionError(f"Spark was asked ({name}) for an analysis kept on disk")


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(analyzer, "_answers", {})


def _keep(folder: Path, sql: str, inputs: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{analyzer._digest(sql, inputs)}.json"
    path.write_text(json.dumps({"schema": SCHEMA.jsonValue(), "plan": PLAN}))
    return path


def test_a_kept_analysis_is_read_without_spark(tmp_path: Path) -> None:
    inputs = {"orders": "order_id STRING"}
    _keep(tmp_path, "SELECT order_id FROM orders", inputs)
    found = analysed(_NoSpark(tmp_path), "SELECT order_id FROM orders", inputs)
    assert found.schema == SCHEMA
    assert found.plan_json == PLAN


def test_the_name_covers_the_sql_the_inputs_and_their_schemas() -> None:
    base = analyzer._digest("SELECT * FROM t", {"t": SCHEMA})
    assert base == analyzer._digest("SELECT * FROM t", {"t": SCHEMA.json()})
    assert base != analyzer._digest("SELECT * FROM u", {"t": SCHEMA})
    assert base != analyzer._digest("SELECT * FROM t", {"u": SCHEMA})
    assert base != analyzer._digest("SELECT * FROM t", {"t": "order_id INT"})
    assert base != analyzer._digest("SELECT * FROM t", {"t": SCHEMA, "u": SCHEMA})


def test_an_unreadable_file_is_no_answer(tmp_path: Path) -> None:
    path = _keep(tmp_path, "SELECT 1", {})
    path.write_text('{"schema": ')  # cut short
    assert analyzer._read(path) is None
    path.write_text(json.dumps({"plan": PLAN}))  # from another format
    assert analyzer._read(path) is None


def test_writing_removes_what_no_start_read_for_long(tmp_path: Path) -> None:
    old = _keep(tmp_path, "SELECT 1", {})
    recent = _keep(tmp_path, "SELECT 2", {})
    long_ago = time.time() - KEPT_S - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(recent, (long_ago, long_ago))
    assert analyzer._read(recent) is not None  # a start reads it: kept longer
    analyzer._write(tmp_path, "new", analyzer.Analysed(SCHEMA, PLAN))
    assert not old.exists()
    assert recent.exists()
    assert analyzer._read(tmp_path / "new.json") == analyzer.Analysed(SCHEMA, PLAN)
    assert not list(tmp_path.glob("*.partial"))
