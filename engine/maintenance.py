"""Keep a view's Delta table fast and bounded as it grows: maintenance between batches.

A batch's MERGE rewrites only the files whose key range (min and max of the key in the
file's statistics) holds a key the batch changes (see engine.sinks.delta_sink). The
MERGEs themselves widen those ranges: rewritten rows and new rows land in one new file.
So every `delta_maintenance_interval_s` the committer of a view, after one of its batches:
- orders the table by its key into files of `delta_target_file_bytes` (delta-rs z-order
  on the key columns), so each file covers a narrow key range again;
- vacuums the files that no version within the view's `history` needs;
- checkpoints the log and removes log entries older than `history`.

It runs in the committing thread, between two batches, so it never conflicts with a
MERGE; the batch after it waits for it (logged, and in
viewgate_engine_maintenance_seconds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from deltalake import DeltaTable

from schema.catalog import View, parse_duration_ms

log = logging.getLogger("viewgate.engine.maintenance")


def history_seconds(view: View) -> int:
    return parse_duration_ms(view.history) // 1000


def table_properties(view: View, target_file_bytes: int) -> dict[str, str]:
    """The Delta properties maintenance relies on: the file size writers aim at, and how
    long removed files and log entries stay (what `asOf` can reach)."""
    history = f"interval {history_seconds(view)} seconds"
    return {
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


def maintain(path: str, view: View, target_file_bytes: int) -> MaintenanceResult:
    """Order by key, vacuum and checkpoint one view's table; see the module docstring."""
    started = time.monotonic()
    table = DeltaTable(path)
    ordered = table.optimize.z_order(list(view.key), target_size=target_file_bytes)
    vacuumed = table.vacuum(retention_hours=max(1, history_seconds(view) // 3600),
                            dry_run=False, enforce_retention_duration=False)
    table.create_checkpoint()
    table.cleanup_metadata()
    return MaintenanceResult(int(ordered.get("numFilesRemoved", 0)),
                             int(ordered.get("numFilesAdded", 0)), len(vacuumed),
                             time.monotonic() - started)


class MaintenanceSchedule:
    """When a view's table is due: `interval_s` after the committer started, then after
    each run. An interval of 0 never is."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.last = clock()

    def due(self) -> bool:
        return self.interval_s > 0 and self.clock() - self.last >= self.interval_s

    def done(self) -> None:
        self.last = self.clock()
