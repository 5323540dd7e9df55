"""The class-data archive's name follows what the JVM checks before it maps one: a jar that
changed (a virtualenv made again at the same path) needs an archive of its own."""

import json
import os

from engine.class_archive import archive_path
from schema.settings import Settings


def test_a_jar_with_a_new_time_or_size_names_a_new_archive(tmp_path):
    jar = tmp_path / "connector.jar"
    jar.write_bytes(b"jar")
    settings = Settings(spark_jars=str(jar), cache_dir=tmp_path / "cache")
    first = archive_path(settings)
    assert archive_path(settings) == first  # stable while nothing changes

    stat = jar.stat()
    os.utime(jar, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    touched = archive_path(settings)
    assert touched != first

    jar.write_bytes(b"a longer jar")
    os.utime(jar, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert archive_path(settings) not in {first, touched}
    assert archive_path(settings).parent == tmp_path / "cache" / "jvm"


def test_building_an_archive_deletes_those_whose_jars_changed(tmp_path):
    from engine.class_archive import _digest, _inputs, prune_stale_archives

    jar = tmp_path / "connector.jar"
    jar.write_bytes(b"jar")
    settings = Settings(spark_jars=str(jar), cache_dir=tmp_path / "cache")
    folder = tmp_path / "cache" / "jvm"
    folder.mkdir(parents=True)
    current = archive_path(settings)
    current.write_bytes(b"archive")
    current.with_suffix(".json").write_text(json.dumps(_inputs(settings)))
    unrecorded = folder / "spark-0123456789abcdef.jsa"  # made before inputs were kept
    unrecorded.write_bytes(b"old")

    other = tmp_path / "other.jar"  # another virtualenv's archive, still good
    other.write_bytes(b"other")
    kept_inputs = _inputs(Settings(spark_jars=str(other)))
    kept = folder / f"spark-{_digest(kept_inputs)}.jsa"
    kept.write_bytes(b"kept")
    kept.with_suffix(".json").write_text(json.dumps(kept_inputs))

    assert prune_stale_archives(settings) == [unrecorded]
    assert current.is_file() and kept.is_file()

    other.write_bytes(b"other, installed again")  # that virtualenv made again
    assert prune_stale_archives(settings) == [kept]
    assert not kept.with_suffix(".json").exists()
    assert current.is_file()


def test_an_archive_from_an_older_warm_up_is_made_again_and_pruned(tmp_path, monkeypatch):
    """The archive holds only what its warm-up loaded: a warm-up that loads more (the read
    through a broker) names a new archive, and the older one is deleted."""
    from engine import class_archive
    from engine.class_archive import _inputs, prune_stale_archives

    jar = tmp_path / "connector.jar"
    jar.write_bytes(b"jar")
    settings = Settings(spark_jars=str(jar), cache_dir=tmp_path / "cache")
    monkeypatch.setattr(class_archive, "WARM_UP", 1)
    older = archive_path(settings)
    older.parent.mkdir(parents=True)
    older.write_bytes(b"archive")
    older.with_suffix(".json").write_text(json.dumps(_inputs(settings)))

    monkeypatch.setattr(class_archive, "WARM_UP", 2)
    assert archive_path(settings) != older
    assert prune_stale_archives(settings) == [older]
    assert not older.with_suffix(".json").exists()
