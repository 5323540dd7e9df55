"""How fast one websocket connection may send messages: a token bucket per connection.

In-process and per connection on purpose: a connection lives in one gateway process, and
the budget is what keeps one client's message flood (pings, subscribe/complete churn) from
taking the event loop from everyone else. Requests over HTTP have their own limit in Redis
(gateway.access.rate_limit); this one needs no round trip per message.
"""

from __future__ import annotations

import time
from collections.abc import Callable


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
