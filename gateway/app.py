"""Build the ASGI application."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
import strawberry
from graphql import GraphQLError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from strawberry.schema.config import StrawberryConfig
from strawberry.types import ExecutionContext

from gateway.access.access import Access, unauthorized
from gateway.access.auth import Unauthenticated
from gateway.access.limits import schema_extensions
from gateway.access.persisted import PersistedQueries
from gateway.access.rate_limit import RateLimiter
from gateway.compiled.fast_http import FastEntry
from gateway.compiled.fastpath import FastPath
from gateway.http.http import GraphQLHTTP
from gateway.http.limit_entry import LimitEntry
from gateway.http.websocket_entry import WebSocketEntry
from gateway.ops.dashboard_page import dashboard_routes
from gateway.ops.long_scalar import LONG_SCALARS
from gateway.ops.metrics import SUBSCRIPTIONS, metrics_endpoint
from gateway.ops.readiness import EndOffsets, readyz_endpoint
from gateway.ops.startup_check import check_against_delta
from gateway.ops.system import (
    PublicViewStatus,
    SystemStatus,
    ViewStatus,
    system_resolver,
    views_resolver,
)
from gateway.reads.reads import Reads
from gateway.subscriptions.fanout import Fanout
from gateway.subscriptions.shared_results import SharedResultsExecutor
from gateway.subscriptions.subscriptions import Subscriptions
from gateway.subscriptions.websocket import GraphQLWebSocket, parse_errors_as_results
from gateway.subscriptions.ws_admission import Admission
from gateway.types.types import build_view_types, root_fields
from schema.catalog import Catalog
from schema.errors import CatalogError, Problem
from schema.loader import load_catalog
from schema.logs import configure_logging
from schema.object_store import export_s3_environment
from schema.redis_client import connect_async
from schema.settings import Settings, get_settings

# The cyclic garbage collector's thresholds (CPython's are 700, 10, 10). Ten thousand
# websockets hold well over a million objects; with the defaults, opening them ran a full
# collection each time a quarter more had lived through two young ones (each full pass
# over them takes about a second and holds the event loop), and tabs opening and closing
# 200 a second kept doing so: 7 of every 30 s of the gateway's CPU. Closed connections
# leave no cycles of ours (their objects go by reference counting: tests/unit/
# test_browser_scale.py), so young collections can wait for 10,000 objects, and a full
# one for 100 young ones (docs/benchmarks.md, "Browser scale").
GC_THRESHOLDS = (10_000, 10, 100)


class GatewaySchema(strawberry.Schema):
    def process_errors(self, errors: list[GraphQLError],
                       execution_context: ExecutionContext | None = None) -> None:
        """Log only failures of ours; a bad document, a refused filter or a limit is the
        client's to fix and is already in the answer."""
        unexpected = [e for e in errors if e.original_error is not None
                      and not isinstance(e.original_error, GraphQLError)]
        super().process_errors(unexpected, execution_context)

    async def stream(self, *args: Any, **kwargs: Any) -> Any:
        return parse_errors_as_results(await super().stream(*args, **kwargs))


def build_schema(settings: Settings, redis_client: aioredis.Redis, catalog: Catalog,
                 reads: Reads, fanout: Fanout | None = None,
                 admin: bool = True) -> tuple[strawberry.Schema, dict]:
    """The schema of `catalog` (a role's, see gateway.access.role_schemas); `system` (service
    addresses) and the engine's input in `views` (Kafka offsets, late and dead-lettered
    events) only for the admin role."""
    types = build_view_types(catalog, reads, settings)
    annotations: dict[str, object] = {
        "system": SystemStatus, "views": list[ViewStatus if admin else PublicViewStatus]}
    attrs: dict[str, object] = {
        "system": strawberry.field(
            resolver=system_resolver(settings, redis_client),
            description="Live status of the services the gateway depends on."),
        "views": strawberry.field(
            resolver=views_resolver(catalog, redis_client, admin),
            description="Each view's last commit as the engine recorded it."),
    }
    if not admin:
        del annotations["system"], attrs["system"]
    for name, (annotation, field) in root_fields(types, settings).items():
        if name in attrs:
            raise CatalogError([Problem(name, None, f"its query field {name} clashes with a "
                                        "built-in field", "rename the view")])
        annotations[name] = annotation
        attrs[name] = field
    attrs["__annotations__"] = annotations
    query = strawberry.type(type("Query", (), attrs))
    subscription = None
    fields = Subscriptions(types, fanout, settings).fields() if fanout is not None else {}
    if fields:  # a role granted no view has no subscriptions
        subscription = strawberry.type(type("Subscription", (), {
            "__annotations__": {name: annotation for name, (annotation, _) in fields.items()},
            **{name: field for name, (_, field) in fields.items()}}))
    schema = GatewaySchema(query=query, subscription=subscription,
                           config=StrawberryConfig(scalar_map=LONG_SCALARS),
                           extensions=schema_extensions(settings),
                           execution_context_class=SharedResultsExecutor)
    return schema, types


def create_app(settings: Settings | None = None, catalog: Catalog | None = None,
               fast_path: bool = True) -> Starlette:
    settings = settings or get_settings()
    configure_logging(settings)
    export_s3_environment(settings)  # delta-rs reads s3a:// tables with these
    catalog = catalog or load_catalog(settings.catalog)
    check_against_delta(catalog, settings.delta_location)
    redis_client = connect_async(settings.redis_url, socket_timeout=2)
    reads = Reads(catalog, settings)
    fanout = Fanout(catalog, settings, reads)
    SUBSCRIPTIONS.set_function(lambda: fanout.report()["subscribers"])
    schema, types = build_schema(settings, redis_client, catalog, reads, fanout)
    fast = FastPath(schema, types, settings) if fast_path else None
    persisted = PersistedQueries(settings)
    limiter = RateLimiter.from_settings(settings)
    access = Access(settings, catalog, reads.fields, schema, lambda role_catalog, admin:
                    build_schema(settings, redis_client, role_catalog, reads, fanout, admin)[0])
    graphql = GraphQLHTTP(schema, reads, catalog, settings, fast, access, persisted)
    source_offsets = EndOffsets(settings.kafka_bootstrap,
                                sorted({s.topic for s in catalog.sources.values()}))

    async def healthz(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def sdl(request: Request) -> Response:
        if not settings.gateway_introspection:
            return PlainTextResponse("introspection is turned off (gateway_introspection)",
                                     status_code=404)
        try:
            principal = await access.principal(request.headers)
        except Unauthenticated as exc:
            return unauthorized(exc, "application/json")
        return PlainTextResponse(access.sdl(principal), media_type="application/graphql")

    websockets = GraphQLWebSocket(schema, settings, access, Admission(
        settings.gateway_max_subscriptions_per_client, persisted))

    async def subscriptions(_: Request) -> JSONResponse:
        # Open websockets and the event loop's tasks: what a connection or subscription
        # left behind after it closed shows here (the browsers bench's churn check).
        # And the garbage collector's passes per generation: a full one over ten thousand
        # websockets holds the event loop for about a second.
        return JSONResponse({**fanout.report(), "websockets": websockets.open_connections,
                             "tasks": len(asyncio.all_tasks()), "pid": os.getpid(),
                             "gcCollections": [g["collections"] for g in gc.get_stats()]})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # What start-up built (schema, catalog, modules) lives as long as the process: keep
        # it out of the collector, whose full passes over it paused every request for tens
        # of milliseconds (the latency tail).
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        await fanout.start()  # the change feed is assigned before the first subscriber
        yield
        await fanout.stop()
        source_offsets.close()
        await reads.close()
        await persisted.close()
        if limiter is not None:
            await limiter.close()
        await redis_client.aclose()

    app = Starlette(
        routes=[
            Route("/graphql", graphql.handle, methods=["GET", "POST"]),
            Route("/subscriptions", subscriptions),
            Route("/healthz", healthz),
            Route("/schema.graphql", sdl),
            Route("/metrics", metrics_endpoint),
            Route("/readyz", readyz_endpoint(catalog, settings, redis_client,
                                             lambda: fanout.feed.ready, source_offsets)),
            *dashboard_routes(settings.gateway_dashboard_dir),
        ],
        lifespan=lifespan,
        # Compiled queries skip the router (gateway.compiled.fast_http); the rest goes through it.
        # Per-client limits first (gateway.http.limit_entry), so they hold on every path.
        # Websockets on /graphql go straight to their app, through their per-client limit
        # (gateway.http.websocket_entry); HTTP requests through theirs.
        middleware=[Middleware(WebSocketEntry, websocket_app=LimitEntry(
                        websockets, limiter=None,
                        websockets=settings.gateway_max_websockets_per_client,
                        address_header=settings.gateway_client_address_header)),
                    Middleware(LimitEntry, limiter=limiter, websockets=0,
                               address_header=settings.gateway_client_address_header),
                    *([Middleware(FastEntry, graphql=graphql)] if fast_path else [])],
    )
    app.state.schema = schema
    app.state.reads = reads
    app.state.fast = fast
    app.state.fanout = fanout
    app.state.access = access
    return app
