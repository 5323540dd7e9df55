"""Request rate limits: one token bucket per client (gateway.access.client_identity) in Redis,
shared by every gateway process, taken by one atomic script call (one EVALSHA round trip).

The bucket holds up to `burst` tokens and gains `rate` per second; a request takes one or
is refused with how long until one is there. Time is Redis's own clock, so gateways with
skewed clocks agree. When Redis fails the limiter lets requests through (the gateway keeps
answering from Delta then, and must not stop because of its limiter): it logs the outage
once, counts every request served unlimited, and asks Redis again after
`gateway_redis_retry_ms`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from prometheus_client import Counter
from redis.exceptions import RedisError

from schema.redis_client import connect_async
from schema.storage import REDIS_PREFIX

log = logging.getLogger(__name__)

LIMITED = Counter("viewgate_gateway_rate_limited", "Requests, websockets and subscriptions "
                  "refused by a per-client limit, by kind (http, websocket, subscription, "
                  "websocket_message).",
                  ["kind"])
UNLIMITED = Counter("viewgate_gateway_rate_limit_unavailable", "HTTP requests served without "
                    "a rate-limit check because Redis did not answer (the limiter fails open).")

# KEYS[1] the bucket hash; ARGV[1] tokens per second, ARGV[2] burst.
# Returns {1, 0} when a token was taken, else {0, milliseconds until one is there}.
TOKEN_BUCKET_LUA = r"""
redis.replicate_commands()
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = burst
elseif now > at then
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
end
local allowed, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
-- A bucket left alone refills completely in burst / rate seconds: then it can go.
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, wait}
"""


def bucket_key(client: str) -> str:
    return f"{REDIS_PREFIX}ratelimit:{client}"


def retry_after_s(wait_ms: int) -> int:
    """Retry-After is whole seconds: round up, and never 0 (that would say "now")."""
    return max(1, math.ceil(wait_ms / 1000))


class RateLimiter:
    def __init__(self, url: str, rate_per_s: float, burst: int, timeout_s: float,
                 retry_ms: int) -> None:
        self.rate = rate_per_s
        self.burst = max(1, burst)
        self.client = connect_async(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._take = self.client.register_script(TOKEN_BUCKET_LUA)
        self.retry_s = retry_ms / 1000
        self._down_until = 0.0
        self._down = False  # whether the outage was logged

    @classmethod
    def from_settings(cls, settings: Any) -> RateLimiter | None:
        """The limiter the settings ask for; None when rate limits are off."""
        if settings.gateway_rate_limit_per_s <= 0:
            return None
        return cls(settings.redis_url, settings.gateway_rate_limit_per_s,
                   settings.gateway_rate_limit_burst, settings.gateway_redis_timeout_s,
                   settings.gateway_redis_retry_ms)

    async def close(self) -> None:
        await self.client.aclose()

    async def check(self, client: str) -> int | None:
        """None when the request may go on, else the seconds to wait (Retry-After)."""
        if time.monotonic() < self._down_until:
            UNLIMITED.inc()
            return None
        try:
            allowed, wait_ms = await self._take(keys=[bucket_key(client)],
                                                args=[self.rate, self.burst])
        except (RedisError, OSError) as exc:
            self._down_until = time.monotonic() + self.retry_s
            if not self._down:
                log.warning("rate limits are off while Redis does not answer (%s); "
                            "requests are served unlimited", exc)
            self._down = True
            UNLIMITED.inc()
            return None
        if self._down:
            log.info("Redis answers again: rate limits apply")
        self._down = False
        if allowed:
            return None
        LIMITED.labels("http").inc()
        return retry_after_s(int(wait_ms))
