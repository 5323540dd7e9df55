"""The deletion-vector writer's key index (engine.sinks.key_index): every position of every
key found, across folds, compactions and keys of growing length; its base on disk, not in
the driver's memory."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from engine.sinks import key_index
from engine.sinks.key_index import KeyIndex, encode_keys


def _found(index: KeyIndex, keys: list) -> dict[str, set[tuple[int, object]]]:
    probe = encode_keys(pa.table({"k": keys}), ["k"])
    return {path: set(zip(rows.tolist(), found.tolist(), strict=True))
            for path, (rows, found) in index.find(probe).items()}


@pytest.mark.parametrize("kind", ["text", "integer"])
def test_random_files_folds_and_compactions_agree_with_a_plain_model(tmp_path, monkeypatch,
                                                                      kind):
    # Folds written three entries at a time: every chunk boundary of the merge is crossed.
    monkeypatch.setattr(key_index, "FOLD_CHUNK", 3)
    rng = random.Random(7 if kind == "text" else 8)

    def a_key():
        n = rng.randrange(60)
        return n if kind == "integer" else "k" * rng.randrange(1, 4) + str(n)  # lengths vary

    index = KeyIndex(fold_at=3, spill_dir=tmp_path)
    model: dict[str, list] = {}  # live file -> its keys in row order
    for step in range(80):
        if model and rng.random() < 0.2:  # a compaction: some files go, one comes
            gone = rng.sample(sorted(model), rng.randrange(1, len(model) + 1))
            for path in gone:
                del model[path]
            index.keep_only(model)
        path = f"f{step}"
        model[path] = [a_key() for _ in range(rng.randrange(0, 6))]
        index.add(path, encode_keys(pa.table({"k": model[path]}, ), ["k"])
                  if model[path] else np.empty(0, dtype=np.int64 if kind == "integer"
                                               else np.bytes_))
        index.settle()
        probe = sorted({a_key() for _ in range(12)} | {k for keys in model.values()
                                                       for k in keys[:1]})

        def encoded(k):
            return k if kind == "integer" else k.encode()

        expected = {p: {(row, encoded(k)) for row, k in enumerate(keys) if k in probe}
                    for p, keys in model.items()}
        assert _found(index, probe) == {p: hits for p, hits in expected.items() if hits}
    assert index.spilled_bytes > 0  # folds happened


def test_the_base_lives_in_an_unnamed_file_mapped_only_during_a_lookup(tmp_path):
    index = KeyIndex(fold_at=1, spill_dir=tmp_path)
    keys = np.arange(100_000, dtype=np.int64)
    index.add("a", keys)
    index.settle()
    assert index.spilled_bytes == 100_000 * 16  # 8-byte key, file number, row
    assert list(tmp_path.iterdir()) == []  # no name: nothing is left behind by a crash

    def mapped_from_spill_dir() -> list[str]:
        return [line for line in Path("/proc/self/maps").read_text().splitlines()
                if str(tmp_path) in line]

    assert _found(index, [5, 99_999, 100_000]) == {"a": {(5, 5), (99_999, 99_999)}}
    assert mapped_from_spill_dir() == []
    # A fold merges the recent files into a new run; the old one is freed with its file.
    index.add("b", np.array([5, 7], dtype=np.int64))
    index.settle()
    assert index.spilled_bytes == 100_002 * 16
    assert _found(index, [5, 7]) == {"a": {(5, 5), (7, 7)}, "b": {(0, 5), (1, 7)}}
    index.keep_only(["b"])
    assert _found(index, [5, 7]) == {"b": {(0, 5), (1, 7)}}  # before the next fold, too
    index.add("c", np.array([1], dtype=np.int64))
    index.settle()
    assert index.spilled_bytes == 3 * 16  # a's entries dropped by that fold


def test_runs_merge_by_size_so_a_fold_does_not_rewrite_the_whole_index(tmp_path):
    # 400 files of 1,000 keys, a fold after each: the old single base was rewritten whole
    # at every fold (about 200 times the final size in all).
    index = KeyIndex(fold_at=1, spill_dir=tmp_path)
    for file in range(400):
        index.add(f"f{file}", np.arange(file * 1_000, (file + 1) * 1_000, dtype=np.int64))
        index.settle()
        assert index.runs <= 6  # each run more than four times the next: a few of them
    final = 400_000 * 16
    assert index.spilled_bytes == final
    # Each key rewritten about a dozen times (two more per factor of four the table grows;
    # measured 11.6 here), not 200.
    assert index.written_bytes < 16 * final
    assert _found(index, [0, 123_456, 399_999]) == {
        "f0": {(0, 0)}, "f123": {(456, 123_456)}, "f399": {(999, 399_999)}}
    # Files compacted away: a run half made of them is rewritten without them.
    index.keep_only([f"f{file}" for file in range(300, 400)])
    index.add("new", np.array([5], dtype=np.int64))
    index.settle()
    assert index.spilled_bytes == (100_000 + 1) * 16
    assert _found(index, [5, 350_000]) == {"new": {(0, 5)}, "f350": {(0, 350_000)}}
