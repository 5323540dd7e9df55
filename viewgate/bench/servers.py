"""The HTTP servers the gateway group measures, each a uvicorn process of its own (one
worker, uvloop and httptools when installed, no access log) on a free port:

- `gateway`: the gateway as `viewgate gateway` serves it (gateway.app.create_app);
- `baseline`: the bare Starlette endpoint doing the same Redis read (gateway.baseline);
- `stock`: stock Strawberry, `strawberry.asgi.GraphQL` over the gateway's own schema and
  resolvers, without the gateway's HTTP layer and compiled point queries.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schema.settings import Settings
from viewgate.stack.process import ManagedProcess, free_port, wait_until

FACTORIES = {
    "gateway": "gateway.app:create_app",
    "baseline": "gateway.baseline:create_baseline_app",
    "stock": "viewgate.bench.servers:create_stock_app",
}

# The benchmarks measure the gateway itself, from one client address: per-client limits
# off, whatever the environment says.
LIMITS_OFF = {
    "VIEWGATE_GATEWAY_RATE_LIMIT_PER_S": "0",
    "VIEWGATE_GATEWAY_MAX_WEBSOCKETS_PER_CLIENT": "0",
    "VIEWGATE_GATEWAY_MAX_SUBSCRIPTIONS_PER_CLIENT": "0",
    "VIEWGATE_GATEWAY_WS_MESSAGES_PER_S": "0",
}


def create_stock_app() -> Any:
    """Stock Strawberry over the gateway's schema (uvicorn --factory; settings from the
    environment): Strawberry's own ASGI view, parsing, validation and execution."""
    from starlette.applications import Starlette
    from starlette.routing import Route
    from strawberry.asgi import GraphQL

    from gateway.app import create_app
    from gateway.types.types import RequestContext

    gateway = create_app(fast_path=False)
    reads, catalog = gateway.state.reads, gateway.state.reads.catalog

    class StockGraphQL(GraphQL):
        async def get_context(self, request: Any, response: Any) -> RequestContext:
            return RequestContext(reads, catalog)

    return Starlette(
        routes=[Route("/graphql", StockGraphQL(gateway.state.schema), methods=["POST"])],
        lifespan=gateway.router.lifespan_context,
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """What a server process needs to read the same Redis and Delta as `settings`."""
    env = {
        "VIEWGATE_REDIS_URL": settings.redis_url,
        "VIEWGATE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "VIEWGATE_CHANGEFEED_PREFIX": settings.changefeed_prefix,
        "VIEWGATE_DATA_DIR": str(settings.data_dir),
        "VIEWGATE_DELTA_ROOT": settings.delta_location,
    }
    if settings.catalog:
        env["VIEWGATE_CATALOG"] = settings.catalog
    if settings.auth_anonymous_role is not None:  # the bench and tests send no tokens
        env["VIEWGATE_AUTH_ANONYMOUS_ROLE"] = settings.auth_anonymous_role
    return env


def uvicorn_args(factory: str, port: int, settings: Settings | None = None) -> list[str]:
    """The uvicorn command line of a server; with `settings`, the gateway's limits too
    (viewgate.serving), as `viewgate gateway` applies them."""
    from viewgate.serving import uvicorn_flags

    args = [sys.executable, "-m", "uvicorn", "--factory", factory, "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1", "--no-access-log", "--log-level", "warning",
            *(uvicorn_flags(settings) if settings is not None else [])]
    if importlib.util.find_spec("uvloop"):
        args += ["--loop", "uvloop"]
    if settings is None and importlib.util.find_spec("httptools"):
        args += ["--http", "httptools"]  # the gateway's flags name its own (viewgate.serving)
    return args


@dataclass
class Server:
    name: str
    port: int
    process: ManagedProcess

    @property
    def pid(self) -> int:
        return self.process.pid


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running(
    names: list[str], settings: Settings, log_dir: Path, env: Mapping[str, str] | None = None,
    timeout_s: float = 60,
) -> Iterator[dict[str, Server]]:
    """Start the named servers (all at once), wait until each accepts connections, and
    stop them all on the way out, also on an error."""
    servers: dict[str, Server] = {}
    with contextlib.ExitStack() as stack:
        for name in names:
            port = free_port()
            process = ManagedProcess(
                f"{name} server", uvicorn_args(FACTORIES[name], port, settings),
                log_dir / f"{name}.log",
                env={**settings_env(settings), **LIMITS_OFF, **(env or {})},
            )
            process.start()
            stack.callback(process.stop)
            servers[name] = Server(name, port, process)
        for server in servers.values():
            wait_until(lambda s=server: _listening(s.port), timeout_s=timeout_s,
                       what=f"the {server.name} server (uvicorn)", alive=server.process.alive,
                       log=server.process.log_path)
        yield servers
