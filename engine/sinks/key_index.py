"""Where each key of a Delta table lives: its file and row position.

A MERGE with deletion vectors must name the row positions of the keys it replaces or
deletes. Reading the key column of every file per batch would cost the table's size again,
so each file's keys are read once (when the writer first sees the file; files never change)
and kept sorted in NumPy, the key's bytes and 8 more a row (KeyIndex: a batch's lookup is
a binary search in one array for most files and one per file added since).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SEPARATOR = "\x1f"  # between the columns of a composite key; not in any sane key


def encode_keys(data: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """The key of each row, as a sortable NumPy array (integers stay integers)."""
    if len(columns) == 1:
        column = data.column(columns[0])
        if pa.types.is_integer(column.type):
            return column.to_numpy().astype(np.int64)
        text = pc.cast(column, pa.string())
    else:
        text = pc.binary_join_element_wise(
            *(pc.cast(data.column(c), pa.string()) for c in columns), _SEPARATOR)
    return np.array(pc.cast(text, pa.binary()).to_pylist(), dtype=np.bytes_)


@dataclass(frozen=True)
class _Keys:
    """Keys sorted, with the file (a number) and row position each one is at."""

    keys: np.ndarray
    files: np.ndarray
    rows: np.ndarray

    def find(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(files, rows, keys) of every entry whose key is in `probe` (sorted, unique). A
        file can hold a key more than once (an old row and its replacement): all of them."""
        if not len(self.keys) or probe[-1] < self.keys[0] or probe[0] > self.keys[-1]:
            return _NONE, _NONE, _NONE
        low = np.searchsorted(self.keys, probe, side="left")
        counts = np.searchsorted(self.keys, probe, side="right") - low
        if not counts.any():
            return _NONE, _NONE, _NONE
        at = np.repeat(low, counts) + (
            np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
        return self.files[at], self.rows[at], self.keys[at]


_NONE = np.empty(0, dtype=np.int32)


class KeyIndex:
    """Two levels, as an LSM tree: the base (every file up to the last fold, one sorted
    array) and the files added since, each sorted on its own. A lookup costs two binary
    searches in the base and two per recent file; every `fold_at` files the recent ones
    are merged into the base (a copy of the base's arrays, milliseconds at 2 million keys)."""

    def __init__(self, fold_at: int = 32) -> None:
        self.fold_at = fold_at
        self._paths: list[str | None] = []  # file number -> path (None: gone)
        self._numbers: dict[str, int] = {}
        self._base = _Keys(np.empty(0, dtype=np.int64), _NONE, _NONE)
        self._base_numbers: set[int] = set()
        self._recent: dict[int, _Keys] = {}

    def __contains__(self, path: str) -> bool:
        return path in self._numbers

    def add(self, path: str, keys: np.ndarray) -> None:
        """A file's keys in row order."""
        number = len(self._paths)
        self._paths.append(path)
        self._numbers[path] = number
        order = np.argsort(keys, kind="stable")
        # 32 bits for the file number and the row: 16 bytes a row with a 10-byte key.
        self._recent[number] = _Keys(keys[order], np.full(len(keys), number, dtype=np.int32),
                                     order.astype(np.uint32))

    def settle(self) -> None:
        """Fold the recent files into the base once there are `fold_at` of them."""
        if len(self._recent) < self.fold_at:
            return
        base = self._base
        if not len(base.keys):
            parts = list(self._recent.values())
            keys = np.concatenate([p.keys for p in parts])
            order = np.argsort(keys, kind="stable")
            base = _Keys(keys[order], np.concatenate([p.files for p in parts])[order],
                         np.concatenate([p.rows for p in parts])[order])
        else:
            for part in self._recent.values():
                at = np.searchsorted(base.keys, part.keys)
                # Widen the base's strings first: np.insert would cut longer keys to fit.
                wide = base.keys.astype(np.result_type(base.keys, part.keys), copy=False)
                base = _Keys(np.insert(wide, at, part.keys),
                             np.insert(base.files, at, part.files),
                             np.insert(base.rows, at, part.rows))
        self._base = base
        self._base_numbers |= set(self._recent)
        self._recent = {}

    def keep_only(self, paths: Iterable[str]) -> None:
        """Forget files no longer in the table (compacted away)."""
        live = {self._numbers[p] for p in paths if p in self._numbers}
        for number in [n for n in self._recent if n not in live]:
            del self._recent[number]
        dropped = self._base_numbers - live
        if dropped:
            keep = ~np.isin(self._base.files, list(dropped))
            self._base = _Keys(self._base.keys[keep], self._base.files[keep],
                               self._base.rows[keep])
            self._base_numbers -= dropped
        for path, number in list(self._numbers.items()):
            if number not in live:
                del self._numbers[path]
                self._paths[number] = None  # a slot a file ever seen, not its name

    def find(self, keys: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per file, the row positions holding any of `keys` and the key at each (deleted
        rows included: the caller subtracts each file's deletion vector)."""
        probe = np.unique(keys)
        found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if not len(probe):
            return found
        for part in [self._base, *self._recent.values()]:
            files, rows, matched = part.find(probe)
            for number in np.unique(files):
                path = self._paths[number]
                mine = files == number
                found[path] = (rows[mine], matched[mine])  # a file is in one part only
        return found
