"""The bare-Starlette baseline the gateway's point-query speed is measured against: the
same Redis read of one Customer by key, the same JSON answer, no GraphQL.

It accepts the request a GraphQL client would send for a customer lookup (POST
/graphql with `{"query": ..., "variables": {"id": ...}}`) or GET /customer/{id}, does one
Redis GET of the row and answers `{"data": {"customer": {...}}}` serialized with orjson.
Run it with `uvicorn --factory gateway.baseline:create_baseline_app`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from schema.redis_client import connect_async
from schema.settings import Settings, get_settings
from schema.storage import META_GENERATION, meta_key, row_key

VIEW = "Customer"


def create_baseline_app(settings: Settings | None = None) -> Starlette:
    settings = settings or get_settings()
    client = connect_async(settings.redis_url)
    state = {"generation": 0}

    async def answer(key: str) -> Response:
        row = await client.get(row_key(VIEW, state["generation"], key))
        customer = orjson.loads(row) if row is not None else None
        return Response(orjson.dumps({"data": {"customer": customer}}),
                        media_type="application/json")

    async def by_post(request: Request) -> Response:
        body = orjson.loads(await request.body())
        return await answer(str((body.get("variables") or {}).get("id")))

    async def by_get(request: Request) -> Response:
        return await answer(request.path_params["key"])

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        generation = await client.hget(meta_key(VIEW), META_GENERATION)
        state["generation"] = int(generation or 0)
        yield
        await client.aclose()

    return Starlette(routes=[Route("/graphql", by_post, methods=["POST"]),
                             Route("/customer/{key}", by_get)], lifespan=lifespan)
