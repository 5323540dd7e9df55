"""GraphQL over HTTP (the GraphQL-over-HTTP specification): GET and POST, JSON bodies,
`application/json` and `application/graphql-response+json` responses with that media
type's status codes, GraphiQL for browsers. Responses are serialized with orjson and carry
`extensions.freshness`.

Status codes: a malformed HTTP request (bad JSON, no query, wrong parameter types) is
400 for both media types. A GraphQL request error (the document does not parse or
validate, variables do not fit, a limit is hit) is 400 with
`application/graphql-response+json` and 200 with `application/json`, as the spec says.
Once execution starts the answer is 200, `data` present, field errors in `errors`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from graphql import GraphQLError
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from strawberry.exceptions import MissingQueryError
from strawberry.http.ides import get_graphql_ide_html
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.types import ExecutionResult
from strawberry.types.execution import PreExecutionError
from strawberry.types.graphql import OperationType

from gateway.access.access import unauthorized
from gateway.access.auth import Principal, Unauthenticated
from gateway.access.limits import limit_code
from gateway.access.persisted import PersistedQueries, PersistedQueryError
from gateway.http.body import BadContentLength, BodyTooLarge, read_limited
from gateway.ops.metrics import ERRORS, observe_request
from gateway.reads.filters import QueryError
from gateway.reads.freshness import parse_min_versions, wait_for_versions
from gateway.types.types import RequestContext
from schema.logs import REQUEST_ID

GRAPHQL_RESPONSE = "application/graphql-response+json"
JSON = "application/json"


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class GraphQLRequest:
    query: str
    variables: dict[str, Any] | None
    operation_name: str | None
    extensions: dict[str, Any] | None


def negotiate(accept: str | None) -> str | None:
    """The response media type for an Accept header; None if we offer nothing it takes."""
    if not accept:
        return JSON
    best: tuple[float, int, str] | None = None
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        media = media.lower()
        if media in (GRAPHQL_RESPONSE, "application/*", "*/*"):
            candidate = (q, 1, GRAPHQL_RESPONSE)
        elif media == JSON:
            candidate = (q, 0, JSON)
        else:
            continue
        if q > 0 and (best is None or candidate[:2] > best[:2]):
            best = candidate
    return best[2] if best else None


def _json_param(value: Any, name: str) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise BadRequest(f"{name} is not valid JSON") from None
    if value is not None and not isinstance(value, dict):
        raise BadRequest(f"{name} must be a JSON object")
    return value


def parse_params(params: Mapping[str, Any], max_bytes: int) -> GraphQLRequest:
    query = params.get("query")
    if query is None or query == "":
        raise BadRequest("the request has no query")
    if not isinstance(query, str):
        raise BadRequest("query must be a string")
    if len(query.encode()) > max_bytes:
        raise BadRequest(f"the document is {len(query.encode())} bytes; the limit is "
                         f"{max_bytes} (gateway_max_document_bytes)", status=413)
    operation_name = params.get("operationName")
    if operation_name is not None and not isinstance(operation_name, str):
        raise BadRequest("operationName must be a string")
    return GraphQLRequest(query, _json_param(params.get("variables"), "variables"),
                          operation_name or None,
                          _json_param(params.get("extensions"), "extensions"))


def _error(error: GraphQLError) -> dict[str, Any]:
    formatted = error.formatted
    code = limit_code(error)
    if code is not None:
        formatted["extensions"] = {**(formatted.get("extensions") or {}), "code": code}
    return formatted


def respond(body: dict[str, Any], media: str, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=media)


def request_error(message: str, media: str, status: int, code: str = "BAD_REQUEST") -> Response:
    return respond({"errors": [{"message": message, "extensions": {"code": code}}]},
                   media, status)


class GraphQLHTTP:
    """The /graphql endpoint."""

    def __init__(self, schema: Any, reads: Any, catalog: Any, settings: Any,
                 fast: Any, access: Any = None,
                 persisted: PersistedQueries | None = None) -> None:
        self.schema = schema
        self.access = access  # gateway.access.access.Access; None: no authentication (tests)
        self.persisted = persisted
        self.reads = reads
        self.catalog = catalog
        self.settings = settings
        # gateway.compiled.fastpath.FastPath, handed in by gateway.app (this package is
        # below the compiled one); None: every request takes the general path.
        self.fast = fast
        self.ide = get_graphql_ide_html(graphql_ide="graphiql")

    async def handle(self, request: Request) -> Response:
        accept = request.headers.get("accept")
        is_get = request.method in ("GET", "HEAD")
        if is_get and "text/html" in (accept or "") \
                and "query" not in request.query_params:
            return HTMLResponse(self.ide)
        media = negotiate(accept)
        if media is None:
            return request_error(f"cannot answer in any of {accept}; accept {GRAPHQL_RESPONSE} "
                                 f"or {JSON}", JSON, 406, "NOT_ACCEPTABLE")
        principal = None
        if self.access is not None:
            try:
                principal = await self.access.principal(request.headers)
            except Unauthenticated as exc:
                ERRORS.labels(exc.code).inc()
                return unauthorized(exc, media)
        started = time.perf_counter()
        try:
            params = request.query_params if is_get else await self._params(request)
            if self.persisted is not None:  # a persisted query's document, by its hash
                params = await self.persisted.resolve(params)
            graphql_request = parse_params(params, self.settings.gateway_max_document_bytes)
        except BadRequest as exc:
            ERRORS.labels("BAD_REQUEST").inc()
            response = request_error(str(exc), media, exc.status)
            if exc.status == 413:  # uvicorn then closes rather than drain the rest
                response.headers["connection"] = "close"
            return response
        except PersistedQueryError as exc:
            ERRORS.labels(exc.code).inc()
            return request_error(str(exc), media, exc.status, exc.code)
        # Log records of this request carry its id; the answer names it too.
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        try:
            response = await self.execute(graphql_request, media, is_get, principal)
        finally:
            REQUEST_ID.reset(token)
        response.headers["x-request-id"] = request_id
        observe_request(graphql_request.operation_name, "general",
                        time.perf_counter() - started)
        return response

    async def _params(self, request: Request) -> Mapping[str, Any]:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != JSON:
            raise BadRequest(f"POST needs Content-Type {JSON}, not {content_type or 'none'}",
                             status=415)
        try:
            body = await read_limited(request, self.settings.gateway_max_body_bytes,
                                      "gateway_max_body_bytes")
        except BodyTooLarge as exc:
            raise BadRequest(str(exc), status=413) from None
        except BadContentLength as exc:
            raise BadRequest(str(exc)) from None
        try:
            params = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BadRequest("the body is not valid JSON") from None
        if not isinstance(params, dict):
            raise BadRequest("the body must be a JSON object (batches are not supported)")
        return params

    async def fast_answer(self, req: GraphQLRequest, authorization: str | None = None,
                          role: str | None = None) -> bytes | None:
        """The compiled plan's answer (gateway.compiled.fast_http sends it), or None: no plan, a
        minimum version to wait for, a caller other than the admin role (gateway.access.access),
        or the plan declined; then this endpoint answers."""
        if self.fast is None or (req.extensions or {}).get("minVersion") is not None:
            return None
        if self.access is not None and not await self.access.admin_request(authorization, role):
            return None
        return await self.fast.run(req.query, req.operation_name, req.variables, self.reads)

    async def execute(self, req: GraphQLRequest, media: str, is_get: bool,
                      principal: Principal | None = None) -> Response:
        schema = self.schema if principal is None else self.access.schema_for(principal)
        context = RequestContext(self.reads, self.catalog,
                                 scope=principal.scope if principal is not None else None)
        try:
            readable = (self.catalog.views if principal is None or principal.scope is None
                        else principal.scope.conditions)  # a role: the views granted to it
            wanted = parse_min_versions((req.extensions or {}).get("minVersion"), readable)
            if wanted:
                await wait_for_versions(self.reads.current_version, wanted,
                                        self.settings.gateway_min_version_wait_ms)
        except QueryError as error:
            if error.extensions["code"] == "BAD_REQUEST":
                return respond({"errors": [error.formatted]}, media, 400)
            # The view stayed behind: execution was attempted and refused, data is null.
            return respond({"data": None, "errors": [error.formatted]}, media)

        allowed = {OperationType.QUERY} if is_get else {OperationType.QUERY,
                                                         OperationType.MUTATION}
        try:
            result = await schema.execute(
                req.query, variable_values=req.variables, context_value=context,
                operation_name=req.operation_name, allowed_operation_types=allowed,
                operation_extensions=req.extensions)
        except InvalidOperationTypeError as exc:
            if is_get:
                return Response(orjson.dumps({"errors": [{"message": (
                    f"{exc.operation_type.value} operations are not allowed over GET; "
                    "use POST")}]}), status_code=405, media_type=media,
                    headers={"Allow": "POST"})
            return request_error(f"{exc.operation_type.value} operations are not supported",
                                 media, 400 if media == GRAPHQL_RESPONSE else 200)
        except CannotGetOperationTypeError as exc:
            name = req.operation_name
            message = (f"no operation named {name!r} in the document" if name else
                       f"cannot pick the operation to run: {exc}")
            return request_error(message, media, 400 if media == GRAPHQL_RESPONSE else 200)
        except MissingQueryError:
            return request_error("the request has no query", media, 400)
        return self._response(result, context, media, req,
                              principal is None or principal.admin)

    def _response(self, result: ExecutionResult, context: RequestContext, media: str,
                  req: GraphQLRequest, admin: bool = True) -> Response:
        errors = result.errors or []
        # Before execution (parse, validation, variables, limits) nothing is read: no data.
        is_request_error = isinstance(result, PreExecutionError) or (
            result.data is None and errors and all(e.path is None for e in errors))
        for error in errors:
            ERRORS.labels(limit_code(error) or (error.extensions or {}).get("code")
                          or ("REQUEST" if is_request_error else "FIELD")).inc()
        body: dict[str, Any] = {}
        if errors:
            body["errors"] = [_error(e) for e in errors]
        if is_request_error:
            return respond(body, media, 400 if media == GRAPHQL_RESPONSE else 200)
        body["data"] = result.data
        body["extensions"] = {"freshness": context.fresh.report()}
        if self.fast is not None and not errors and admin:  # plans serve the admin role
            self.fast.learn(req.query, req.operation_name)
        return respond(body, media)
