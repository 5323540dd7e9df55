"""Fair starts: how many operations of one websocket connection may be starting at once.

Starting a subscription is the expensive part of its life: parsing and validating the
document, reading the current value, evaluating a live list's first page, replaying the
feed for `after`/`afterVersion`. A connection that sends hundreds of subscribes would
otherwise start them all at once, and the event loop would run that backlog before anyone
else's query. So each connection holds at most `STARTS_PER_CONNECTION` starts in flight;
its next `subscribe`/`start` message is read only once one of them has settled. The rest of
its messages wait in its own socket (TCP pushes back on that client alone).

A start settles with the operation's first message (`next`, `error`, `complete`), when
its subscription first waits for live changes (a change stream that has nothing to send
yet, `gateway.subscriptions.subscribers.Subscriber.get`), or when the operation ends.
The operation's task learns its start through a context variable it inherits when the
protocol handler creates it.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar

STARTS_PER_CONNECTION = 4


class Start:
    def __init__(self, permits: asyncio.Semaphore) -> None:
        self._permits: asyncio.Semaphore | None = permits

    def settle(self) -> None:
        """Give the permit back (once; later calls do nothing)."""
        if self._permits is not None:
            self._permits.release()
            self._permits = None


_STARTING: ContextVar[Start | None] = ContextVar("viewgate_operation_start", default=None)


class OperationStarts:
    """One connection's starts in flight, by operation id."""

    def __init__(self, limit: int = STARTS_PER_CONNECTION) -> None:
        self._permits = asyncio.Semaphore(limit)
        self._by_op: dict[str, Start] = {}

    async def begin(self, op: str) -> Start:
        """Wait for a permit; the operation's task must be created under `running(start)`."""
        await self._permits.acquire()
        self.settle(op)  # a restarted id gives its earlier start back first
        start = self._by_op[op] = Start(self._permits)
        return start

    def settle(self, op: str) -> None:
        start = self._by_op.pop(op, None)
        if start is not None:
            start.settle()

    def settle_when_done(self, op: str, task: asyncio.Task | None) -> None:
        """The operation runs as `task` (None: it was refused): its start settles at the
        latest when the task ends."""
        if task is None or task.done():
            self.settle(op)
        else:
            task.add_done_callback(lambda _: self.settle(op))


def enter(start: Start) -> object:
    """Make `start` the one tasks created from here on inherit; `leave` with the result."""
    return _STARTING.set(start)


def leave(token: object) -> None:
    _STARTING.reset(token)  # type: ignore[arg-type]


def settle_current() -> None:
    """Settle the start of the operation running in this task, if any."""
    start = _STARTING.get()
    if start is not None:
        start.settle()
