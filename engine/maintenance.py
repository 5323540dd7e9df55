"""Keep a view's Delta table fast and bounded as it grows: maintenance between batches.

A batch's MERGE writes one small file of its rows and marks the rows they replace in
older files with deletion vectors (engine.sinks.dv_merge). So:
- every `delta_compact_interval_s` the table is compacted (DeltaSink.compact): the small
  files merged, and the files whose vectors mark a large share of their rows rewritten
  without them, into files of `delta_target_file_bytes`. It costs the rows of the files it
  rewrites, not the table's;
- every `delta_maintenance_interval_s`, after a compaction: files no version within the
  view's `history` needs are vacuumed, and so are change-data files and deletion-vector
  files older than it, and data files no version names (a writer killed before its
  commit left them); the log is checkpointed and its entries older than `history`
  removed (`maintain`).
Until 2026-11-26 maintenance also z-ordered the whole table by key: it rewrote every row
every interval, and the history kept each copy for a day (the hour-long soak's disk grew
faster than its rows), so it went. Compaction writes its files ordered by key instead.

It runs beside the batches, in a thread of the view's own (BackgroundMaintenance), started
after one of the view's MERGEs; the view's next MERGE waits for it, so the two never
change the table at once. The batches go on meanwhile: until 2026-11-26 it ran inside the
batch's Delta step, and the whole graph's batch waited for it. Each run is logged and
timed (viewgate_engine_maintenance_seconds); a MERGE's wait for one is in
viewgate_engine_maintenance_wait_seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.fs
from deltalake import DeltaTable

from engine.threads import started_threads
from schema.catalog import View, parse_duration_ms
from schema.object_store import filesystem

log = logging.getLogger("viewgate.engine.maintenance")

# A writer killed between writing a batch's data files and committing them leaves files no
# version names. A batch commits within seconds, so a file unnamed for this long never will
# be, whatever the view's history (which may be seconds): younger ones may be a batch's
# files still being written, by the tasks beside the maintenance (engine.task_delta).
UNREFERENCED_MIN_AGE_S = 3600


def history_seconds(view: View) -> int:
    return parse_duration_ms(view.history) // 1000


def table_properties(view: View, target_file_bytes: int) -> dict[str, str]:
    """The Delta properties maintenance relies on: the file size writers aim at, and how
    long removed files and log entries stay (what `asOf` can reach)."""
    history = f"interval {history_seconds(view)} seconds"
    return {
        # MERGEs mark replaced rows instead of rewriting their files (engine.sinks.dv_merge).
        "delta.enableDeletionVectors": "true",
        "delta.targetFileSize": str(target_file_bytes),
        "delta.deletedFileRetentionDuration": history,
        "delta.logRetentionDuration": history,
    }


def configure_table(path: str, view: View, target_file_bytes: int) -> None:
    """Set the table's properties to the view's declaration, if they differ (one metadata
    commit, which readers and the change data feed ignore)."""
    table = DeltaTable(path)
    wanted = table_properties(view, target_file_bytes)
    current = table.metadata().configuration
    changed = {k: v for k, v in wanted.items() if current.get(k) != v}
    if changed:
        table.alter.set_table_properties(changed, raise_if_not_exists=False)


@dataclass(frozen=True)
class MaintenanceResult:
    files_removed: int
    files_added: int
    files_vacuumed: int
    seconds: float


def compact(path: str, target_file_bytes: int) -> MaintenanceResult:
    """delta-rs's compaction, for tables without deletion vectors (copy-on-write MERGEs
    leave no deleted rows behind, only small files): the small files merged into files of
    the target size."""
    started = time.monotonic()
    merged = DeltaTable(path).optimize.compact(target_size=target_file_bytes)
    return MaintenanceResult(int(merged.get("numFilesRemoved", 0)),
                             int(merged.get("numFilesAdded", 0)), 0,
                             time.monotonic() - started)


def maintain(path: str, view: View) -> MaintenanceResult:
    """Vacuum and checkpoint one view's table; see the module docstring."""
    started = time.monotonic()
    # Checkpoint first: a commit that gives a file a new deletion vector removes the file
    # with its old vector without a deletionTimestamp (engine.sinks.dv_merge), and delta-rs's
    # VACUUM takes such a tombstone as expired, so once compaction removes the file for good
    # it would delete it at once, though versions within the history still read it. A
    # checkpoint drops those tombstones and keeps the compaction's, which carry its time;
    # VACUUM then reads the table from it.
    DeltaTable(path).create_checkpoint()
    table = DeltaTable(path)
    # No retention_hours: delta-rs then keeps removed files for the table's
    # delta.deletedFileRetentionDuration (the view's `history`, table_properties), to the
    # second; an argument would round a history shorter than an hour up to one.
    vacuumed = table.vacuum(dry_run=False)
    vacuumed += delete_old_change_data(path, history_seconds(view))
    vacuumed += delete_unreferenced_data(table, path, history_seconds(view))
    table.cleanup_metadata()
    return MaintenanceResult(0, 0, len(vacuumed), time.monotonic() - started)


def delete_old_change_data(path: str, retention_s: float) -> list[str]:
    """Delete change-data files (`_change_data/`) older than the retention. Each belongs to
    the one commit that wrote it, which the log's cleanup removes after the same retention;
    delta-rs's VACUUM leaves them, so they would pile up forever."""
    fs, folder = filesystem(f"{path.rstrip('/')}/_change_data")
    cutoff = time.time() - retention_s
    old = [info.path for info in fs.get_file_info(pyarrow.fs.FileSelector(
        folder, allow_not_found=True)) if info.type == pyarrow.fs.FileType.File
        and info.mtime is not None and info.mtime.timestamp() < cutoff]
    for file in old:
        fs.delete_file(file)
    return old


def delete_unreferenced_data(table: DeltaTable, path: str, retention_s: float) -> list[str]:
    """Delete the data files at the table's root that no version names, older than the
    retention and than UNREFERENCED_MIN_AGE_S: what a MERGE, or Spark's tasks writing a
    batch's files, left when killed before the commit. delta-rs's full VACUUM finds them,
    but it lists the deletion-vector files the table uses too (delta-rs 1.6), and change
    data: so it is asked for its list only, and only data files are taken from it. Vector
    files and change data have their own deletion (DeletionVectorMerge
    .delete_released_vectors, delete_old_change_data)."""
    listed = table.vacuum(dry_run=True, full=True)
    names = [name for name in listed if "/" not in name and name.endswith(".parquet")]
    if not names:
        return []
    fs, root = filesystem(path)
    cutoff = time.time() - max(retention_s, UNREFERENCED_MIN_AGE_S)
    old = [info.path for info in fs.get_file_info([f"{root}/{name}" for name in names])
           if info.type == pyarrow.fs.FileType.File and info.mtime is not None
           and info.mtime.timestamp() < cutoff]
    for file in old:
        fs.delete_file(file)
    if old:
        log.info("%s: deleted %d data files no version names (left by a writer killed "
                 "before its commit)", path, len(old))
    return old


class MaintenanceSchedule:
    """When a view's table is due: first `(1 - phase) * interval_s` after the committer
    started, then `interval_s` after each run. An interval of 0 never is.

    The graph's views get phases spread over [0, 1) (engine.graph): with one phase, every
    view's compaction fell due in the same batch, and five compactions at once starved the
    next batch of both cores (1.5 to 1.9 s where 0.55 is usual, every interval: most of
    the freshness's p99 in the bench)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic,
                 phase: float = 0.0) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.last = clock() - phase * interval_s

    def due(self) -> bool:
        return self.interval_s > 0 and self.clock() - self.last >= self.interval_s

    def done(self) -> None:
        self.last = self.clock()


class BackgroundMaintenance:
    """One view's maintenance off its batches' path: started after a MERGE, it runs in a
    thread of its own while the graph goes on with its next batches (their Redis apply,
    change feeds, other views' MERGEs). The view's next MERGE waits for it: a compaction
    and a MERGE must not both change the table (a MERGE marking rows in files the
    compaction is rewriting would lose the marks, and both commit the next log version)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: ThreadPoolExecutor | None = None  # started with the first run
        self._running: Future[None] | None = None

    def start(self, work: Callable[[], None]) -> None:
        """Run `work` in the background, after any run still going."""
        self.wait()
        if self._thread is None:
            self._thread = started_threads(1, f"maintenance-{self.name}")
        self._running = self._thread.submit(work)

    def running(self) -> bool:
        return self._running is not None and not self._running.done()

    def wait(self) -> float:
        """Block until the running maintenance, if any, is done; the seconds waited. Its
        failure is its own (`work` logs it): the MERGE after it goes on."""
        running = self._running  # kept: every caller waits for the same run
        if running is None or running.done():
            return 0.0
        started = time.monotonic()
        try:
            running.result()
        except Exception:  # noqa: BLE001 - reported by the work itself
            log.exception("%s: maintenance failed", self.name)
        return time.monotonic() - started


_BACKGROUNDS: dict[str, BackgroundMaintenance] = {}
_BACKGROUNDS_LOCK = threading.Lock()


def background_for(table_path: str, view: str) -> BackgroundMaintenance:
    """The one BackgroundMaintenance of a Delta table in this process: a graph query
    restarted here after a failure gets new committers, whose MERGEs must wait for the
    maintenance the old ones started on the same table."""
    with _BACKGROUNDS_LOCK:
        if table_path not in _BACKGROUNDS:
            _BACKGROUNDS[table_path] = BackgroundMaintenance(view)
        return _BACKGROUNDS[table_path]


def running_maintenance() -> list[str]:
    """The views whose Delta maintenance is running in this process now."""
    with _BACKGROUNDS_LOCK:
        return sorted({b.name for b in _BACKGROUNDS.values() if b.running()})
