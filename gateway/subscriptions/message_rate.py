"""How fast one websocket connection may send messages: a token bucket per connection.

In-process and per connection on purpose: a connection lives in one gateway process, and
the budget is what keeps one client's message flood (pings, subscribe/complete churn) from
taking the event loop from everyone else. Requests over HTTP have their own limit in Redis
(gateway.access.rate_limit); this one needs no round trip per message.

A server may answer a graphql-transport-ws connection's keep-alive messages itself, without
waking the application (uvicorn as the gateway runs it does: viewgate.websocket_protocol).
It offers that in the ASGI scope's extensions under `KEEP_ALIVE_BUDGET`: a function the
application calls with the connection's `take` (spend one message; False once past the
budget). The budget stays the application's, one per connection, and so does what happens
past it: the server hands the refused message on to the application, which closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The ASGI scope extension: `offer(take: Callable[[], bool]) -> None`. Once offered, the
# server answers each graphql-transport-ws `ping` with a `pong` and drops each `pong`, after
# `take()` allows it; the message `take()` refuses, and any other, goes to the application.
KEEP_ALIVE_BUDGET = "viewgate.websocket.keep_alive_budget"


class MessageBudget:
    """`rate` messages per second after a burst of `burst`; rate 0: no limit."""

    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(burst, 1)
        self.tokens = float(self.burst)
        self.clock = clock
        self.at = clock()

    def take(self) -> bool:
        """Spend one message; False once the connection is past its budget."""
        if self.rate <= 0:
            return True
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
