"""What the engine keeps as it runs, sampled during the soak: the Delta tables' bytes on disk
and rows (and the bytes by kind: log, change data, deletion vectors, data files), the Spark
checkpoints' bytes, Redis's memory and keys, and each view's last batch
duration. A run of months must keep these flat per row (Delta, Redis) or flat (checkpoints,
batch time): `flatness` compares the start of a soak with its end."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import redis
from deltalake import DeltaTable

from schema.catalog import Catalog
from schema.delta_read import live_row_count
from schema.settings import Settings
from schema.storage import ViewMeta, delta_table_path, meta_key

FLAT_LIMIT = 0.20  # the goal: start and end within 20 percent


def _bytes_under(location: str) -> int:
    return sum(_bytes_by_kind(location).values())


def _bytes_by_kind(location: str) -> dict[str, int]:
    """Bytes on disk under `location` by what they are: the Delta log, change data,
    deletion vectors, and the rest (data files; a Spark checkpoint's files)."""
    kinds = dict.fromkeys(("log", "change_data", "vectors", "data"), 0)
    root = Path(location.removeprefix("file://"))
    if "://" in location and not location.startswith("file://") or not root.exists():
        return kinds  # object storage: not sampled
    for file in root.rglob("*"):
        parts = file.relative_to(root).parts
        kind = ("log" if "_delta_log" in parts else "change_data" if "_change_data" in parts
                else "vectors" if file.name.startswith("deletion_vector_") else "data")
        kinds[kind] += _file_bytes(file)
    return kinds


def _file_bytes(path: Path) -> int:
    """A file's size; 0 for a folder, and for a file gone since it was listed (Spark and
    Delta write temporary files and rename them: an hour's soak once failed on one)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return 0
    return stat.st_size if path.is_file() else 0


def _delta_rows(settings: Settings, view: str) -> tuple[int, int]:
    """(live rows, bytes of the data files of the latest version) of the view's table."""
    try:
        table = DeltaTable(delta_table_path(settings.delta_location, view, 0))
    except Exception:  # noqa: BLE001 - not created yet
        return 0, 0
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes")
    # Rows: not the files' statistics, which count deleted rows too.
    return live_row_count(table), int(pc.sum(sizes).as_py() or 0)


def sample(settings: Settings, catalog: Catalog, client: redis.Redis) -> dict[str, float]:
    """One sample of what the engine holds (see the module docstring)."""
    tables = [_delta_rows(settings, view) for view in catalog.views]
    rows = sum(count for count, _ in tables)
    live_bytes = sum(size for _, size in tables)
    kinds = _bytes_by_kind(settings.delta_location)
    delta_bytes = sum(kinds.values())
    memory = int(client.info("memory")["used_memory"])
    batch_ms = [ViewMeta.from_fields(client.hgetall(meta_key(v))).batch_ms
                for v in catalog.views]
    return {
        "delta_rows": rows,
        "delta_bytes": delta_bytes,
        "delta_bytes_per_row": delta_bytes / rows if rows else 0.0,
        **{f"delta_{kind}_bytes": size for kind, size in kinds.items()},
        # The latest version's data files only: what the table costs without the `history`
        # kept for `asOf` (and without its deletion vectors, at most a bit a row).
        "delta_live_data_bytes_per_row": live_bytes / rows if rows else 0.0,
        "checkpoint_bytes": _bytes_under(settings.checkpoint_location),
        "redis_used_bytes": memory,
        "redis_bytes_per_row": memory / rows if rows else 0.0,
        "batch_ms": max(batch_ms, default=0),
    }


# The series that must stay flat (per row where the data grows with the traffic).
FLAT_SERIES = ("delta_bytes_per_row", "delta_live_data_bytes_per_row", "checkpoint_bytes",
               "redis_bytes_per_row", "batch_ms")


def flatness(samples: Sequence[tuple[float, Mapping[str, float]]], duration_s: float,
             window_s: float, series: Sequence[str] = FLAT_SERIES,
             start_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Per series: the median over the window from `start_s` (default: after a warm-up
    window) against the median over the last window, and whether they are within
    FLAT_LIMIT of each other."""
    begin = window_s if start_s is None else start_s
    out: dict[str, dict[str, Any]] = {}
    for name in series:
        start = [s[name] for t, s in samples if begin <= t < begin + window_s and name in s]
        end = [s[name] for t, s in samples if t >= duration_s - window_s and name in s]
        if not start or not end or statistics.median(start) == 0:
            out[name] = {"start": None, "end": None, "change": None, "flat": None}
            continue
        first, last = statistics.median(start), statistics.median(end)
        change = round(last / first - 1, 4)
        out[name] = {"start": round(first, 1), "end": round(last, 1), "change": change,
                     "flat": abs(change) <= FLAT_LIMIT}
    return out


def _step_mean_ms(first: Mapping[str, Sequence[float]] | None,
                  last: Mapping[str, Sequence[float]] | None, step: str) -> float | None:
    """A step's mean milliseconds a batch between two samples of the step totals ({step:
    (seconds so far, batches so far)}); None without a batch between them."""
    if first is None or last is None or step not in last:
        return None
    spent, count = last[step]
    spent0, count0 = first.get(step, (0.0, 0))
    return (spent - spent0) / (count - count0) * 1000 if count > count0 else None


def graph_steps(totals: Sequence[tuple[float, Mapping[str, Sequence[float]]]], duration_s: float,
                window_s: float) -> dict[str, dict[str, Any]]:
    """Per step of the view graph's batches (engine.metrics.graph_step_totals, sampled as
    (seconds since the start, {step: (seconds, batches)})): its mean in milliseconds over
    the window after a warm-up window and over the last window, and the change. Which step
    a growing batch time comes from."""

    def at(t: float) -> Mapping[str, Sequence[float]] | None:
        return next((sample for when, sample in totals if when >= t), None)

    start_from, start_to = at(window_s), at(2 * window_s)
    end_from, end_to = at(duration_s - window_s), totals[-1][1] if totals else None
    out: dict[str, dict[str, Any]] = {}
    for step in sorted(end_to or {}):
        first = _step_mean_ms(start_from, start_to, step)
        last = _step_mean_ms(end_from, end_to, step)
        change = round(last / first - 1, 4) if first and last is not None else None
        out[step] = {"start_ms": None if first is None else round(first, 1),
                     "end_ms": None if last is None else round(last, 1), "change": change}
    return out


def per_changed_row(totals: Sequence[tuple[float, Mapping[str, Sequence[float]]]],
                    changed: Sequence[tuple[float, int]], duration_s: float,
                    window_s: float) -> dict[str, dict[str, Any]]:
    """The rows a graph batch changed (engine.metrics.rows_changed_total, sampled with the
    step totals as (seconds since the start, rows so far)) and the batch's time per
    thousand of them, over the window after a warm-up window and over the last window.
    A batch should cost what it changes: when a batch changes more rows (a longer batch
    gathers more of the traffic, and a demo tier change rewrites every order of its
    customer), the batch time grows with it while its time per changed row stays flat."""

    def at(series: Sequence[tuple[float, Any]], t: float) -> Any:
        return next((sample for when, sample in series if when >= t), None)

    def window(first_t: float, last_t: float | None) -> tuple[float, float] | None:
        """(rows a batch, milliseconds per thousand rows) between the two times."""
        steps = (at(totals, first_t), totals[-1][1] if last_t is None else at(totals, last_t))
        rows = (at(changed, first_t), changed[-1][1] if last_t is None else at(changed, last_t))
        if None in steps or None in rows or "batch" not in steps[1]:
            return None
        spent, count = steps[1]["batch"]
        spent0, count0 = steps[0].get("batch", (0.0, 0))
        batches, changed_rows = count - count0, rows[1] - rows[0]
        if batches <= 0 or changed_rows <= 0:
            return None
        return changed_rows / batches, (spent - spent0) * 1000 / changed_rows * 1000

    start = window(window_s, 2 * window_s) if totals and changed else None
    end = window(duration_s - window_s, None) if totals and changed else None
    out: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(("rows_per_batch", "batch_ms_per_1000_rows")):
        first = None if start is None else round(start[index], 1)
        last = None if end is None else round(end[index], 1)
        change = round(last / first - 1, 4) if first and last is not None else None
        out[name] = {"start": first, "end": last, "change": change,
                     "flat": None if change is None else abs(change) <= FLAT_LIMIT}
    return out


def maintenance_runs(totals: Sequence[tuple[float, Mapping[str, Sequence[float]]]]
                     ) -> list[dict[str, Any]]:
    """Each view's Delta maintenance and compactions (engine.metrics.maintenance_totals,
    sampled as (seconds since the start, {view: (seconds, runs)})): when they ended (the
    sample that first counted them), which view, and the seconds they took (the runs
    between two samples together)."""
    runs: list[dict[str, Any]] = []
    previous: Mapping[str, Sequence[float]] = {}
    for when, sample in totals:
        for view, (spent, count) in sorted(sample.items()):
            spent0, count0 = previous.get(view, (0.0, 0))
            if count > count0:
                runs.append({"t_s": when, "view": view, "runs": int(count - count0),
                             "seconds": round(spent - spent0, 3)})
        previous = sample
    return runs


def slowest_batches(totals: Sequence[tuple[float, Mapping[str, Sequence[float]]]],
                    runs: Sequence[Mapping[str, Any]], count: int = 10
                    ) -> list[dict[str, Any]]:
    """The `count` sample intervals whose graph batches took longest on average (from the
    step totals, as graph_steps), each with the views whose maintenance ended in it and the
    three steps that took longest in it (mean ms a batch): whether a slow batch waited for
    maintenance, and where it spent its time."""

    intervals = []
    for (t0, first), (t1, last) in itertools.pairwise(totals):
        batch_ms = _step_mean_ms(first, last, "batch")
        if batch_ms is None:
            continue
        steps = {step: ms for step in last if step != "batch"
                 and (ms := _step_mean_ms(first, last, step)) is not None}
        longest = sorted(steps.items(), key=lambda item: item[1], reverse=True)[:3]
        intervals.append({"t_s": t1, "batch_ms": round(batch_ms, 1),
                          "maintenance": sorted({r["view"] for r in runs
                                                 if t0 < r["t_s"] <= t1}),
                          "steps_ms": {step: round(ms, 1) for step, ms in longest}})
    return sorted(intervals, key=lambda i: i["batch_ms"], reverse=True)[:count]
