"""Token checks, roles, row rules and the per-role catalog, without services."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from gateway.access.auth import (
    Authenticator,
    Forbidden,
    Unauthenticated,
    bearer,
    www_authenticate,
)
from gateway.access.role_schemas import restrict_catalog
from gateway.access.row_rules import build_scope, seen_change
from gateway.access.tokens import TokenError, TokenVerifier
from schema import demo
from schema.catalog import Catalog, graphql_fields
from schema.errors import CatalogError
from schema.permissions import Grant, RowRule, claim_value
from schema.settings import Settings
from schema.storage import ChangeEvent
from viewgate.stack.process import wait_until

SECRET = "unit-test-secret-of-enough-length-for-hs256"
FIELDS = {name: graphql_fields(view) for name, view in demo.CATALOG.views.items()}


def hs256(claims: dict, secret: str = SECRET, **headers) -> str:
    return jwt.encode(claims, secret, algorithm="HS256", headers=headers or None)


@pytest.fixture(scope="module")
def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def jwks_file(tmp_path, rsa_key):
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    return path


def settings(**updates) -> Settings:
    return Settings(auth_jwt_secret=SecretStr(SECRET), **updates)


def test_hs256_token_gives_its_claims():
    claims = TokenVerifier(settings()).verify(hs256({"role": "admin", "sub": "u1"}))
    assert claims["sub"] == "u1"


@pytest.mark.parametrize(("token", "reason"), [
    (hs256({"role": "admin", "exp": int(time.time()) - 60}), "expired"),
    (hs256({"role": "admin"}, secret="another-secret-of-enough-length-for-hs256"),
     "signature does not verify"),
    ("not.a.token", "malformed"),
    ("garbage", "malformed"),
    (hs256({"role": "admin", "nbf": int(time.time()) + 3600}), "not valid yet"),
    (jwt.encode({"role": "admin"}, None, algorithm="none"), "unsupported algorithm"),
])
def test_bad_tokens_are_refused_with_the_reason(token, reason):
    with pytest.raises(TokenError, match=reason):
        TokenVerifier(settings()).verify(token)


def test_issuer_and_audience_are_checked_when_configured():
    verifier = TokenVerifier(settings(auth_issuer="https://idp", auth_audience="viewgate"))
    good = {"role": "admin", "iss": "https://idp", "aud": "viewgate"}
    assert verifier.verify(hs256(good))["iss"] == "https://idp"
    with pytest.raises(TokenError, match="issuer"):
        verifier.verify(hs256({**good, "iss": "https://other"}))
    with pytest.raises(TokenError, match="audience"):
        verifier.verify(hs256({**good, "aud": "someone-else"}))


def test_rs256_key_is_picked_by_kid_from_a_jwks_file(rsa_key, jwks_file):
    verifier = TokenVerifier(Settings(auth_jwks=str(jwks_file)))
    token = jwt.encode({"role": "customer"}, rsa_key, algorithm="RS256", headers={"kid": "k1"})
    assert verifier.verify(token)["role"] == "customer"
    unknown = jwt.encode({"role": "customer"}, rsa_key, algorithm="RS256",
                         headers={"kid": "k9"})
    with pytest.raises(TokenError, match="no key with kid 'k9'"):
        verifier.verify(unknown)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode({"role": "admin"}, other, algorithm="RS256", headers={"kid": "k1"})
    with pytest.raises(TokenError, match="signature"):
        verifier.verify(forged)
    with pytest.raises(TokenError, match="HS256 tokens are not accepted"):
        verifier.verify(hs256({"role": "admin"}))


def authenticator(**updates) -> Authenticator:
    return Authenticator(settings(**updates), demo.CATALOG, FIELDS)


def principal(auth: Authenticator, claims: dict | None, role: str | None = None):
    header = None if claims is None else f"Bearer {hs256(claims)}"
    return asyncio.run(auth.from_headers(header, role))


def test_role_comes_from_the_configured_claim_and_the_role_header_chooses_among_a_list():
    auth = authenticator(auth_role_claim="app.roles")
    claims = {"app": {"roles": ["customer", "analyst"]}, "customer_id": "C1"}
    assert principal(auth, claims).role == "customer"
    assert principal(auth, claims, "analyst").role == "analyst"
    with pytest.raises(Unauthenticated, match="'admin'.*not among the token's roles"):
        principal(auth, claims, "admin")
    with pytest.raises(Unauthenticated, match="no role in its claim 'app.roles'"):
        principal(auth, {"role": "admin"})


def test_anonymous_requests_are_denied_unless_an_anonymous_role_is_set():
    with pytest.raises(Unauthenticated, match="authentication required") as denied:
        principal(authenticator(), None)
    assert not denied.value.token_given
    assert principal(authenticator(auth_anonymous_role="analyst"), None).role == "analyst"
    assert principal(authenticator(auth_anonymous_role="admin"), None).admin


def test_a_role_whose_rules_read_a_missing_claim_is_refused():
    with pytest.raises(Unauthenticated, match="lacks the claim 'customer_id'"):
        principal(authenticator(), {"role": "customer"})
    with pytest.raises(Unauthenticated, match="single value"):
        principal(authenticator(), {"role": "customer", "customer_id": ["C1", "C2"]})


def test_bearer_header_parsing():
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer  abc ") == "abc"
    assert bearer(None) is None and bearer(" ") is None
    with pytest.raises(Unauthenticated, match="Bearer <token>"):
        bearer("Basic dXNlcjpwYXNz")
    header = www_authenticate('bad "quoted" reason\n')
    assert header == "Bearer error=\"invalid_token\", error_description=\"bad 'quoted' reason'\""


def test_websocket_payload_accepts_the_three_usual_token_entries():
    auth = authenticator()
    token = hs256({"role": "customer", "customer_id": 17})
    for params in ({"Authorization": f"Bearer {token}"}, {"authorization": f"Bearer {token}"},
                   {"authToken": token}):
        got = asyncio.run(auth.from_connection_params(params))
        assert got.role == "customer"
        # A number claim compared with a string field is the string.
        assert got.scope.rules("Order")[0].value == "17"
        assert got.share_scope == ("customer", (("customer_id", "17"),))
    with pytest.raises(Unauthenticated, match="must be a string"):
        asyncio.run(auth.from_connection_params({"authToken": 5}))


def test_a_role_nothing_grants_is_forbidden_and_a_configured_one_is_not():
    with pytest.raises(Forbidden, match="role 'stranger' may read nothing here") as refused:
        principal(authenticator(), {"role": "stranger"})
    assert refused.value.status == 403 and refused.value.code == "FORBIDDEN"
    # The anonymous role counts as known, even when no view grants it.
    guest = authenticator(auth_anonymous_role="guest")
    assert principal(guest, None).role == "guest"
    assert principal(guest, {"role": "guest"}).scope.conditions == {}


def test_websocket_handshake_header_counts_and_the_payload_wins():
    auth = authenticator()
    customer = hs256({"role": "customer", "customer_id": "C1"})
    analyst = hs256({"role": "analyst"})
    headers = {"authorization": f"Bearer {customer}"}
    assert asyncio.run(auth.from_connection_params({}, headers)).role == "customer"
    assert asyncio.run(auth.from_connection_params({"authToken": analyst},
                                                   headers)).role == "analyst"
    with pytest.raises(Unauthenticated, match="authentication required"):
        asyncio.run(auth.from_connection_params({}, {}))


def test_scope_filters_rows_and_changes():
    scope = build_scope(demo.CATALOG, FIELDS, "customer", {"customer_id": "C1"})
    mine = {"order_id": "o1", "customer_id": "C1", "status": "placed"}
    theirs = {"order_id": "o2", "customer_id": "C2", "status": "placed"}
    assert scope.visible("Order", mine) and not scope.visible("Order", theirs)
    assert not scope.visible("ProductSales", {"product_id": "p"})  # not granted

    def change(before, row):
        return ChangeEvent(view="Order", key="o", op="update", row=row, before=before,
                           version=1, generation=0, committed_at_ms=0)
    assert seen_change(scope, change(mine, mine), "UPDATE") == ("UPDATE", True, True)
    assert seen_change(scope, change(theirs, theirs), "UPDATE") == (None, False, False)
    assert seen_change(scope, change(theirs, mine), "UPDATE") == ("INSERT", True, False)
    assert seen_change(scope, change(mine, theirs), "UPDATE") == ("DELETE", False, True)
    assert seen_change(None, change(theirs, theirs), "UPDATE") == ("UPDATE", True, True)


def test_claim_paths():
    assert claim_value({"a": {"b": 3}}, "a.b") == 3
    assert claim_value({"a": 1}, "a.b") is None


def _with_grants(view_name: str, grants: tuple) -> Catalog:
    views = [dataclasses.replace(v, grants=grants) if v.name == view_name else v
             for v in demo.CATALOG.views.values()]
    return Catalog.of(demo.CATALOG.sources.values(), views)


@pytest.mark.parametrize(("grants", "message"), [
    ((Grant("c", hidden=("nope",)),), "hides a field the type does not have"),
    ((Grant("c", rows=(RowRule("product_id", claim="p"),)),), "neither the key nor an index"),
    ((Grant("c", rows=(RowRule("status", value="placed"),), hidden=("status",)),),
     "hidden from the role"),
    ((Grant("c", rows=(RowRule("status"),)),), "exactly one of claim= or value="),
    ((Grant("c", rows=(RowRule("status", claim="s", value="x"),)),), "exactly one"),
    ((Grant("c", rows=(RowRule("amount", value="ten"),)),), "does not fit"),
    ((Grant("c"), Grant("c")), "declared twice"),
    ((Grant("c", rows=(RowRule("missing", claim="x"),)),), "field the type does not have"),
])
def test_catalog_validation_names_grant_problems(grants, message):
    with pytest.raises(CatalogError, match=message) as error:
        _with_grants("Order", grants).validate()
    assert all(p.view == "Order" for p in error.value.problems)


def test_demo_grants_validate():
    demo.CATALOG.validate()


def test_a_role_catalog_leaves_out_ungranted_views_hidden_fields_and_their_indexes():
    customer = restrict_catalog(demo.CATALOG, "customer")
    assert set(customer.views) == {"Customer", "Order", "CustomerStats"}
    assert "tier" not in graphql_fields(customer.views["Customer"])
    assert "tier" not in customer.views["Customer"].indexes
    assert "customer_tier" not in graphql_fields(customer.views["Order"])
    assert {r.name for r in customer.views["Customer"].relationships} == {"stats", "orders"}
    analyst = restrict_catalog(demo.CATALOG, "analyst")
    assert "ProductSales" in analyst.views and "name" not in graphql_fields(
        analyst.views["Customer"])
    assert restrict_catalog(demo.CATALOG, "nobody").views == {}
    # Relationships to views the role may not see are left out.
    only_orders = restrict_catalog(_with_grants("Customer", ()), "customer")
    assert only_orders.views["Order"].relationships == ()


def test_a_verified_token_is_reused_until_it_expires(monkeypatch):
    auth = authenticator()
    calls = []
    verify = auth.verifier.verify
    monkeypatch.setattr(auth.verifier, "verify", lambda t: calls.append(t) or verify(t))
    soon = int(time.time()) + 2
    header = f"Bearer {hs256({'role': 'analyst', 'exp': soon})}"
    for _ in range(3):
        assert asyncio.run(auth.from_headers(header, None)).role == "analyst"
    assert len(calls) == 1
    # Past its exp the token is checked again, and refused.
    wait_until(lambda: time.time() > soon + 0.05, timeout_s=10, interval_s=0.05,
               what="the token's exp")
    with pytest.raises(Unauthenticated, match="expired"):
        asyncio.run(auth.from_headers(header, None))
