"""Who is asking: a bearer token (or none) becomes a Principal, its role and row scope.

HTTP requests carry `Authorization: Bearer <token>`; websockets carry the token in the
`connection_init` payload (`Authorization: "Bearer ..."`, `authorization`, or `authToken`).
The role comes from the claim `auth_role_claim`: one role, or a list of roles among which
the `x-viewgate-role` header (or the `x-viewgate-role` payload entry) chooses, by default
the first. A request without a token gets `auth_anonymous_role`, or 401 when none is set.
A websocket's handshake may carry the `Authorization` header instead (server-side clients
and proxies send it); a token in the `connection_init` payload wins over it. A role that is
neither the admin role, nor granted by any view, nor the anonymous role gets 403 (Forbidden).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.access.row_rules import ClaimError, RowScope, build_scope
from gateway.access.tokens import TokenError, TokenVerifier
from schema.catalog import Catalog, FieldInfo
from schema.permissions import claim_value
from schema.settings import Settings

ROLE_HEADER = "x-viewgate-role"
TOKEN_PARAMS = ("Authorization", "authorization", "authToken")
KNOWN_TOKENS = 10_000  # verified tokens remembered until their `exp`


class Unauthenticated(Exception):
    """401: no acceptable credentials; `str(error)` is the reason."""

    status = 401
    code = "UNAUTHENTICATED"

    def __init__(self, reason: str, token_given: bool = True) -> None:
        super().__init__(reason)
        self.token_given = token_given


class Forbidden(Unauthenticated):
    """403: the credentials are good but name a role this gateway knows nothing of."""

    status = 403
    code = "FORBIDDEN"


@dataclass(frozen=True)
class Principal:
    role: str
    claims: Mapping[str, Any]
    scope: RowScope | None  # None: the admin role, no rules

    @property
    def admin(self) -> bool:
        return self.scope is None

    @property
    def share_scope(self) -> Any:
        return None if self.scope is None else self.scope.share_scope


class Authenticator:
    def __init__(self, settings: Settings, catalog: Catalog,
                 fields: Mapping[str, Mapping[str, FieldInfo]]) -> None:
        self.settings = settings
        self.catalog = catalog
        self.fields = fields
        self.verifier = TokenVerifier(settings)
        self.admin_role = settings.auth_admin_role
        self.anonymous_role = settings.auth_anonymous_role or None  # "" is unset too
        self.role_claim = settings.auth_role_claim
        self.known_roles = {g.role for view in catalog.views.values() for g in view.grants}
        self.known_roles.add(self.admin_role)
        if self.anonymous_role is not None:
            self.known_roles.add(self.anonymous_role)
        # A client sends the same token with every request: its signature is checked once,
        # then the principal is reused until the token expires (bounded, oldest out).
        self._known: OrderedDict[tuple[str, str | None], tuple[Principal, float]] = \
            OrderedDict()

    def principal_for(self, role: str, claims: Mapping[str, Any]) -> Principal:
        if role == self.admin_role:
            return Principal(role, claims, None)
        if role not in self.known_roles:
            raise Forbidden(f"role {role!r} may read nothing here: no view grants it")
        try:
            scope = build_scope(self.catalog, self.fields, role, claims)
        except ClaimError as exc:
            raise Unauthenticated(str(exc)) from None
        return Principal(role, claims, scope)

    async def from_token(self, token: str | None, chosen_role: str | None) -> Principal:
        if not token:
            if self.anonymous_role is None:
                raise Unauthenticated("authentication required: send a bearer token "
                                      "(Authorization: Bearer <token>)", token_given=False)
            return self.principal_for(self.anonymous_role, {})
        if not self.verifier.configured:
            raise Unauthenticated("this gateway accepts no tokens (no auth_jwt_secret or "
                                  "auth_jwks configured)")
        known = self._known.get((token, chosen_role))
        if known is not None and time.time() < known[1]:
            return known[0]
        try:
            claims = await self.verifier.verify_async(token)
        except TokenError as exc:
            raise Unauthenticated(str(exc)) from None
        principal = self.principal_for(self._role(claims, chosen_role), claims)
        exp = claims.get("exp")
        expires = float(exp) if isinstance(exp, int | float) else math.inf
        self._known[(token, chosen_role)] = (principal, expires)
        if len(self._known) > KNOWN_TOKENS:
            self._known.popitem(last=False)
        return principal

    def _role(self, claims: Mapping[str, Any], chosen: str | None) -> str:
        value = claim_value(claims, self.role_claim)
        roles = [value] if isinstance(value, str) else value
        if not isinstance(roles, list) or not roles \
                or not all(isinstance(r, str) and r for r in roles):
            raise Unauthenticated(f"the token has no role in its claim {self.role_claim!r} "
                                  "(a role name or a list of them)")
        if chosen is None:
            return roles[0]
        if chosen not in roles:
            raise Unauthenticated(f"role {chosen!r} ({ROLE_HEADER}) is not among the token's "
                                  f"roles: {', '.join(roles)}")
        return chosen

    async def from_headers(self, authorization: str | None,
                           role_header: str | None) -> Principal:
        return await self.from_token(bearer(authorization), role_header or None)

    async def from_connection_params(self, params: Mapping[str, Any] | None,
                                     headers: Mapping[str, str] | None = None) -> Principal:
        """A websocket's caller: the token of its `connection_init` payload, else the one
        of its handshake's `Authorization` header (with that header's role choice)."""
        params = params or {}
        raw = next((params[k] for k in TOKEN_PARAMS if params.get(k) is not None), None)
        if raw is not None and not isinstance(raw, str):
            raise Unauthenticated("the token in connection_init must be a string")
        role = params.get(ROLE_HEADER)
        if role is not None and not isinstance(role, str):
            raise Unauthenticated(f"{ROLE_HEADER} in connection_init must be a string")
        if not raw and headers is not None and headers.get("authorization"):
            return await self.from_headers(headers.get("authorization"),
                                           role or headers.get(ROLE_HEADER))
        # `authToken` is the bare token by convention; accept a "Bearer " prefix anyway.
        token = bearer(raw) if raw and raw[:7].lower() == "bearer " else raw
        return await self.from_token(token, role or None)


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value; None when absent."""
    if authorization is None or not authorization.strip():
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token.strip()


def unauthorized_body(reason: str, code: str = "UNAUTHENTICATED") -> bytes:
    return orjson.dumps({"errors": [{"message": reason, "extensions": {"code": code}}]})


def www_authenticate(reason: str, token_given: bool = True,
                     error: str = "invalid_token") -> str:
    """The RFC 6750 challenge; the reason made safe for a quoted header value. Without
    a token there is no error code, only the challenge (RFC 6750, section 3.1)."""
    if not token_given:
        return 'Bearer realm="viewgate"'
    safe = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "'" for c in reason)
    return f'Bearer error="{error}", error_description="{safe}"'

