"""How uvicorn serves the gateway: the limits it enforces before the application sees
anything, from the settings, for `viewgate gateway` (uvicorn.run) and for the gateway
processes of the tests and benchmarks (the uvicorn command line)."""

from __future__ import annotations

from typing import Any

from schema.settings import Settings

# Request line and headers h11 buffers before refusing the request (431). httptools
# bounds them itself (llhttp).
MAX_HEAD_BYTES = 64 * 1024


# uvicorn's websocket implementation on the `websockets` library's sans-I/O protocol: its
# keep-alive pings are timers, not tasks, and a connection holds no task of its own beside
# the application's. The legacy `websockets` implementation (uvicorn's "auto" choice) runs
# three tasks per connection (reading, keep-alive, closing): measured at 10,000 tabs it held
# more memory per connection than the three subscriptions it carried (docs/benchmarks.md).
# The gateway runs it with permessage-deflate without context takeover
# (viewgate.websocket_protocol): no compressor kept per connection.
WEBSOCKETS = "viewgate.websocket_protocol:GatewayWebSocketProtocol"


# uvicorn's httptools protocol, leaving no cycle behind when it upgrades a connection to a
# websocket (viewgate.http_protocol).
HTTP = "viewgate.http_protocol:GatewayHttpToolsProtocol"


# With several workers, uvicorn's supervisor asks each worker for a sign of life and kills
# (then replaces) one that does not answer within --timeout-worker-healthcheck, 5 s by
# default: a worker busy with thousands of websockets opening at once on a loaded machine
# missed it, and its websockets were all lost. A worker that truly hangs is still replaced.
WORKER_HEALTHCHECK_S = 60


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    return {
        "http": HTTP,
        "ws": WEBSOCKETS,
        # A bigger websocket message closes its connection (1009) unread.
        "ws_max_size": settings.gateway_max_body_bytes,
        # Past this many connections and requests in flight, new requests get 503.
        "limit_concurrency": settings.gateway_max_connections,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
    }


def uvicorn_flags(settings: Settings) -> list[str]:
    """The same as command-line flags (`--ws-max-size 200000`, ...)."""
    flags: list[str] = []
    for name, value in uvicorn_options(settings).items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags
