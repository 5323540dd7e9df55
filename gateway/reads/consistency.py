"""One version of the view graph within a request.

The engine applies a batch of every graph view (View.in_graph: one query, one batch id as
the version of all of them) to Redis in one round trip, between two marks of the graph's
hash (schema.storage.graph_key): `applying` while it writes, `version` once every view
holds the batch. A request that reads several graph views reads the hash before its first
read and after its last (a seqlock): the same version and no batch applying at both ends
means no batch landed in between, so every row it read from Redis is of that one version.
Otherwise the request runs again, up to ATTEMPTS times; batches land a second or so apart
and a request takes milliseconds, so a second run is rare.

Which requests need it is learned: a document that read several graph views once is
bracketed from then on; one not known yet that turns out to read several runs once more,
bracketed. Requests that read one view (the compiled lookups among them) pay nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.reads.freshness import Freshness
from gateway.reads.redis_store import RedisStore, RedisUnavailable
from schema.catalog import Catalog

ATTEMPTS = 3
# How long a request waits for a batch being applied to land before it reads: an apply
# takes milliseconds; a mark left `applying` longer means the engine died in the middle
# (its restart replays the batch), and the request is answered without the guarantee.
SETTLE_S = 0.1
LEARNED_DOCUMENTS = 10_000

Result = TypeVar("Result")


@dataclass(frozen=True)
class GraphMark:
    version: int | None  # the last batch every graph view holds
    applying: int | None  # the batch being applied, if any


class GraphVersion:
    """App-wide: which documents read several graph views, and the graph's marks."""

    def __init__(self, redis: RedisStore, catalog: Catalog) -> None:
        self.redis = redis
        self.views = frozenset(name for name, v in catalog.views.items() if v.in_graph)
        self._several: OrderedDict[Any, bool] = OrderedDict()

    def generation(self) -> int:
        """The graph's generation as the reads last saw it (its views switch together)."""
        return max((self.redis.generation(v) for v in self.views), default=0)

    async def mark(self) -> GraphMark | None:
        """The graph's marks now; None if Redis cannot answer (the reads go to Delta)."""
        try:
            version, applying = await self.redis.graph_mark(self.generation())
        except RedisUnavailable:
            return None
        return GraphMark(version, applying)

    async def settled_mark(self) -> GraphMark | None:
        deadline = time.monotonic() + SETTLE_S
        pause = 0.002
        while True:
            mark = await self.mark()
            if mark is None or mark.applying is None or time.monotonic() >= deadline:
                return mark
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.02)

    def several(self, views: Any) -> bool:
        """Whether `views` (names) hold more than one view of the graph."""
        return len(self.views.intersection(views)) > 1

    def read_several(self, fresh: Freshness) -> bool:
        return self.several(fresh.latest)

    def extensions(self, fresh: Freshness) -> dict[str, Any]:
        """An answer's `extensions`: its freshness, and the graph's version when it read
        several graph views (null: not one version, see the module docstring)."""
        out: dict[str, Any] = {"freshness": fresh.report()}
        if self.read_several(fresh):
            out["graphVersion"] = fresh.graph_version
        return out

    async def run(self, document: Any,
                  attempt: Callable[[], Awaitable[tuple[Result, Freshness]]]
                  ) -> tuple[Result, Freshness]:
        """Run `attempt` (one execution of `document` with a context of its own) until its
        reads of the graph's views were of one version, or ATTEMPTS ran; the last run's
        answer and freshness. That freshness names the version for each of the graph's views
        it read (Freshness.graph_version), or None where it could not be had."""
        bracketed = self._several.get(document, False)
        for _ in range(ATTEMPTS):
            start = await self.settled_mark() if bracketed else None
            result, fresh = await attempt()
            if not self.read_several(fresh):
                return result, fresh
            self._learn(document)
            end = await self.mark()
            if end is None or end.version is None:
                break  # Redis is down or holds no graph version (emptied): none to promise
            if not bracketed:
                bracketed = True  # not known to read several: run again, bracketed
                continue
            if start is None or start.applying is not None:
                break  # a batch is stuck half applied: no guarantee
            if end == start and self._from(fresh, start.version):
                fresh.graph_version = start.version
                for view in self.views.intersection(fresh.latest):
                    # Every row was read at that version, whatever the (cached) meta said.
                    fresh.latest[view] = dataclasses.replace(fresh.latest[view],
                                                             version=start.version)
                return result, fresh
        fresh.graph_version = None
        return result, fresh

    def _from(self, fresh: Freshness, version: int | None) -> bool:
        """Whether every graph view was read from Redis (Delta, read on a miss, may trail
        the batch Redis holds) or from Delta at that same version."""
        return all(seen.source == "redis" or seen.version == version
                   for view, seen in fresh.latest.items() if view in self.views)

    def _learn(self, document: Any) -> None:
        self._several[document] = True
        self._several.move_to_end(document)
        while len(self._several) > LEARNED_DOCUMENTS:
            self._several.popitem(last=False)
