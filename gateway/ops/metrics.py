"""The gateway's Prometheus metrics (prometheus-client), served at /metrics: requests and
latency per operation, errors by kind, Redis hits and misses, Delta reads, websocket
connections, subscriptions and dropped slow clients. Each process has its own (with several
uvicorn workers, scrape each or use prometheus-client's multiprocess mode)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response

REQUESTS = Counter("viewgate_gateway_requests", "GraphQL requests over HTTP, by operation "
                   "(the request's operationName) and by the path that answered (compiled "
                   "plan or general).",
                   ["operation", "path"])
LATENCY = Histogram(
    "viewgate_gateway_request_duration_seconds",
    "Time to answer a GraphQL request over HTTP, by operation.", ["operation"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
ERRORS = Counter("viewgate_gateway_errors", "GraphQL errors answered, by kind "
                 "(their extensions.code, REQUEST for parse and validation errors, FIELD "
                 "for other errors during execution).", ["kind"])
REDIS_ROWS = Counter("viewgate_gateway_redis_rows", "Rows looked up in Redis, by result.",
                     ["result"])
DELTA_READS = Counter("viewgate_gateway_delta_reads", "Reads of a view's Delta table, by "
                      "reason (fallback: Redis lacked rows or was down; time_travel: asOf; "
                      "rewarm: copying Delta back into Redis).", ["view", "reason"])
WEBSOCKETS = Gauge("viewgate_gateway_websocket_connections", "Open websocket connections.")
SUBSCRIPTIONS = Gauge("viewgate_gateway_subscriptions", "Active subscriptions.")
SLOW_CLIENTS = Counter("viewgate_gateway_slow_clients_dropped",
                       "Websocket clients disconnected because their buffer overflowed.")
# The websocket opening gate (viewgate.opening_gate), which the serving layer runs.
WS_UPGRADES_WAITED = Counter("viewgate_gateway_websocket_upgrades_waited",
                             "Websocket upgrades that waited for the gateway to catch up.")
WS_UPGRADES_WAITING = Gauge("viewgate_gateway_websocket_upgrades_waiting",
                            "Websocket upgrades waiting for the gateway to catch up.")
LOOP_LAG = Gauge("viewgate_gateway_event_loop_lag_seconds",
                 "How late the event loop last ran a timer (the work queued ahead of it), "
                 "measured every 50 ms once a websocket has opened.")

# Operation names come from clients: label only the first ones seen, so a client cannot
# grow the metrics without bound.
MAX_OPERATION_LABELS = 200
_operations: set[str] = set()


def operation_label(name: str | None) -> str:
    if not name:
        return "anonymous"
    if name in _operations:
        return name
    if len(_operations) < MAX_OPERATION_LABELS:
        _operations.add(name)
        return name
    return "other"


def observe_request(operation: str | None, path: str, seconds: float) -> None:
    label = operation_label(operation)
    REQUESTS.labels(label, path).inc()
    LATENCY.labels(label).observe(seconds)


async def metrics_endpoint(_: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
