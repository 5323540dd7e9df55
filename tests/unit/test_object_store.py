"""How the settings reach the three S3 clients, and small files replaced whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from schema.object_store import is_remote, read_text, replace_text, s3_environment, spark_s3_conf
from schema.settings import Settings


def test_no_endpoint_configures_nothing() -> None:
    assert s3_environment(Settings()) == {} and spark_s3_conf(Settings()) == {}


def test_an_endpoint_reaches_delta_rs_pyarrow_and_spark() -> None:
    settings = Settings(s3_endpoint="http://store:9000", s3_access_key_id="id",
                        s3_secret_access_key=SecretStr("secret"), s3_region="eu-west-1")
    assert s3_environment(settings) == {
        "AWS_ENDPOINT_URL": "http://store:9000", "AWS_REGION": "eu-west-1",
        "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}
    conf = spark_s3_conf(settings)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://store:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.secret.key"] == "secret"
    tls = Settings(s3_endpoint="https://s3.example")
    assert s3_environment(tls)["AWS_ALLOW_HTTP"] == "false"
    assert "spark.hadoop.fs.s3a.access.key" not in spark_s3_conf(tls)  # AWS's own chain


def test_a_local_file_is_replaced_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "v" / "_current")
    assert read_text(path) is None
    replace_text(path, "1\n")
    replace_text(f"file://{path}", "2\n")
    assert read_text(path) == "2\n"
    assert [p.name for p in (tmp_path / "v").iterdir()] == ["_current"]
    assert is_remote("s3a://bucket/x") and not is_remote(path) and not is_remote(f"file://{path}")


def test_a_new_file_is_written_once(tmp_path):
    from schema.object_store import read_bytes, write_new

    path = str(tmp_path / "_delta_log" / "00000000000000000001.json")
    write_new(path, b"first")
    with pytest.raises(FileExistsError):
        write_new(path, b"second")
    assert read_bytes(path) == b"first"
    assert [p.name for p in (tmp_path / "_delta_log").iterdir()] == [
        "00000000000000000001.json"]  # no temporary file left behind


def test_a_bucket_s_filesystem_is_kept_while_the_environment_holds(monkeypatch):
    """One pyarrow filesystem per bucket and AWS environment: a new one per call opened a
    new connection for every request. Pointed elsewhere, the process gets a new one."""
    from schema.object_store import filesystem

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")  # no region lookup: nothing is reached
    first, path = filesystem("s3a://bucket/delta/Order/g0/_delta_log/0.json")
    assert path == "bucket/delta/Order/g0/_delta_log/0.json"
    again, _ = filesystem("s3://bucket/checkpoints/x")
    assert again is first
    other_bucket, other_path = filesystem("s3a://other/y")
    assert other_bucket is not first and other_path == "other/y"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")
    elsewhere, _ = filesystem("s3a://bucket/delta/Order/g0/_delta_log/0.json")
    assert elsewhere is not first
