"""Live lists (Hasura's live queries): a list's page sent again whenever a change alters it.

Subscribers with the same normalised arguments share one LiveList, so a change costs one
evaluation whatever their number. Evaluations are coalesced: changes arriving while one
is pending or running cause one more, not one each. A page equal to the last one sent is
not sent again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.reads.filters import Condition
from gateway.subscriptions.subscribers import Subscriber, unregistered

log = logging.getLogger("viewgate.gateway.live")


class LiveList:
    def __init__(self, conditions: Sequence[Condition],
                 evaluate: Callable[[], Awaitable[tuple[Any, Any]]],
                 coalesce_s: float, on_evaluated: Callable[[], None],
                 on_idle: Callable[[LiveList], None]) -> None:
        self.conditions = conditions
        self.evaluate = evaluate  # -> (page, a comparable snapshot of it)
        self.coalesce_s = coalesce_s
        self.on_evaluated = on_evaluated  # counts evaluations (gateway stats)
        self.on_idle = on_idle  # no subscriber left: forget this list
        self.subscribers: set[Subscriber] = set()
        self.page: Any = None  # the last page sent
        self._snapshot: Any = None
        self._first: asyncio.Task | None = None
        self._task: asyncio.Task | None = None
        self._again = False
        self.evaluations = 0

    async def add(self, sub: Subscriber) -> None:
        """Register `sub` and send it the current page (evaluated first if none yet);
        an evaluation error of the first page is raised to every waiting subscriber."""
        self.subscribers.add(sub)

        def remove() -> None:
            sub.unregister = unregistered  # (it refers to this closure: a cycle otherwise)
            self._remove(sub)
        sub.unregister = remove
        if self.page is not None:
            sub.put(self.page)
            return
        if self._first is None:
            self._first = asyncio.ensure_future(self._evaluate())
        try:
            await asyncio.shield(self._first)
        except Exception:
            sub.unregister()
            raise

    def _remove(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers:
            if self._task is not None:
                self._task.cancel()
            self.on_idle(self)

    def changed(self) -> None:
        self._again = True
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._rerun())

    def generation_changed(self) -> None:
        self.changed()

    async def _rerun(self) -> None:
        if self._first is not None:
            await asyncio.wait([self._first])  # the first page may predate this change
        while self._again and self.subscribers:
            await asyncio.sleep(self.coalesce_s)  # let the rest of a burst arrive
            self._again = False
            try:
                await self._evaluate()
            except Exception:  # keep the last page; the next change tries again
                log.exception("re-evaluating a live list failed")

    async def _evaluate(self) -> None:
        page, snapshot = await self.evaluate()
        self.evaluations += 1
        self.on_evaluated()
        if snapshot == self._snapshot:
            return
        self._snapshot, self.page = snapshot, page
        for sub in list(self.subscribers):
            sub.put(page)
