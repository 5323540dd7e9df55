"""GraphQL over HTTP, as the GraphQL-over-HTTP specification's draft says (README, "GraphQL
over HTTP"): GET (queries only) and POST with a JSON body, GraphiQL for browsers. Answers
are serialized with orjson, carry `extensions.freshness` and name their encoding
(`; charset=utf-8`).

Media type: `application/graphql-response+json` when the Accept header names it first,
`application/json` when the header is missing, is `*/*` or prefers `application/json`;
406 when it takes neither. Every request gets the status codes of
`application/graphql-response+json` (the spec's "watershed"): only a 2xx answer is sent as
`application/json` to a client that asked for it, any 4xx or 5xx GraphQL response says it
is one with `application/graphql-response+json`.

Status codes: 200 with `data` and no errors; 294 with `data` and errors (field errors,
a minimum version not reached) for `application/graphql-response+json`, 200 for
`application/json` (the spec recommends 294 only alongside its own media type); 400 for a
body that is not JSON or a document that does not parse; 422 for a request that is not a
well-formed GraphQL-over-HTTP request (no query, parameters of the wrong type), a document
that does not validate (a limit of ours included), an operation that cannot be picked,
variables that do not fit; 405 with `Allow: POST` for a mutation or subscription over GET;
413 for a body or document too large, 414 for a GET document too large; 415 for a POST
whose Content-Type is not `application/json` in UTF-8.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from graphql import GraphQLError, GraphQLSyntaxError, OperationDefinitionNode, parse
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
from gateway.reads.consistency import GraphVersion
from gateway.reads.filters import QueryError
from gateway.reads.freshness import Freshness, parse_min_versions, wait_for_versions
from gateway.types.types import RequestContext
from schema.logs import REQUEST_ID

GRAPHQL_RESPONSE = "application/graphql-response+json"
JSON = "application/json"
PARTIAL = 294  # the spec's "Partial Success": data and errors


class BadRequest(Exception):
    """A request that is not a well-formed GraphQL-over-HTTP request: 422 by default."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class GraphQLRequest:
    query: str
    variables: dict[str, Any] | None
    operation_name: str | None
    extensions: dict[str, Any] | None


def negotiate(accept: str | None) -> str | None:
    """The media type of a successful answer for an Accept header; None if it takes
    neither of ours. Each of our types gets the quality of the most specific range that
    matches it (RFC 9110); the higher quality wins. At equal quality
    `application/graphql-response+json` wins only when named: a missing header, `*/*` or
    `application/*` get `application/json`, what older clients expect."""
    if accept is None or not accept.strip():
        return JSON
    # offered type -> (specificity of the range that matched: 2 named, 1 application/*,
    # 0 */*; its quality)
    best = {GRAPHQL_RESPONSE: (-1, 0.0), JSON: (-1, 0.0)}
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        media = media.lower()
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    quality = 0.0
        for offered in best:
            specificity = {offered: 2, "application/*": 1, "*/*": 0}.get(media)
            if specificity is not None and specificity > best[offered][0]:
                best[offered] = (specificity, quality)
    (named, gql_q), (_, json_q) = best[GRAPHQL_RESPONSE], best[JSON]
    if gql_q <= 0 and json_q <= 0:
        return None
    if gql_q != json_q:
        return GRAPHQL_RESPONSE if gql_q > json_q else JSON
    return GRAPHQL_RESPONSE if named == 2 else JSON


def media_for(media: str, status: int) -> str:
    """The Content-Type of an answer: the negotiated media type for a 2xx, else
    `application/graphql-response+json` (the spec's watershed), with its encoding."""
    if not 200 <= status < 300:
        media = GRAPHQL_RESPONSE
    return f"{media}; charset=utf-8"


def is_json_body(content_type: str | None) -> bool:
    """Whether a POST's Content-Type is one we read: `application/json` in UTF-8 (the
    spec's default when no charset is named)."""
    if not content_type:
        return False
    media, *params = (p.strip() for p in content_type.split(";"))
    if media.lower() != JSON:
        return False
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
                "utf-8", "utf8"):
            return False
    return True


def _json_param(value: Any, name: str, in_url: bool) -> dict[str, Any] | None:
    """`variables` or `extensions`: a JSON object, in a GET's URL as JSON text."""
    if value is None or (in_url and value == ""):
        return None
    if in_url:
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise BadRequest(f"{name} is not valid JSON", status=400) from None
    if value is not None and not isinstance(value, dict):
        raise BadRequest(f"{name} must be a JSON object (a map), not {type(value).__name__}")
    return value


def parse_params(params: Mapping[str, Any], max_bytes: int,
                 in_url: bool = False) -> GraphQLRequest:
    """The request's parameters: a POST's JSON object, or a GET's URL parameters
    (`in_url`: strings, the empty string meaning absent)."""
    query = params.get("query")
    if query is None or query == "":
        raise BadRequest("the request has no query")
    if not isinstance(query, str):
        raise BadRequest("query must be a string")
    if len(query.encode()) > max_bytes:
        raise BadRequest(f"the document is {len(query.encode())} bytes; the limit is "
                         f"{max_bytes} (gateway_max_document_bytes)"
                         + ("; the URL is too long" if in_url else ""),
                         status=414 if in_url else 413)
    operation_name = params.get("operationName")
    if operation_name is not None and not isinstance(operation_name, str):
        raise BadRequest("operationName must be a string")
    return GraphQLRequest(query, _json_param(params.get("variables"), "variables", in_url),
                          operation_name or None,
                          _json_param(params.get("extensions"), "extensions", in_url))


def operation_type(query: str, operation_name: str | None) -> str | None:
    """The type of the operation a document and name pick ("query", "mutation",
    "subscription"), or None if the document does not parse or names no such operation
    (validation then says why)."""
    try:
        document = parse(query, no_location=True)
    except GraphQLError:
        return None
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    if operation_name is not None:
        operations = [o for o in operations if o.name and o.name.value == operation_name]
    return operations[0].operation.value if len(operations) == 1 else None


def _error(error: GraphQLError) -> dict[str, Any]:
    formatted = error.formatted
    code = limit_code(error)
    if code is not None:
        formatted["extensions"] = {**(formatted.get("extensions") or {}), "code": code}
    return formatted


def respond(body: dict[str, Any], media: str, status: int = 200,
            headers: Mapping[str, str] | None = None) -> Response:
    """A GraphQL response; `media` is the negotiated type (media_for picks the header)."""
    return Response(orjson.dumps(body), status_code=status, headers=headers,
                    media_type=media_for(media, status))


def request_error(message: str, media: str, status: int, code: str = "BAD_REQUEST",
                  headers: Mapping[str, str] | None = None) -> Response:
    return respond({"errors": [{"message": message, "extensions": {"code": code}}]},
                   media, status, headers)


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
        self.graph = GraphVersion(reads.redis, catalog)
        self.ide = get_graphql_ide_html(graphql_ide="graphiql")

    async def handle(self, request: Request) -> Response:
        accept = request.headers.get("accept")
        is_get = request.method in ("GET", "HEAD")
        if is_get and "text/html" in (accept or "") \
                and "query" not in request.query_params:
            return HTMLResponse(self.ide)
        media = negotiate(accept)
        if media is None:
            # Before any processing; the client takes neither of our types: plain JSON.
            body = {"errors": [{"message": f"cannot answer in any of {accept}; accept "
                                f"{GRAPHQL_RESPONSE} or {JSON}",
                                "extensions": {"code": "NOT_ACCEPTABLE"}}]}
            return Response(orjson.dumps(body), status_code=406,
                            media_type=f"{JSON}; charset=utf-8")
        principal = None
        if self.access is not None:
            try:
                principal = await self.access.principal(request.headers)
            except Unauthenticated as exc:
                ERRORS.labels(exc.code).inc()
                return unauthorized(exc, media_for(media, exc.status))
        started = time.perf_counter()
        try:
            params = request.query_params if is_get else await self._params(request)
            if self.persisted is not None:  # a persisted query's document, by its hash
                params = await self.persisted.resolve(params)
            graphql_request = parse_params(params, self.settings.gateway_max_document_bytes,
                                           in_url=is_get)
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
        content_type = request.headers.get("content-type")
        if not is_json_body(content_type):
            raise BadRequest(f"POST needs Content-Type {JSON} (UTF-8), not "
                             f"{content_type or 'none'}", status=415)
        try:
            body = await read_limited(request, self.settings.gateway_max_body_bytes,
                                      "gateway_max_body_bytes")
        except BodyTooLarge as exc:
            raise BadRequest(str(exc), status=413) from None
        except BadContentLength as exc:
            raise BadRequest(str(exc), status=400) from None
        try:
            params = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BadRequest("the body is not valid JSON", status=400) from None
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
        return await self.fast.run(req.query, req.operation_name, req.variables, self.reads,
                                   self.graph)

    async def execute(self, req: GraphQLRequest, media: str, is_get: bool,
                      principal: Principal | None = None) -> Response:
        schema = self.schema if principal is None else self.access.schema_for(principal)
        scope = principal.scope if principal is not None else None
        try:
            readable = (self.catalog.views if principal is None or principal.scope is None
                        else principal.scope.conditions)  # a role: the views granted to it
            wanted = parse_min_versions((req.extensions or {}).get("minVersion"), readable)
            if wanted:
                await wait_for_versions(self.reads.current_version, wanted,
                                        self.settings.gateway_min_version_wait_ms)
        except QueryError as error:
            if error.extensions["code"] == "BAD_REQUEST":
                return respond({"errors": [error.formatted]}, media, 422)
            # The view stayed behind: execution was attempted and refused, data is null.
            return respond({"data": None, "errors": [error.formatted]}, media,
                           partial_status(media))

        if is_get and ("mutation" in req.query or "subscription" in req.query):
            # GET is for queries (a safe method): refused before validation and execution.
            kind = operation_type(req.query, req.operation_name)
            if kind in ("mutation", "subscription"):
                return _not_over_get(kind, media)
        allowed = {OperationType.QUERY} if is_get else {OperationType.QUERY,
                                                         OperationType.MUTATION}
        async def attempt() -> tuple[ExecutionResult, Freshness]:
            context = RequestContext(self.reads, self.catalog, scope=scope)
            result = await schema.execute(
                req.query, variable_values=req.variables, context_value=context,
                operation_name=req.operation_name, allowed_operation_types=allowed,
                operation_extensions=req.extensions)
            return result, context.fresh

        try:
            # Several views of the graph read in one request are read at one version.
            result, fresh = await self.graph.run((req.query, req.operation_name), attempt)
        except InvalidOperationTypeError as exc:
            if is_get:
                return _not_over_get(exc.operation_type.value, media)
            return request_error(f"{exc.operation_type.value} operations are not served over "
                                 "HTTP; subscribe over a websocket at /graphql", media, 422)
        except CannotGetOperationTypeError as exc:
            name = req.operation_name
            message = (f"no operation named {name!r} in the document" if name else
                       f"cannot pick the operation to run: {exc}")
            return request_error(message, media, 422)
        except MissingQueryError:
            return request_error("the request has no query", media, 422)
        return self._response(result, fresh, media, req, principal is None or principal.admin)

    def _response(self, result: ExecutionResult, fresh: Freshness, media: str,
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
            # A document that does not parse: 400; one that does not validate, variables
            # that do not fit, a limit: 422.
            syntax = any(isinstance(e, GraphQLSyntaxError) and limit_code(e) is None
                         for e in errors)  # the token limit stops the parser: ours, 422
            return respond(body, media, 400 if syntax else 422)
        body["data"] = result.data
        body["extensions"] = self.graph.extensions(fresh)
        if self.fast is not None and not errors and admin:  # plans serve the admin role
            self.fast.learn(req.query, req.operation_name)
        return respond(body, media, partial_status(media) if errors else 200)


def partial_status(media: str) -> int:
    """`data` with errors: 294 with `application/graphql-response+json`, 200 with
    `application/json` (the spec recommends 294 only alongside its own media type)."""
    return PARTIAL if media == GRAPHQL_RESPONSE else 200


def _not_over_get(kind: str, media: str) -> Response:
    """405 with `Allow` (RFC 9110): the operation is served over POST only."""
    return request_error(f"{kind} operations are not allowed over GET; use POST", media, 405,
                         "METHOD_NOT_ALLOWED", {"Allow": "POST"})
