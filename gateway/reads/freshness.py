"""How fresh an answer is: each view a query read, at which version, with which
watermark, how long after its last commit (reported under `extensions.freshness`);
and waiting for a minimum version a client asks for (read your writes through the log).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.reads.filters import QueryError


@dataclass(frozen=True)
class Seen:
    version: int | None  # None: nothing committed yet
    watermark: str | None
    committed_at_ms: int | None
    source: str  # "redis" or "delta"
    delta_version: int | None = None


class Freshness:
    """Per request. A view read several times reports its oldest read: every part of the
    answer is at least that fresh."""

    def __init__(self) -> None:
        self.latest: dict[str, Seen] = {}
        self.as_of: dict[str, Seen] = {}
        # The one version of the view graph every graph view read was at, when the request
        # read several (gateway.reads.consistency; None: not to be had); unset otherwise.
        self.graph_version: int | None | type[_Unset] = _Unset

    def note(self, view: str, seen: Seen, as_of: bool = False) -> None:
        book = self.as_of if as_of else self.latest
        old = book.get(view)
        if old is None or _older(seen, old):
            book[view] = seen

    def report(self, now_ms: int | None = None) -> dict[str, Any]:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        out: dict[str, Any] = {}
        for view in sorted({*self.latest, *self.as_of}):
            entry = _entry(self.latest[view], now_ms) if view in self.latest else {}
            if view in self.as_of:
                entry["asOf"] = _entry(self.as_of[view], now_ms)
            out[view] = entry
        return out


class _Unset:
    """Freshness.graph_version of a request that read at most one graph view."""


def _older(a: Seen, b: Seen) -> bool:
    return (a.version if a.version is not None else -1) < (
        b.version if b.version is not None else -1)


def _entry(seen: Seen, now_ms: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "version": seen.version,
        "watermark": seen.watermark,
        "sinceCommitMs": None if not seen.committed_at_ms else max(0, now_ms
                                                                    - seen.committed_at_ms),
        "source": seen.source,
    }
    if seen.delta_version is not None:
        entry["deltaVersion"] = seen.delta_version
    return entry


def parse_min_versions(raw: Any, views: Collection[str]) -> dict[str, int]:
    """The request's `extensions.minVersion`: {"Order": 42, ...}. `views` are the views the
    caller may read: any other name, one that exists but is not granted to the caller's role
    included, is an unknown view, with the same answer as a name no view has."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise QueryError('extensions.minVersion must be an object like {"Order": 42}',
                         "BAD_REQUEST")
    out: dict[str, int] = {}
    for view, version in raw.items():
        if view not in views:
            raise QueryError(f"extensions.minVersion names unknown view {view!r}; views: "
                             f"{', '.join(sorted(views)) or 'none'}", "BAD_REQUEST")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise QueryError(f"extensions.minVersion.{view} must be a non-negative integer",
                             "BAD_REQUEST")
        out[view] = version
    return out


async def wait_for_versions(current: Callable[[str], Awaitable[int | None]],
                            wanted: Mapping[str, int], timeout_ms: int) -> None:
    """Return once every view is at least at its wanted version; raise VIEW_BEHIND with
    how far behind each lagging view is at the deadline."""
    deadline = time.monotonic() + timeout_ms / 1000
    pause = 0.005
    pending = dict(wanted)
    while True:
        versions = {v: await current(v) for v in pending}
        pending = {v: w for v, w in pending.items()
                   if versions[v] is None or versions[v] < w}  # type: ignore[operator]
        if not pending:
            return
        if time.monotonic() >= deadline:
            behind = [
                {"view": v, "version": versions[v], "requested": w,
                 "behind": w - (versions[v] if versions[v] is not None else -1)}
                for v, w in sorted(pending.items())
            ]
            text = "; ".join(
                f"view {b['view']} is at version {b['version']}, {b['behind']} behind the "
                f"requested {b['requested']}" for b in behind)
            raise QueryError(f"{text} (waited {timeout_ms} ms)",
                             "VIEW_BEHIND", views=behind)
        await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.05)
