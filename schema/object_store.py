"""Delta tables and checkpoints on object storage (s3a:// roots): one configuration for
the three clients that reach them. Spark reads and writes through Hadoop's S3A (its
`spark.hadoop.fs.s3a.*` options); delta-rs and pyarrow (the engine's MERGEs, the gateway's
reads, the generation pointers) read the AWS variables of their process, which
`export_s3_environment` sets from the settings."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from schema.settings import Settings


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def s3_environment(settings: Settings) -> dict[str, str]:
    """The AWS variables delta-rs (object_store) and pyarrow read, from the settings."""
    if settings.s3_endpoint is None:
        return {}
    values = {
        "AWS_ENDPOINT_URL": settings.s3_endpoint,
        "AWS_REGION": settings.s3_region,
        "AWS_ALLOW_HTTP": "true" if settings.s3_endpoint.startswith("http://") else "false",
    }
    if settings.s3_access_key_id:
        values["AWS_ACCESS_KEY_ID"] = settings.s3_access_key_id
    if settings.s3_secret_access_key:
        values["AWS_SECRET_ACCESS_KEY"] = settings.s3_secret_access_key.get_secret_value()
    return values


def export_s3_environment(settings: Settings) -> None:
    """Set s3_environment in this process; a variable already set in it wins."""
    for name, value in s3_environment(settings).items():
        os.environ.setdefault(name, value)


def spark_s3_conf(settings: Settings) -> dict[str, str]:
    """Hadoop S3A options for an S3-API endpoint of our own (path-style, plain HTTP)."""
    if settings.s3_endpoint is None:
        return {}
    conf = {
        "spark.hadoop.fs.s3a.endpoint": settings.s3_endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": settings.s3_region,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled":
            "false" if settings.s3_endpoint.startswith("http://") else "true",
    }
    if settings.s3_access_key_id and settings.s3_secret_access_key:
        conf["spark.hadoop.fs.s3a.access.key"] = settings.s3_access_key_id
        conf["spark.hadoop.fs.s3a.secret.key"] = settings.s3_secret_access_key.get_secret_value()
    return conf


def _filesystem(uri: str):
    """pyarrow's filesystem for an object's URI, and the object's path within it.

    One filesystem per bucket and AWS environment, kept: each pyarrow filesystem has its
    own HTTP connections, so a new one per call opened a connection per request (a PUT to
    S3Proxy on this host: 16-24 ms against 10-16 on a kept one; on TLS a handshake each)
    and, where no region is set, asked the bucket's region first. The environment is part
    of the key because tests point the same process at several servers."""
    scheme, path = uri.split("://", 1)
    # pyarrow knows s3://, not Hadoop's s3a:// for the same objects.
    scheme = "s3" if scheme == "s3a" else scheme
    bucket = path.split("/", 1)[0]
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return _bucket_filesystem(f"{scheme}://{bucket}", environment), path


@functools.lru_cache(maxsize=16)
def _bucket_filesystem(bucket_uri: str, environment: tuple[tuple[str, str], ...]):
    """`environment` (the AWS variables pyarrow reads) only keys the cache."""
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(bucket_uri)[0]


def read_text(path: str) -> str | None:
    """A small file's text, None if it does not exist."""
    if not is_remote(path):
        try:
            return local_path(path).read_text()
        except FileNotFoundError:
            return None
    fs, key = _filesystem(path)
    try:
        with fs.open_input_stream(key) as stream:
            return stream.read().decode()
    except FileNotFoundError:  # only a missing object: a store that fails must not read as one
        return None


def replace_text(path: str, text: str) -> None:
    """Replace a small file whole, so a reader sees the old or the new text, never half:
    on a local disk by writing a temporary file and renaming it; on object storage by one
    PUT of the object (object stores replace an object atomically and have no rename)."""
    if is_remote(path):
        fs, key = _filesystem(path)
        with fs.open_output_stream(key) as stream:
            stream.write(text.encode())
        return
    _write_local(local_path(path), text.encode(), os.replace)


def subfolders(path: str) -> list[str]:
    """The names of the folders directly under `path` (none if it does not exist); in a
    bucket, the common prefixes under it."""
    if not is_remote(path):
        folder = local_path(path)
        return [c.name for c in folder.iterdir() if c.is_dir()] if folder.is_dir() else []
    import pyarrow.fs

    fs, key = _filesystem(path)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(key, allow_not_found=True))
    return [i.base_name for i in infos if i.type == pyarrow.fs.FileType.Directory]


def delete_tree(path: str) -> None:
    """Delete a folder and everything under it (a bucket's objects under the prefix)."""
    if not is_remote(path):
        shutil.rmtree(local_path(path), ignore_errors=True)
        return
    fs, key = _filesystem(path)
    fs.delete_dir(key)


def filesystem(path: str):
    """pyarrow's filesystem for `path` (a local folder or an s3:// or s3a:// URI) and the
    path within it."""
    if not is_remote(path):
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), str(local_path(path))
    return _filesystem(path)


def read_bytes(path: str) -> bytes:
    """A file's bytes; FileNotFoundError if it does not exist."""
    fs, key = filesystem(path)
    with fs.open_input_file(key) as f:
        return f.read()


def write_new(path: str, data: bytes) -> None:
    """Write a file that must not exist yet (FileExistsError if it does): a Delta log entry.
    On a local disk atomically (a hard link of a finished temporary file fails if the name is
    taken). Object storage without conditional writes in pyarrow: a check, then one PUT;
    safe because each Delta table has one writer (the engine's committer of its view)."""
    if is_remote(path):
        import pyarrow.fs

        fs, key = _filesystem(path)
        if fs.get_file_info(key).type != pyarrow.fs.FileType.NotFound:
            raise FileExistsError(path)
        with fs.open_output_stream(key) as stream:
            stream.write(data)
        return
    _write_local(local_path(path), data, os.link)


def _write_local(target: Path, data: bytes, publish: Callable[[str, Path], None]) -> None:
    """Write a temporary file beside `target`, synced, then `publish` it under its name
    (os.replace: replace whatever is there; os.link: fail if the name is taken)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
