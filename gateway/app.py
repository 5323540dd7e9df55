"""Build the ASGI application."""

from __future__ import annotations

import contextlib

import redis.asyncio as aioredis
import strawberry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from strawberry.asgi import GraphQL

from gateway.system import SystemStatus, ViewStatus, system_resolver, views_resolver
from schema.catalog import Catalog
from schema.loader import load_catalog
from schema.settings import Settings, get_settings


def build_schema(
    settings: Settings, redis_client: aioredis.Redis, catalog: Catalog
) -> strawberry.Schema:
    query = strawberry.type(
        type(
            "Query",
            (),
            {
                "__annotations__": {"system": SystemStatus, "views": list[ViewStatus]},
                "system": strawberry.field(
                    resolver=system_resolver(settings, redis_client),
                    description="Live status of the services the gateway depends on.",
                ),
                "views": strawberry.field(
                    resolver=views_resolver(catalog, redis_client),
                    description="Each view's last commit as the engine recorded it.",
                ),
            },
        )
    )
    return strawberry.Schema(query=query)


def create_app(settings: Settings | None = None, catalog: Catalog | None = None) -> Starlette:
    settings = settings or get_settings()
    catalog = catalog or load_catalog(settings.catalog)
    redis_client = aioredis.Redis.from_url(settings.redis_url, socket_timeout=2)
    schema = build_schema(settings, redis_client, catalog)

    async def healthz(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def sdl(_: Request) -> PlainTextResponse:
        return PlainTextResponse(schema.as_str())

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette):
        yield
        await redis_client.aclose()

    graphql = GraphQL(schema, graphql_ide="graphiql")
    return Starlette(
        routes=[
            Route("/graphql", graphql, methods=["GET", "POST"]),
            Route("/healthz", healthz),
            Route("/schema.graphql", sdl),
        ],
        lifespan=lifespan,
    )
