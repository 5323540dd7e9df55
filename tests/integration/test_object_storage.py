"""Delta tables, Spark checkpoints and generation pointers on object storage: a real S3-API
server (S3Proxy), reached by Spark through s3a:// and by delta-rs and pyarrow through their
S3 support. The demo engine runs on it, is SIGKILLed and restarted, and every view is exact
in Redis and in Delta; the gateway answers a row Redis lost from the Delta table in the
bucket."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from engine_process import EngineProcess, delta_stats_exact, in_time_events, start_on_customers
from pyspark.sql.types import LongType, StringType, StructField, StructType
from shop_views import expected_customers, isolated, produce, view_mismatches
from ws_clients import GatewayServer

from engine import maintenance
from engine.generations import generation_dirs
from engine.sinks.delta_sink import DeltaSink, ensure_table
from schema import demo
from schema.delta_read import live_rows
from schema.object_store import (
    delete_tree,
    filesystem,
    read_text,
    replace_text,
    s3_environment,
)
from schema.redis_client import connect
from schema.storage import (
    ViewMeta,
    delta_app_id,
    meta_key,
    read_current_generation,
    write_current_generation,
)
from viewgate.stack.process import wait_until
from viewgate.stack.s3proxy import S3ProxyServer

pytestmark = pytest.mark.integration

PREFIX = "objstore"


@pytest.fixture(scope="module")
def s3(base_settings, tmp_path_factory) -> Iterator[S3ProxyServer]:
    server = S3ProxyServer(tmp_path_factory.mktemp("s3proxy"), base_settings.jar_dir / "s3proxy")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3, base_settings, monkeypatch) -> None:
    """This process reads the bucket too (delta-rs and pyarrow read the AWS variables)."""
    settings = base_settings.model_copy(update=s3.settings_update())
    for name, value in s3_environment(settings).items():
        monkeypatch.setenv(name, value)


def test_a_generation_pointer_is_one_object_replaced_whole(s3, s3_env):
    root = "s3a://viewgate/pointers/delta"
    assert read_current_generation(root, "Order") == 0
    write_current_generation(root, "Order", 4)
    write_current_generation(root, "Order", 7)
    assert read_current_generation(root, "Order") == 7


def test_old_generations_in_a_bucket_are_found_and_deleted(s3, s3_env, base_settings):
    settings = base_settings.model_copy(update={
        "delta_root": "s3a://viewgate/gens/delta", "checkpoint_root": "s3a://viewgate/gens/cp"})
    for path in ("gens/delta/Order/g1/part-0.parquet", "gens/delta/Order/g2/_delta_log/0.json",
                 "gens/cp/Order/g1/offsets/0", "gens/delta/Order/_current"):
        replace_text(f"s3a://viewgate/{path}", "x")
    assert sorted(generation_dirs(settings, "Order")) == [1, 2]
    assert len(generation_dirs(settings, "Order")[1]) == 2  # its table and its checkpoint
    delete_tree(generation_dirs(settings, "Order")[1][0])
    delete_tree(generation_dirs(settings, "Order")[1][0])
    assert sorted(generation_dirs(settings, "Order")) == [2]
    assert read_text("s3a://viewgate/gens/delta/Order/_current") == "x"


class NoSpark:
    """A SparkSession that must not be used."""

    def __getattr__(self, name: str):
        raise AssertionError(f"Spark was used: {name}")


def test_a_table_already_in_the_bucket_is_checked_by_delta_rs_not_spark(s3, s3_env):
    """A restart on object storage checks its views' tables without Spark's builder (whose
    Spark jobs took 10.5 s for the demo's five views over S3Proxy, against 0.6 s)."""
    path = "s3a://viewgate/checked/Order/g0"
    columns = StructType([StructField("order_id", StringType()), StructField("amount", LongType())])
    write_deltalake(path, pa.table({"order_id": ["o1"], "amount": [5]}))
    ensure_table(NoSpark(), path, columns)  # there, with these columns: nothing to do
    other = StructType([StructField("order_id", StringType()), StructField("total", LongType())])
    with pytest.raises(AssertionError, match="Spark was used"):
        ensure_table(NoSpark(), path, other)  # other columns: Spark's builder decides
    with pytest.raises(AssertionError, match="Spark was used"):
        ensure_table(NoSpark(), "s3a://viewgate/checked/Missing/g0", columns)


def test_maintenance_deletes_a_killed_writers_data_files_in_a_bucket(s3, s3_env, monkeypatch):
    """Data files no version names (a writer killed before its commit) are found and
    deleted in a bucket as on a disk: delta-rs's full VACUUM lists the bucket, pyarrow's S3
    deletes. One only seconds old is kept (it may be a batch's being written)."""
    view = dataclasses.replace(demo.CUSTOMER, history="1 second")
    schema = pa.schema([(c, pa.string()) for c in ("customer_id", "name", "tier", "country")])
    path = "s3a://viewgate/orphans/Customer/g0"
    write_deltalake(path, pa.Table.from_pylist([], schema),
                    configuration={"delta.enableChangeDataFeed": "true"})
    maintenance.configure_table(path, view, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, view, delta_app_id(view.name, 0))
    for batch in (1, 2):
        rows = [{"customer_id": f"C{n}", "name": "n", "tier": f"t{batch}", "country": "NL"}
                for n in range(batch * 10, batch * 10 + 20)]
        sink.merge(batch, rows, [], view.key, metadata={"batch_id": batch})
    fs, root = filesystem(path)
    orphan = f"{root}/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(pa.Table.from_pylist([], schema), orphan, filesystem=fs)
    rows_before = live_rows(DeltaTable(path)).sort_by("customer_id")

    def exists() -> bool:
        return fs.get_file_info(orphan).type == pyarrow.fs.FileType.File

    maintenance.maintain(path, view)
    assert exists()  # younger than an hour
    monkeypatch.setattr(maintenance, "UNREFERENCED_MIN_AGE_S", 0)

    def deleted() -> bool:
        maintenance.maintain(path, view)
        return not exists()
    wait_until(deleted, timeout_s=30, what="the unreferenced file deleted")
    assert live_rows(DeltaTable(path)).sort_by("customer_id") == rows_before
    assert rows_before.num_rows == 30


def test_the_demo_on_object_storage_survives_a_sigkill(s3, s3_env, settings, tmp_path):
    root = "s3a://viewgate/demo"
    settings = isolated(settings, tmp_path / "data", redis_db=25).model_copy(update={
        "delta_root": f"{root}/delta", "checkpoint_root": f"{root}/checkpoints",
        **s3.settings_update()})
    storage_env = {"VIEWGATE_DELTA_ROOT": settings.delta_root,
                   "VIEWGATE_CHECKPOINT_ROOT": settings.checkpoint_root, **s3.env()}
    client = connect(settings.redis_url)
    client.flushdb()  # a database no other test uses, emptied: the views start from nothing
    engine = EngineProcess(settings, tmp_path, PREFIX, **storage_env)
    gateway = GatewayServer(settings, tmp_path, PREFIX, **storage_env)
    customers, orders = in_time_events(PREFIX, 1200)
    halves = orders[: len(orders) // 2], orders[len(orders) // 2:]
    try:
        start_on_customers(engine, customers)
        produce(settings.kafka_bootstrap, halves[0])
        wait_until(lambda: view_mismatches(client, customers, halves[0]) == [], timeout_s=300,
                   what="every view to match the first half")
        engine.kill()  # the checkpoint in the bucket says where to start again
        produce(settings.kafka_bootstrap, halves[1])
        engine.start()
        wait_until(lambda: view_mismatches(client, customers, orders) == [], timeout_s=300,
                   what="every view to match all orders after the restart")
        wait_until(lambda: delta_stats_exact(settings, orders), timeout_s=120,
                   what="CustomerStats in the bucket to count every order once")
        # The batch's Kafka offsets, read from the checkpoint in the bucket, are in the meta.
        offsets = ViewMeta.from_fields(client.hgetall(meta_key("Order"))).offsets
        assert sum(offsets[f"{PREFIX}.orders"].values()) == len(orders), offsets

        # With Redis emptied, the gateway answers from the Delta table in the bucket.
        gateway.start()
        key, row = sorted(expected_customers(customers).items())[0]
        client.flushdb()
        answer = gateway.query(f'{{ customer(customerId: "{key}") {{ customerId name }} }}')
        assert answer["data"]["customer"] == {"customerId": key, "name": row["name"]}, \
            json.dumps(answer)
        assert answer["extensions"]["freshness"]["Customer"]["source"] == "delta"
    finally:
        gateway.stop()
        engine.stop()
        client.close()
