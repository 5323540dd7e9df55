"""The class archive's warm-up reads as the engine does (engine.class_archive.warm_up_read):
through a real broker, so that the archive holds the Kafka client's classes; with real
Spark."""

from __future__ import annotations

import pytest

from engine.class_archive import warm_up_read
from engine.graph import graph_sources
from schema.demo import CATALOG

pytestmark = pytest.mark.integration


def test_the_warm_up_reads_every_kind_of_record_through_the_broker(spark, settings, tmp_path):
    records = 12
    read = warm_up_read(spark, settings, str(tmp_path / "checkpoint"), records=records)
    # Per source: its records (one malformed) and a tombstone, all in the one batch.
    assert read == len(graph_sources(CATALOG)) * (records + 1)
