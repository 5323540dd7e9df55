"""New websockets opened at the pace the gateway keeps up with: past its capacity, the
tabs still to open wait their turn instead of slowing down every tab opening with them.

A gateway process opens tabs as fast as its one event loop runs: on the bench machine
about 150 to 170 a second (docs/benchmarks.md, "Browser scale"). Offered more (every
browser reconnecting after a deploy, the bench's churn of 220 a second), it used to take
them all at once, piling new tabs onto every moment the loop was behind: each tab's first
messages took seconds (p50 1.8-9.4 s in the churn; 0.6-1.0 s with this gate).

So a timer measures how late the event loop runs it every `TICK_S` (its lag: the work
queued ahead of it). While a tick comes on time (lag under `lag_limit_s`), up to
`ADMIT_PER_TICK` websocket upgrades go through before the next tick. Past that, or while
the loop runs late, an upgrade waits: its HTTP request parsed and kept (a few KiB, against
tens for an open tab) until a tick lets it through. Waiting clients take turns, one upgrade
each (in arrival order within a client), so one client's flood of upgrades (a script, a
tab reconnecting in a loop) delays its own, not everyone's. A few
(`ADMIT_WHEN_LATE`) go through every tick whatever the lag, so a loop kept late by
something else (a fan-out to every tab, a starved host, a flood of upgrades that the
application then refuses) still opens tabs. A waiting client that leaves is forgotten.
Plain HTTP requests never wait here; uvicorn's own limit (`limit_concurrency`,
gateway_max_connections) still refuses connections past it.

(Measured against it, docs/benchmarks.md: a bound on the tabs opening at once, each
counted until its first answer, held the gateway to 100 tabs a second where it served
150, as a tab's opening takes over half a second under load; the same bound as a floor
beside the lag let the lag grow back, first messages p50 2 s.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway.ops.metrics import LOOP_LAG, WS_UPGRADES_WAITED, WS_UPGRADES_WAITING

TICK_S = 0.05
ADMIT_PER_TICK = 25  # at most 500 upgrades a second while the loop keeps up
ADMIT_WHEN_LATE = 5  # per tick while it runs late: a flood of upgrades still moves

log = logging.getLogger("viewgate.opening_gate")


class Upgrade(Protocol):
    """A connection whose websocket upgrade waits (viewgate.http_protocol)."""

    def upgrade_now(self) -> None: ...


class OpeningGate:
    def __init__(self, loop: asyncio.AbstractEventLoop, lag_limit_s: float) -> None:
        self.loop = loop
        self.lag_limit_s = lag_limit_s
        self.budget = ADMIT_PER_TICK  # upgrades let through until the next tick
        self.lag_s = 0.0  # of the last tick
        # Client -> its waiting upgrades in arrival order; the clients in the order of their
        # next turn (one that had its turn goes to the back).
        self.waiting: dict[str, dict[Upgrade, None]] = {}
        self.queued = 0  # upgrades waiting, all clients (kept: the metric on every change)
        self.waited = 0  # upgrades that waited, since start
        self._due = loop.time() + TICK_S
        loop.call_at(self._due, self._tick)

    def admit_now(self) -> bool:
        """Whether an upgrade goes through now (nobody waits, and the tick's share is not
        used up); if so, it takes its place in the share."""
        if not self.waiting and self.budget > 0:
            self.budget -= 1
            return True
        return False

    def wait(self, upgrade: Upgrade, client: str) -> None:
        """`upgrade` waits in `client`'s line (the client's address or token,
        gateway.access.client_identity); its `upgrade_now()` is called when its turn
        comes, unless it is `forget`-ten first."""
        self.waiting.setdefault(client, {})[upgrade] = None
        self.queued += 1
        self.waited += 1
        WS_UPGRADES_WAITED.inc()
        WS_UPGRADES_WAITING.set(self.queued)

    def forget(self, upgrade: Upgrade, client: str) -> None:
        """A waiting upgrade's client left."""
        line = self.waiting.get(client)
        if line is None or upgrade not in line:  # already through, or forgotten
            return
        del line[upgrade]
        if not line:
            del self.waiting[client]
        self.queued -= 1
        WS_UPGRADES_WAITING.set(self.queued)

    def _next(self) -> Upgrade:
        """The first client's first upgrade; that client goes to the back of the line."""
        client = next(iter(self.waiting))
        line = self.waiting.pop(client)
        upgrade = next(iter(line))
        del line[upgrade]
        if line:
            self.waiting[client] = line
        self.queued -= 1
        return upgrade

    def _tick(self) -> None:
        now = self.loop.time()
        self.lag_s = now - self._due
        LOOP_LAG.set(self.lag_s)
        # The next tick first: whatever happens below, the gate keeps turning.
        self._due = now + TICK_S
        self.loop.call_at(self._due, self._tick)
        self.budget = ADMIT_PER_TICK if self.lag_s <= self.lag_limit_s else ADMIT_WHEN_LATE
        while self.waiting and self.budget > 0:
            upgrade = self._next()
            self.budget -= 1
            try:
                upgrade.upgrade_now()
            except Exception:  # that connection's failure: the others still get their turn
                log.exception("a websocket upgrade that waited failed")
        WS_UPGRADES_WAITING.set(self.queued)


def gate_of(owner: object, loop: asyncio.AbstractEventLoop,
            lag_limit_s: float) -> OpeningGate | None:
    """The gate of a server (`owner`: uvicorn's ServerState, one per server), made on its
    first upgrade; None when `lag_limit_s` is 0 (every upgrade at once)."""
    if lag_limit_s <= 0:
        return None
    gate = getattr(owner, "opening_gate", None)
    if gate is None:
        gate = OpeningGate(loop, lag_limit_s)
        owner.opening_gate = gate  # type: ignore[attr-defined]
    return gate
