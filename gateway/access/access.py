"""The gateway's access control, wired once per app: who is asking (gateway.access.auth), which
schema that role queries (gateway.access.role_schemas), and the 401 answer.

Compiled queries (gateway.compiled.fastpath) are planned against the admin schema and read rows
without row rules, so only admin requests take them; every other role is answered by the
general path, whose resolvers apply the rules. That keeps authorization in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import Response

from gateway.access.auth import (
    ROLE_HEADER,
    Authenticator,
    Forbidden,
    Principal,
    Unauthenticated,
    unauthorized_body,
    www_authenticate,
)
from gateway.access.role_schemas import RoleSchemas, granted_roles
from schema.catalog import Catalog, FieldInfo
from schema.settings import Settings


class Access:
    def __init__(self, settings: Settings, catalog: Catalog,
                 fields: Mapping[str, Mapping[str, FieldInfo]], admin_schema: Any,
                 build: Callable[[Catalog, bool], Any]) -> None:
        self.auth = Authenticator(settings, catalog, fields)
        roles = granted_roles(catalog)
        if settings.auth_anonymous_role:
            roles.add(settings.auth_anonymous_role)
        self.schemas = RoleSchemas(catalog, settings.auth_admin_role, admin_schema, roles, build)
        self.introspection = settings.gateway_introspection
        self._anonymous_admin = settings.auth_anonymous_role == settings.auth_admin_role
        self._sdl: dict[int, str] = {}

    async def principal(self, headers: Mapping[str, str]) -> Principal:
        """The caller of an HTTP request; Unauthenticated (401) when it cannot be."""
        return await self.auth.from_headers(headers.get("authorization"),
                                            headers.get(ROLE_HEADER))

    def schema_for(self, principal: Principal) -> Any:
        return self.schemas.get(principal.role)

    async def admin_request(self, authorization: str | None, role: str | None) -> bool:
        """Whether a request may take the compiled path: its caller is the admin role. A
        bad token is False too: the general path answers it (401)."""
        if authorization is None and role is None:
            return self._anonymous_admin
        try:
            return (await self.auth.from_headers(authorization, role)).admin
        except Unauthenticated:
            return False

    def sdl(self, principal: Principal) -> str:
        schema = self.schema_for(principal)
        text = self._sdl.get(id(schema))
        if text is None:
            text = self._sdl[id(schema)] = schema.as_str() + "\n"
        return text


def unauthorized(error: Unauthenticated, media: str) -> Response:
    """401 (403 for a role nothing grants) with the reason as a GraphQL error and as the
    RFC 6750 challenge."""
    reason = str(error)
    challenge = www_authenticate(reason, error.token_given, "insufficient_scope"
                                 if isinstance(error, Forbidden) else "invalid_token")
    return Response(unauthorized_body(reason, error.code), status_code=error.status,
                    media_type=media, headers={"WWW-Authenticate": challenge})
