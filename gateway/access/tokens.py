"""Bearer tokens: JWTs checked with PyJWT.

HS256 tokens are checked with the shared secret (`auth_jwt_secret`), RS256 tokens with the
public key their `kid` names in a JWKS (`auth_jwks`: a file, read once, or a URL, fetched
by PyJWKClient and cached). `exp` and `nbf` are always checked when present; `iss` and
`aud` when configured. Each failure raises TokenError with a reason a client can act on.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jwt
from jwt import PyJWKClient, PyJWKSet

from schema.settings import Settings


class TokenError(Exception):
    """The token cannot be accepted; `str(error)` says why."""


class TokenVerifier:
    def __init__(self, settings: Settings) -> None:
        secret = settings.auth_jwt_secret
        self.secret = secret.get_secret_value() if secret is not None else None
        self.issuer = settings.auth_issuer
        self.audience = settings.auth_audience
        self.jwks_client: PyJWKClient | None = None
        self.jwks_file: PyJWKSet | None = None
        source = settings.auth_jwks
        if source and source.startswith(("http://", "https://")):
            self.jwks_client = PyJWKClient(source, cache_keys=True,
                                           lifespan=max(settings.auth_jwks_cache_s, 1))
        elif source:
            self.jwks_file = PyJWKSet.from_dict(json.loads(Path(source).read_text()))

    @property
    def configured(self) -> bool:
        return bool(self.secret or self.jwks_client or self.jwks_file)

    async def verify_async(self, token: str) -> dict[str, Any]:
        """`verify`, off the event loop when it may fetch the JWKS over the network."""
        if self.jwks_client is not None:
            return await asyncio.to_thread(self.verify, token)
        return self.verify(token)

    def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, or TokenError."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError as exc:
            raise TokenError(f"malformed token: {exc}") from None
        algorithm = header.get("alg")
        if algorithm == "HS256":
            if self.secret is None:
                raise TokenError("HS256 tokens are not accepted here (no shared secret)")
            key: Any = self.secret
        elif algorithm == "RS256":
            key = self._public_key(token, header)
        else:
            raise TokenError(f"unsupported algorithm {algorithm!r}: use HS256 or RS256")
        try:
            return jwt.decode(token, key, algorithms=[algorithm], issuer=self.issuer,
                              audience=self.audience,
                              options={"verify_aud": self.audience is not None})
        except jwt.ExpiredSignatureError:
            raise TokenError("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenError("the token is not valid yet (nbf)") from None
        except jwt.InvalidSignatureError:
            raise TokenError("the token's signature does not verify") from None
        except jwt.InvalidIssuerError:
            raise TokenError(f"the token's issuer is not {self.issuer!r}") from None
        except jwt.InvalidAudienceError:
            raise TokenError(f"the token's audience does not include {self.audience!r}") \
                from None
        except jwt.MissingRequiredClaimError as exc:
            raise TokenError(f"the token lacks the claim {exc.claim!r}") from None
        except jwt.InvalidTokenError as exc:
            raise TokenError(f"invalid token: {exc}") from None

    def _public_key(self, token: str, header: dict[str, Any]) -> Any:
        kid = header.get("kid")
        if self.jwks_file is not None:
            if kid is None:
                raise TokenError("the RS256 token has no kid to pick its key")
            try:
                return self.jwks_file[kid].key
            except KeyError:
                raise TokenError(f"no key with kid {kid!r} in the JWKS") from None
        if self.jwks_client is not None:
            try:
                return self.jwks_client.get_signing_key_from_jwt(token).key
            except jwt.PyJWKClientConnectionError as exc:
                raise TokenError(f"the JWKS could not be fetched: {exc}") from None
            except jwt.PyJWKClientError as exc:
                raise TokenError(f"no key for this token in the JWKS: {exc}") from None
        raise TokenError("RS256 tokens are not accepted here (no JWKS configured)")
