"""Where each key of a Delta table lives: its file and row position.

A MERGE with deletion vectors must name the row positions of the keys it replaces or
deletes. Reading the key column of every file per batch would cost the table's size again,
so each file's keys are read once (when the writer first sees the file; files never change)
and kept sorted, the key's bytes and 8 more a row (KeyIndex: a batch's lookup is a binary
search in each of a few sorted runs, and one per file added since the last fold).

Those runs grow with the table, so they are not kept in the driver's memory: each lives in
an unnamed file of its own (`spill_dir`, the system's temporary folder by default; the file
is gone when the index is), mapped for each lookup and let go after it. The pages a batch
reads stay in the operating system's page cache, which gives them back under pressure;
the driver's own memory no longer grows with the rows of the views (issue 19's soak).
Nor does a fold rewrite the whole table's keys: runs of similar size merge, as in a
log-structured merge tree, so each key is rewritten a few times in all, not once a fold.
"""

from __future__ import annotations

import mmap
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SEPARATOR = "\x1f"  # between the columns of a composite key; not in any sane key
# Entries merged in memory at a time while a fold writes the new run: what a fold costs
# the driver's memory, whatever the table's size (4.5 MB with 10-byte keys).
FOLD_CHUNK = 1 << 18
# A run merges into the one before it once it holds a quarter as many entries: the runs on
# disk shrink by four at least from one to the next, so a lookup searches a few of them
# (5 at 1,600 folds). In all, a key is rewritten about a dozen times, two more per factor of
# four the table grows (measured: 8.4, 11.6 and 13.7 times the index's size written over
# 100, 400 and 1,600 folds), where a single base was rewritten at every fold.
MERGE_RATIO = 4


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


def _entries(keys: np.ndarray, file: int, rows: np.ndarray) -> np.ndarray:
    """One record a row: its key, its file's number and its position, sorted by key. One
    record keeps the three on one page of the spilled run (one page read a key found)."""
    order = np.argsort(keys, kind="stable")
    out = np.empty(len(keys), dtype=_record(keys.dtype))
    out["key"] = keys[order]
    out["file"] = file
    out["row"] = rows[order]
    return out


def _record(key: np.dtype) -> np.dtype:
    # 32 bits for the file number and the row: 16 bytes a row with a 8-byte key.
    return np.dtype([("key", key), ("file", "<i4"), ("row", "<u4")])


def _find(entries: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """The entries whose key is in `probe` (sorted, unique). A file can hold a key more
    than once (an old row and its replacement): all of them."""
    keys = entries["key"]
    if not len(keys) or probe[-1] < keys[0] or probe[0] > keys[-1]:
        return entries[:0]
    low = np.searchsorted(keys, probe, side="left")
    counts = np.searchsorted(keys, probe, side="right") - low
    if not counts.any():
        return entries[:0]
    at = np.repeat(low, counts) + (
        np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    return entries[at]  # a copy: nothing of the mapping outlives the lookup


def _widened(entries: np.ndarray, key: np.dtype) -> np.ndarray:
    """`entries` with keys of dtype `key`: a longer key must not be cut to fit."""
    return entries if entries.dtype["key"] == key else entries.astype(_record(key))


class _SpilledRun:
    """Entries sorted by key in an unnamed file, mapped only while a lookup reads them.
    `files`: how many entries each file number has in it."""

    def __init__(self, chunks: Iterable[np.ndarray], record: np.dtype,
                 spill_dir: str | None, files: Mapping[int, int]) -> None:
        self.record = record
        self.files = dict(files)
        self.count = 0
        self._file: BinaryIO = tempfile.TemporaryFile(dir=spill_dir)
        for chunk in chunks:
            self._file.write(np.ascontiguousarray(chunk).data)
            self.count += len(chunk)
        self._file.flush()

    @property
    def nbytes(self) -> int:
        return self.count * self.record.itemsize

    @contextmanager
    def mapped(self) -> Iterator[np.ndarray]:
        """The run's entries for the span of a `with`; their pages leave the process's
        memory after it (they stay in the page cache). Arrays taken from them may outlive
        it: the mapping is unmapped when the last of them goes."""
        if not self.count:
            yield np.empty(0, dtype=self.record)
            return
        view = mmap.mmap(self._file.fileno(), self.nbytes, prot=mmap.PROT_READ)
        try:
            yield np.frombuffer(view, dtype=self.record, count=self.count)
        finally:
            view.madvise(mmap.MADV_DONTNEED)


def _merge(base: np.ndarray, recent: np.ndarray, dead: np.ndarray) -> Iterator[np.ndarray]:
    """`base` and `recent` (both sorted by key) as one sorted run, in chunks of about
    FOLD_CHUNK entries, without the entries of `dead` files."""
    key = np.result_type(base.dtype["key"], recent.dtype["key"])
    recent = _widened(recent, key)
    at = np.searchsorted(base["key"], recent["key"], side="left")
    taken = 0
    for start in range(0, max(len(base), 1), FOLD_CHUNK):
        end = min(start + FOLD_CHUNK, len(base))
        # The recent entries that go before base[end] (the last chunk: all that are left).
        until = len(at) if end == len(base) else int(np.searchsorted(at, end, side="left"))
        chunk = np.insert(_widened(base[start:end], key), at[taken:until] - start,
                          recent[taken:until])
        taken = until
        if len(dead):
            chunk = chunk[~np.isin(chunk["file"], dead)]
        yield chunk


_LIVE: weakref.WeakSet[KeyIndex] = weakref.WeakSet()


def spilled_bytes_total() -> int:
    """What every key index of this process holds on disk (the soak reports it)."""
    return sum(index.spilled_bytes for index in list(_LIVE))


class KeyIndex:
    """A log-structured merge tree of each file's keys: the files added since the last fold,
    each sorted on its own in memory, and sorted runs on disk (_SpilledRun). Every `fold_at`
    files the recent ones become a new run; runs then merge (in chunks) until each holds
    more than MERGE_RATIO times the entries of the next, and a run half of whose entries
    belong to files compacted away is rewritten without them. Until then lookups skip those
    entries. A lookup costs two binary searches per run and per recent file."""

    def __init__(self, fold_at: int = 32, spill_dir: str | Path | None = None) -> None:
        self.fold_at = fold_at
        self.spill_dir = None if spill_dir is None else str(spill_dir)
        self._paths: list[str | None] = []  # file number -> path (None: gone)
        self._numbers: dict[str, int] = {}
        self._runs: list[_SpilledRun] = []  # the oldest (and largest) first
        self._recent: dict[int, np.ndarray] = {}
        self.written_bytes = 0  # by folds and merges, since the index began
        _LIVE.add(self)

    def __contains__(self, path: str) -> bool:
        return path in self._numbers

    @property
    def spilled_bytes(self) -> int:
        """The runs' size on disk."""
        return sum(run.nbytes for run in self._runs)

    @property
    def runs(self) -> int:
        return len(self._runs)

    def add(self, path: str, keys: np.ndarray) -> None:
        """A file's keys in row order."""
        number = len(self._paths)
        self._paths.append(path)
        self._numbers[path] = number
        self._recent[number] = _entries(keys, number,
                                        np.arange(len(keys), dtype=np.uint32))

    def settle(self) -> None:
        """Fold the recent files into a run once there are `fold_at` of them."""
        if len(self._recent) < self.fold_at:
            return
        key = np.result_type(*(part.dtype["key"] for part in self._recent.values()))
        recent = np.concatenate([_widened(part, key) for part in self._recent.values()])
        recent = recent[np.argsort(recent["key"], kind="stable")]
        files = {number: len(part) for number, part in self._recent.items()}
        self._recent = {}
        self._keep(_SpilledRun([recent], recent.dtype, self.spill_dir, files), len(self._runs))
        self._tidy()

    def _keep(self, run: _SpilledRun, at: int) -> None:
        """`run` in place `at` of the runs, unless it holds nothing."""
        self.written_bytes += run.nbytes
        if run.count:
            self._runs.insert(at, run)

    def _dead(self, run: _SpilledRun) -> int:
        return sum(count for number, count in run.files.items() if self._paths[number] is None)

    def _tidy(self) -> None:
        while True:
            stale = next((i for i, run in enumerate(self._runs)
                          if 2 * self._dead(run) > run.count), None)
            if stale is not None:
                self._keep(self._merged([self._runs.pop(stale)]), stale)
                continue
            small = next((i for i in range(len(self._runs) - 1)
                          if MERGE_RATIO * self._runs[i + 1].count >= self._runs[i].count), None)
            if small is None:
                return
            pair = [self._runs.pop(small), self._runs.pop(small)]
            self._keep(self._merged(pair), small)

    def _merged(self, runs: list[_SpilledRun]) -> _SpilledRun:
        """One run of the entries of `runs` (one or two), without those of files gone."""
        dead = np.array(sorted(n for run in runs for n in run.files if self._paths[n] is None),
                        dtype=np.int32)
        files = {n: c for run in runs for n, c in run.files.items() if self._paths[n] is not None}
        with ExitStack() as stack:
            larger, *smaller = [stack.enter_context(run.mapped())
                                for run in sorted(runs, key=lambda r: -r.count)]
            other = smaller[0] if smaller else larger[:0]
            key = np.result_type(larger.dtype["key"], other.dtype["key"])
            return _SpilledRun(_merge(larger, other, dead), _record(key), self.spill_dir, files)

    def keep_only(self, paths: Iterable[str]) -> None:
        """Forget files no longer in the table (compacted away)."""
        live = {self._numbers[p] for p in paths if p in self._numbers}
        for number in [n for n in self._recent if n not in live]:
            del self._recent[number]
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
        matches = [_find(part, probe) for part in self._recent.values()]
        for run in self._runs:
            with run.mapped() as entries:
                matches.append(_find(entries, probe))
        for entries in matches:
            for number in np.unique(entries["file"]).tolist():
                path = self._paths[number]
                if path is None:
                    continue  # compacted away, still in a run until it is rewritten
                mine = entries[entries["file"] == number]
                found[path] = (mine["row"], mine["key"])  # a file is in one part only
        return found
