"""bench/results.json: one flat object of figures, merged run after run.

A run replaces the figures of the groups it ran (also dropping keys those groups no
longer report) and keeps every other group's figures. `groups` records, per group, the
keys it owns and when, in which mode and under what machine load they were measured.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GROUPS_KEY = "groups"


def cpu_cores() -> int:
    """Cores this process may run on (what a benchmark actually gets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average: more than cpu_cores() means others competed for the CPU."""
    return round(os.getloadavg()[0], 2)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_meta(mode: str) -> dict[str, Any]:
    """What every results file says about the run that wrote it last."""
    return {
        "cpu_cores": cpu_cores(),
        "python_version": platform.python_version(),
        "spark_version": _version("pyspark"),
        "delta_version": _version("delta-spark"),
        "strawberry_version": _version("strawberry-graphql"),
        "mode": mode,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def merge(
    previous: Mapping[str, Any],
    meta: Mapping[str, Any],
    groups: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]],
) -> dict[str, Any]:
    """`groups` maps each group run to (its figures, its group record). The result keeps
    the figures of groups not run, replaces those of groups run, and updates the meta."""
    merged = {k: v for k, v in previous.items() if k != GROUPS_KEY}
    records = dict(previous.get(GROUPS_KEY, {}))
    for name, (figures, record) in groups.items():
        for key in records.get(name, {}).get("keys", []):
            merged.pop(key, None)
        merged.update(figures)
        records[name] = {**record, "keys": sorted(figures)}
    merged.update(meta)
    merged[GROUPS_KEY] = records
    return merged


def load(path: Path) -> dict[str, Any]:
    """The results file's content, or {} when there is none yet."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); move it away and run again") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object; move it away and run again")
    return data


def write(path: Path, data: Mapping[str, Any]) -> None:
    """Write-temp-then-rename, so an interrupted run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
