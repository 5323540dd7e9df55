"""The engine's MERGE with deletion vectors: a batch writes its new rows and marks the old
ones, nothing else; every reader sees exactly the rows a plain upsert would leave. Real
Delta tables (delta-rs reads them back); delta-spark reads them in
tests/integration/test_deletion_vectors_spark.py."""

from __future__ import annotations

import json
import random
import re
import struct
import uuid
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyroaring import BitMap

from engine.maintenance import compact, configure_table
from engine.sinks import deletion_vectors as dv
from engine.sinks import dv_merge
from engine.sinks.delta_sink import DeltaSink
from schema import demo
from schema.delta_read import live_row_count, live_rows
from schema.storage import delta_app_id

VIEW = demo.CUSTOMER  # keyed by customer_id
SCHEMA = pa.schema([("customer_id", pa.string()), ("name", pa.string()),
                    ("tier", pa.string()), ("country", pa.string())])


def test_z85_matches_zeromqs_reference_vector():
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert dv.z85_encode(data) == "HelloWorld"
    assert dv.z85_decode("HelloWorld") == data


def _inline(rows: BitMap) -> dict:
    """A vector inline in the log, as viewgate wrote them before 2026-11-26."""
    data = dv.encode_vector(rows)
    return {"storageType": "i", "pathOrInlineDv": dv.z85_encode(data + bytes(-len(data) % 4)),
            "sizeInBytes": len(data), "cardinality": len(rows)}


def test_a_vector_inline_in_the_log_is_read():
    for rows in (BitMap([0, 5, 70_000]), BitMap(range(1000, 3000)), BitMap([7])):
        descriptor = _inline(rows)
        assert descriptor["storageType"] == "i" and descriptor["cardinality"] == len(rows)
        assert len(descriptor["pathOrInlineDv"]) % 5 == 0  # whole Z85 groups
        assert dv.read_inline(descriptor) == rows


def test_a_vector_file_of_delta_spark_is_read():
    """Spark's layout: a version byte, then per vector size, bytes and CRC-32 (big-endian)."""
    first, second = dv.encode_vector(BitMap([1, 2])), dv.encode_vector(BitMap([9]))
    data = bytes([1])
    places = []
    for vector in (first, second):
        places.append((len(data), len(vector)))
        data += struct.pack(">i", len(vector)) + vector + struct.pack(">I", zlib.crc32(vector))
    assert dv.decode_at(data, *places[1]) == BitMap([9])
    assert dv.decode_at(data, *places[0]) == BitMap([1, 2])
    file_id = uuid.uuid4()
    descriptor = {"storageType": "u", "pathOrInlineDv": "ab" + dv.z85_encode(file_id.bytes),
                  "offset": places[1][0], "sizeInBytes": places[1][1], "cardinality": 1}
    assert dv.descriptor_file(descriptor) == f"ab/deletion_vector_{file_id}.bin"
    damaged = bytearray(data)
    damaged[places[1][0] + 10] ^= 0xFF
    with pytest.raises(ValueError, match="damaged"):
        dv.decode_at(bytes(damaged), *places[1])


def _row(n: int, tier: str) -> dict:
    return {"customer_id": f"C{n:06d}", "name": f"n{n}", "tier": tier, "country": "NL"}


def _table(path: str) -> None:
    write_deltalake(path, pa.Table.from_pylist([], SCHEMA),
                    configuration={"delta.enableChangeDataFeed": "true",
                                   "delta.checkpointInterval": "10"})
    configure_table(path, VIEW, target_file_bytes=64 * 1024)


def _contents(path: str) -> dict[str, str]:
    data = live_rows(DeltaTable(path))
    keys = data["customer_id"].to_pylist()
    assert len(keys) == len(set(keys)), "a key is live twice"
    assert live_row_count(DeltaTable(path)) == len(keys)
    return dict(zip(keys, data["tier"].to_pylist(), strict=True))


def _parquet_files(path: str) -> set[str]:
    return {p.name for p in Path(path).glob("*.parquet")}


def test_batches_write_their_rows_and_mark_the_old_ones(tmp_path):
    path = str(tmp_path / "Customer")
    _table(path)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    rng = random.Random(5)
    expected: dict[str, str] = {}
    batch = 0
    for step in range(25):
        new = [_row(n, "gold") for n in range(step * 200, step * 200 + 200)]
        old = [int(k[1:]) for k in expected]
        changed = [_row(n, f"t{step}") for n in rng.sample(old, min(60, len(old)))]
        gone = [{"customer_id": f"C{n:06d}"} for n in rng.sample(old, min(10, len(old)))
                if f"C{n:06d}" not in {r["customer_id"] for r in changed}]
        files_before = _parquet_files(path)
        batch += 1
        assert sink.merge(batch, new + changed, gone, VIEW.key, metadata={"batch_id": batch})
        # One new data file a batch: no file that held an old row was rewritten.
        assert len(_parquet_files(path) - files_before) == 1
        assert files_before <= _parquet_files(path)
        for r in new + changed:
            expected[r["customer_id"]] = r["tier"]
        for d in gone:
            expected.pop(d["customer_id"])
        if step == 12:
            # Maintenance compacts (every file is small here) without the deleted rows;
            # the sink goes on marking rows in the new files.
            sink.maintain(64 * 1024)
            assert _contents(path) == expected
            assert not any(a.get("deletionVector") for a in _adds(path))
        if step == 20:
            # A compaction by another writer (delta-rs's OPTIMIZE, as for tables made
            # before): the sink follows its commit.
            files = len(_adds(path))
            result = compact(path, target_file_bytes=64 * 1024)
            assert result.files_removed > result.files_added >= 1
            assert len(_adds(path)) < files
            assert _contents(path) == expected
    assert _contents(path) == expected
    table = DeltaTable(path)
    assert table.transaction_version(delta_app_id(VIEW.name, 0)) == batch
    assert any(a.get("deletionVector") for a in _adds(path))
    # The log was checkpointed on the way (delta.checkpointInterval: 10), without the
    # tombstones of old vectors: a checkpoint holds the live files, not one remove per
    # file a batch touched.
    checkpoint = json.loads((Path(path) / "_delta_log" / "_last_checkpoint").read_text())
    actions = pq.read_table(Path(path) / "_delta_log" /
                            f"{checkpoint['version']:020d}.checkpoint.parquet")
    removes = actions.column("remove").drop_null().to_pylist()
    live = {a["path"] for a in actions.column("add").drop_null().to_pylist()}
    assert not [r for r in removes if r["path"] in live]

    # A replay of the last batch changes nothing.
    assert not sink.merge(batch, [_row(0, "replayed")], [], VIEW.key,
                          metadata={"batch_id": batch})
    assert _contents(path) == expected

    # A new sink (a restarted engine) reads the files and vectors back from the log,
    # its checkpoint included, and goes on.
    restarted = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    some = sorted(expected)[:30]
    updated, removed = some[:20], some[20:]
    # What Redis held before, for half the keys; the others' pre-images come from Delta.
    previous = {k: {"customer_id": k, "name": "from-redis", "tier": expected[k],
                    "country": "NL"} for k in some[::2]}
    before = dict(expected)
    assert restarted.merge(batch + 1, [_row(int(k[1:]), "after") for k in updated]
                           + [_row(999_999, "new")], [{"customer_id": k} for k in removed],
                           VIEW.key, metadata={"batch_id": batch + 1}, previous=previous)
    for k in updated:
        expected[k] = "after"
    for k in removed:
        expected.pop(k)
    expected["C999999"] = "new"
    assert _contents(path) == expected
    # The change data feed has the batch as Delta's own MERGE writes it: inserts, updates
    # as pre- and post-images, deletes with the row deleted.
    version = DeltaTable(path).version()
    changes = pa.table(DeltaTable(path).load_cdf(starting_version=version))
    by_type: dict[str, dict[str, dict]] = {}
    for change in changes.to_pylist():
        by_type.setdefault(change["_change_type"], {})[change["customer_id"]] = change
    assert set(by_type) == {"insert", "update_preimage", "update_postimage", "delete"}
    assert set(by_type["insert"]) == {"C999999"}
    assert set(by_type["update_postimage"]) == set(by_type["update_preimage"]) == set(updated)
    assert set(by_type["delete"]) == set(removed)
    for k, change in {**by_type["update_preimage"], **by_type["delete"]}.items():
        assert change["tier"] == before[k]
        assert change["name"] == ("from-redis" if k in previous else f"n{int(k[1:])}")
    assert restarted.keys_changed_after(batch) == set(some) | {"C999999"}
    # What the engine reads back for Redis: the live rows of keys, deleted ones absent.
    rows = restarted.rows(some)
    assert set(rows) == set(updated) and all(r["tier"] == "after" for r in rows.values())


def _adds(path: str) -> list[dict]:
    from engine.sinks.delta_log import ActiveFiles

    files = ActiveFiles(path)
    files.load(DeltaTable(path).version())
    return list(files.files.values())


def _vector_files(path: str) -> set[str]:
    return {p.name for p in Path(path).glob("deletion_vector_*.bin")}


def test_vectors_go_to_one_file_per_commit_and_unused_ones_are_deleted_after_the_history(
        tmp_path):
    path = str(tmp_path / "Customer")
    _table(path)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    sink.merge(1, [_row(n, "gold") for n in range(100)], [], VIEW.key, metadata={})
    sink.merge(2, [_row(n, "gold") for n in range(100, 200)], [], VIEW.key, metadata={})
    assert not _vector_files(path)  # inserts mark nothing
    # Batch 3 marks rows in both files: both vectors in one new file, none in the log.
    sink.merge(3, [_row(5, "silver"), _row(105, "silver")], [], VIEW.key, metadata={})
    (first,) = _vector_files(path)
    vectors = [a["deletionVector"] for a in _adds(path) if a.get("deletionVector")]
    assert len(vectors) == 2 and {v["storageType"] for v in vectors} == {"u"}
    assert {dv.descriptor_file(v) for v in vectors} == {first}
    version_with_first = DeltaTable(path).version()
    # Batch 4 marks the first file again: its new vector goes to a second vector file; the
    # first one still holds the second data file's vector, so it stays in use.
    sink.merge(4, [_row(6, "silver")], [], VIEW.key, metadata={})
    second = _vector_files(path) - {first}
    assert len(second) == 1
    # Batch 5 marks the second data file again: nothing uses the first vector file now.
    sink.merge(5, [_row(106, "silver")], [], VIEW.key, metadata={})
    assert len(_vector_files(path)) == 3

    table = DeltaTable(path)
    day = 86_400.0  # the view's history
    clock = [1_000_000.0]
    assert sink._vectors.delete_released_vectors(table, day, lambda: clock[0]) == []
    clock[0] += day - 1  # an older version can still be asked for: it is kept
    assert sink._vectors.delete_released_vectors(table, day, lambda: clock[0]) == []
    old = DeltaTable(path)
    old.load_as_version(version_with_first)
    assert live_row_count(old) == 200
    clock[0] += 1
    assert sink._vectors.delete_released_vectors(table, day, lambda: clock[0]) == [first]
    assert first not in _vector_files(path) and len(_vector_files(path)) == 2
    assert {r: t for r, t in _contents(path).items() if t == "silver"} == {
        "C000005": "silver", "C000006": "silver", "C000105": "silver", "C000106": "silver"}


def test_compaction_rewrites_small_files_and_files_with_many_deleted_rows(tmp_path,
                                                                           monkeypatch):
    path = str(tmp_path / "Customer")
    _table(path)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    target = 16 * 1024
    # Two large files (over half the target: not small) of 1,000 rows each.
    sink.merge(1, [_row(n, "gold") for n in range(1000)], [], VIEW.key, metadata={})
    sink.merge(2, [_row(n, "gold") for n in range(1000, 2000)], [], VIEW.key, metadata={})
    large = {a["path"] for a in _adds(path)}
    assert all(a["size"] >= target // 2 for a in _adds(path))
    # The first loses 30% of its rows (over PURGE_SHARE), the second 5%, in small batches.
    expected = {f"C{n:06d}": "gold" for n in range(2000)}
    batch = 2
    for start in range(0, 300, 50):
        batch += 1
        rows = [_row(n, "silver") for n in range(start, start + 50)]
        gone = [{"customer_id": f"C{1000 + start // 5 + i:06d}"} for i in range(8)]
        sink.merge(batch, rows, gone, VIEW.key, metadata={})
        expected |= {r["customer_id"]: "silver" for r in rows}
        for g in gone:
            expected.pop(g["customer_id"])
    small = {a["path"] for a in _adds(path)} - large
    assert len(small) == 6

    monkeypatch.setattr(dv_merge, "REWRITE_BUDGET_FILES", 4)
    result = sink.compact(target)

    files = {a["path"]: a for a in _adds(path)}
    marked = {p: json.loads(files[p]["stats"])["numRecords"] for p in large if p in files}
    assert len(marked) == 1, "exactly the file with 30% deleted rows was rewritten"
    (kept,) = marked
    assert files[kept]["deletionVector"]["cardinality"] == 48  # its 5%, still marked
    assert result.files_removed == 7  # the six small files and the heavy one
    assert not small & set(files)
    for added in set(files) - large:
        rows = pq.read_table(Path(path) / added)
        keys = rows["customer_id"].to_pylist()
        assert keys == sorted(keys)  # written ordered by key
        assert "deletionVector" not in files[added]
    assert _contents(path) == expected
    # The log says it changed no data: readers of changes skip it.
    version = DeltaTable(path).version()
    assert pa.table(DeltaTable(path).load_cdf(starting_version=version)).num_rows == 0
    # Batches after it find keys in the new files.
    sink.merge(batch + 1, [_row(10, "bronze"), _row(1500, "bronze")], [], VIEW.key,
               metadata={})
    expected |= {"C000010": "bronze", "C001500": "bronze"}
    assert _contents(path) == expected


def test_a_table_without_vectors_keeps_copy_on_write(tmp_path):
    path = str(tmp_path / "Customer")
    write_deltalake(path, pa.Table.from_pylist([_row(n, "gold") for n in range(100)], SCHEMA))
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    assert sink.merge(1, [_row(5, "platinum")], [{"customer_id": "C000006"}], VIEW.key,
                      metadata={"batch_id": 1})
    contents = _contents(path)
    assert len(contents) == 99 and contents["C000005"] == "platinum"
    assert not any(a.get("deletionVector") for a in _adds(path))


def test_the_key_index_finds_every_position_across_folds():
    from engine.sinks.key_index import KeyIndex, encode_keys

    index = KeyIndex(fold_at=2)
    files = {
        "a": ["k1", "k3", "k5"],
        "b": ["k2", "k3", "k0"],  # k3 twice: an old row and its replacement
        "c": ["k9", "a-much-longer-key", "k1"],  # longer than any key of the base
        "d": ["k7"],
    }
    for path, keys in files.items():
        index.add(path, encode_keys(pa.table({"id": keys}), ["id"]))
        # Folds after b (into an empty base) and after d (c and d into that base).
        index.settle()
    index.add("e", encode_keys(pa.table({"id": ["k3"]}), ["id"]))  # recent, not folded
    probe = encode_keys(pa.table({"id": ["k3", "k1", "a-much-longer-key", "k7", "nope"]}),
                        ["id"])
    def found(probe):
        return {path: dict(zip(rows.tolist(), keys.tolist(), strict=True))
                for path, (rows, keys) in index.find(probe).items()}

    assert found(probe) == {"a": {0: b"k1", 1: b"k3"}, "b": {1: b"k3"},
                            "c": {1: b"a-much-longer-key", 2: b"k1"}, "d": {0: b"k7"},
                            "e": {0: b"k3"}}
    index.keep_only(["b", "d", "e"])  # a and c compacted away
    assert "a" not in index and "b" in index
    assert found(probe) == {"b": {1: b"k3"}, "d": {0: b"k7"}, "e": {0: b"k3"}}
    numbers = encode_keys(pa.table({"n": pa.array([5, 3], pa.int32())}), ["n"])
    assert numbers.dtype.kind == "i"


def test_a_read_by_values_applies_vectors_and_quotes_its_values(tmp_path):
    from schema.delta_read import values_filter

    path = str(tmp_path / "Customer")
    _table(path)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    quoted = {**_row(1, "gold"), "customer_id": "O'Brien"}
    sink.merge(1, [_row(0, "gold"), quoted, _row(2, "gold")], [], VIEW.key,
               metadata={"batch_id": 1})
    sink.merge(2, [_row(0, "platinum")], [{"customer_id": "C000002"}], VIEW.key,
               metadata={"batch_id": 2})
    where = values_filter("customer_id", pa.string(), ["C000000", "O'Brien", "C000002"])
    assert where == "\"customer_id\" IN ('C000000', 'O''Brien', 'C000002')"
    rows = live_rows(DeltaTable(path), where).to_pylist()
    assert sorted((r["customer_id"], r["tier"]) for r in rows) == [
        ("C000000", "platinum"), ("O'Brien", "gold")]  # the old C000000 and C000002 marked
    assert values_filter("n", pa.int64(), [3, None]) == '"n" IN (3) OR "n" IS NULL'
    assert values_filter("n", pa.int64(), ["3"]) is None  # text against a number: read all
    assert values_filter("t", pa.timestamp("us"), ["2026-01-01T00:00:00Z"]) is None


def _files(path: str) -> set[str]:
    """Every file of the table but its log."""
    return {str(p.relative_to(path)) for p in Path(path).rglob("*")
            if p.is_file() and "_delta_log" not in p.parts}


def test_a_merge_writes_its_files_before_ready_and_commits_only_after_it(tmp_path):
    """The graph writes a MERGE's files while Redis applies the batch and commits it once
    Redis holds it (engine.graph); a MERGE whose `ready` raises commits and leaves
    nothing, and the batch replayed later commits as if it had never been tried."""
    path = str(tmp_path / "Customer")
    _table(path)
    sink = DeltaSink(path, VIEW, delta_app_id(VIEW.name, 0))
    assert sink.merge(1, [_row(n, "gold") for n in range(10)], [], VIEW.key,
                      metadata={"batch_id": 1})
    version, files = DeltaTable(path).version(), _files(path)
    seen: list[tuple[int, set[str]]] = []

    class Closed(Exception):
        pass

    def refuse() -> None:
        seen.append((DeltaTable(path).version(), _files(path)))
        raise Closed

    # An update, a delete and an insert: a data file, a change-data file and a vector file.
    batch = ([_row(1, "silver"), _row(20, "gold")], [{"customer_id": _row(2, "")["customer_id"]}])
    with pytest.raises(Closed):
        sink.merge(2, *batch, VIEW.key, metadata={"batch_id": 2}, ready=refuse)
    (seen_version, seen_files), = seen
    assert seen_version == version  # nothing committed when `ready` is called ...
    written = sorted(seen_files - files)  # ... though its three files are written
    assert [re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", "U", f) for f in written] == [
        "_change_data/cdc-U.c000.snappy.parquet", "deletion_vector_U.bin",
        "part-00000-U-c000.snappy.parquet"]
    assert DeltaTable(path).version() == version  # ... nor after it refused
    assert _files(path) == files  # and its files are gone
    assert DeltaTable(path).transaction_version(delta_app_id(VIEW.name, 0)) == 1

    opened: list[int] = []
    assert sink.merge(2, *batch, VIEW.key, metadata={"batch_id": 2},
                      ready=lambda: opened.append(DeltaTable(path).version()))
    assert opened == [version]
    assert DeltaTable(path).version() == version + 1
    expected = {_row(n, "")["customer_id"]: "gold" for n in range(10) if n != 2}
    expected |= {"C000001": "silver", "C000020": "gold"}
    assert _contents(path) == expected
