"""Per-client counts of open websockets and of subscriptions, kept in this gateway process.

In-process on purpose: a connection or a subscription lives in exactly one process, which
knows for certain when it ends, so the count can never leak (a count in Redis would stay
up when a gateway dies with connections open). With N gateway replicas behind a balancer a
client can hold up to N times the limit; size the limits (or sticky sessions) for that.
"""

from __future__ import annotations


class ClientCounts:
    """How many of something each client holds, up to `limit` (0: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[str, int] = {}

    def acquire(self, client: str) -> bool:
        """Take one for `client`; False (nothing taken) when it already holds the limit."""
        count = self.held.get(client, 0)
        if self.limit and count >= self.limit:
            return False
        self.held[client] = count + 1
        return True

    def release(self, client: str) -> None:
        count = self.held.get(client, 0) - 1
        if count > 0:
            self.held[client] = count
        else:
            self.held.pop(client, None)  # clients come and go: keep no empty entries
