"""Authentication and authorization end to end, on the demo shop the real engine wrote:
bearer tokens (HS256, RS256 from a JWKS file and URL) on both HTTP paths and both websocket
protocols, the anonymous role, row rules and hidden fields in lookups, lists,
relationships, asOf reads, compiled queries, introspection and subscriptions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr
from shop_views import (
    Record,
    catalog_on,
    expected_customers,
    isolated,
    produce,
    run_once,
    shop_events,
)
from starlette.testclient import TestClient
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from ws_clients import GatewayServer, LegacyWS, TransportWS

from gateway.app import create_app
from schema.catalog import Catalog
from schema.permissions import Grant, RowRule
from schema.settings import Settings
from viewgate.stack.process import free_port, wait_until

pytestmark = pytest.mark.integration

PREFIX = "authz"
SECRET = "integration-test-secret-long-enough-for-hs256"
TIMEOUT_S = 60.0


@dataclass
class AuthShop:
    spark: object
    settings: Settings  # authentication on: HS256 secret and a JWKS file, no anonymous role
    catalog: Catalog  # the demo grants plus `support` (see _with_support)
    customers: dict[str, dict]
    orders: dict[str, dict]
    order_version: int  # the Order view's version once every order was committed

    def commit(self, records: list[Record]) -> None:
        produce(self.settings.kafka_bootstrap, records)
        run_once(self.spark, self.settings, self.catalog)

    def order(self, key: str, **changes) -> Record:
        row = self.orders[key] = {**self.orders[key], **changes}
        return self.catalog.sources["orders"].topic, key, json.dumps(row).encode()

    def orders_of(self, customer: str) -> list[str]:
        return sorted(k for k, o in self.orders.items() if o["customer_id"] == customer)


def _with_support(catalog: Catalog) -> Catalog:
    """Constant row rules: `support` sees every order, but only gold customers; `payments`
    sees every customer, but only paid orders (a rule on another field than the join)."""
    paid = RowRule("status", value="paid")
    extra = {"Order": (Grant("support"), Grant("payments", rows=(paid,))),
             "Customer": (Grant("support", rows=(RowRule("tier", value="gold"),)),
                          Grant("payments"))}
    views = [dataclasses.replace(v, grants=(*v.grants, *extra[v.name])) if v.name in extra
             else v for v in catalog.views.values()]
    return Catalog.of(catalog.sources.values(), views)


@pytest.fixture(scope="module")
def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def jwks(rsa_key) -> dict:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    return {"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}


@pytest.fixture(scope="module")
def shop(spark, settings, tmp_path_factory, jwks) -> AuthShop:
    folder = tmp_path_factory.mktemp("auth")
    (folder / "jwks.json").write_text(json.dumps(jwks))
    settings = isolated(settings, folder, redis_db=11).model_copy(update={
        "changefeed_prefix": f"{PREFIX}.changes.",
        "auth_anonymous_role": None,
        "auth_jwt_secret": SecretStr(SECRET),
        "auth_jwks": str(folder / "jwks.json"),
    })
    catalog = _with_support(catalog_on(PREFIX))
    customers, orders = shop_events(PREFIX, seed=31, count=400)
    shop = AuthShop(spark, settings, catalog, expected_customers(customers),
                    expected_customers(orders), 0)
    shop.commit(customers)  # customers first, so orders find them (stream-static join)
    shop.commit(orders)
    with TestClient(create_app(settings, catalog)) as client:
        views = client.post("/graphql", json={"query": "{ views { name version } }"},
                            headers=auth(token("admin"))).json()["data"]["views"]
    shop.order_version = next(v["version"] for v in views if v["name"] == "Order")
    return shop


@pytest.fixture(scope="module")
def client(shop) -> Iterator[TestClient]:
    with TestClient(create_app(shop.settings, shop.catalog)) as test_client:
        yield test_client


def token(role: str | list[str], secret: str = SECRET, **claims) -> str:
    return jwt.encode({"role": role, "exp": int(time.time()) + 3600, **claims}, secret,
                      algorithm="HS256")


def auth(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def post(client: TestClient, query: str, headers: dict | None = None,
         variables: dict | None = None) -> dict:
    # A request error (validation: a field the role does not see) is 422 with `errors`,
    # whatever the client accepts (the GraphQL-over-HTTP draft's status codes).
    response = client.post("/graphql", json={"query": query, "variables": variables},
                           headers={"Accept": "application/json", **(headers or {})})
    body = response.json()
    assert response.status_code == (200 if "data" in body else 422), response.text
    return body


def data(client: TestClient, query: str, headers: dict, variables: dict | None = None) -> dict:
    body = post(client, query, headers, variables)
    assert "errors" not in body, body["errors"]
    return body["data"]


def two_customers(shop: AuthShop) -> tuple[str, str]:
    """Two customers with at least two orders each."""
    with_orders = [c for c in sorted(shop.customers) if len(shop.orders_of(c)) >= 2]
    return with_orders[0], with_orders[1]


def customer_headers(customer: str) -> dict[str, str]:
    return auth(token("customer", customer_id=customer))


# --- authentication over HTTP ---------------------------------------------------------------


def _assert_401(response, reason: str, invalid_token: bool = True) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "UNAUTHENTICATED"
    assert reason in error["message"]
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert ('error="invalid_token"' in challenge) == invalid_token
    if invalid_token:
        assert reason in challenge


def test_requests_without_a_token_are_denied_by_default(client):
    query = "{ orders(first: 1) { totalCount } }"
    _assert_401(client.post("/graphql", json={"query": query}), "authentication required",
                invalid_token=False)
    _assert_401(client.get("/graphql", params={"query": query}), "authentication required",
                invalid_token=False)
    _assert_401(client.get("/schema.graphql"), "authentication required", invalid_token=False)


def _bad_tokens(rsa_key) -> list[tuple[str, str]]:
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return [
        ("Bearer " + jwt.encode({"role": "admin", "exp": int(time.time()) - 10}, SECRET,
                                algorithm="HS256"), "the token has expired"),
        ("Bearer " + token("admin", secret="not-the-gateway-secret-but-long-enough"),
         "signature does not verify"),
        ("Bearer abc.def", "malformed token"),
        ("Bearer " + jwt.encode({"role": "admin"}, other_key, algorithm="RS256",
                                headers={"kid": "k1"}), "signature does not verify"),
        ("Bearer " + jwt.encode({"role": "admin"}, rsa_key, algorithm="RS256",
                                headers={"kid": "nope"}), "no key with kid 'nope'"),
        ("Basic YWRtaW46YWRtaW4=", "must be 'Bearer <token>'"),
    ]


def test_bad_tokens_get_401_with_the_reason_on_the_compiled_and_general_paths(
        client, shop, rsa_key):
    customer, _ = two_customers(shop)
    query = "query($id: String!) { customer(customerId: $id) { customerId name } }"
    body = {"query": query, "variables": {"id": customer}}
    for _ in range(2):  # the first run compiles the document, the second takes the plan
        ok = client.post("/graphql", json=body, headers=auth(token("admin")))
        assert ok.status_code == 200 and ok.json()["data"]["customer"]["customerId"] == customer
    assert client.app.state.fast.plans.get((query, None)) is not None
    uncompiled = ("{ orders(first: 2) { edges { node { orderId customer { stats "
                  "{ orderCount } } } } } }")
    for header, reason in _bad_tokens(rsa_key):
        headers = {"Authorization": header}
        _assert_401(client.post("/graphql", json=body, headers=headers), reason)
        _assert_401(client.get("/graphql", params={"query": query,
                                                   "variables": json.dumps(body["variables"])},
                               headers=headers), reason)
        _assert_401(client.post("/graphql", json={"query": uncompiled}, headers=headers), reason)


def test_hs256_admin_and_rs256_customer_from_a_jwks_file(client, shop, rsa_key):
    mine, theirs = two_customers(shop)
    query = "{ orders(first: 500) { totalCount edges { node { customerId } } } }"
    everything = data(client, query, auth(token("admin")))["orders"]
    assert everything["totalCount"] == len(shop.orders)
    rs256 = jwt.encode({"role": "customer", "customer_id": mine}, rsa_key, algorithm="RS256",
                       headers={"kid": "k1"})
    own = data(client, query, auth(rs256))["orders"]
    assert own["totalCount"] == len(shop.orders_of(mine))
    assert {e["node"]["customerId"] for e in own["edges"]} == {mine}


class _JWKSHandler(BaseHTTPRequestHandler):
    body = b""
    hits = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def jwks_url(jwks) -> Iterator[str]:
    _JWKSHandler.body = json.dumps(jwks).encode()
    _JWKSHandler.hits = 0
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _JWKSHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_rs256_keys_from_a_jwks_url_are_fetched_once_and_cached(shop, rsa_key, jwks_url):
    mine, _ = two_customers(shop)
    settings = shop.settings.model_copy(update={"auth_jwks": jwks_url})
    signed = jwt.encode({"role": "customer", "customer_id": mine}, rsa_key,
                        algorithm="RS256", headers={"kid": "k1"})
    query = "{ customerStatsList(first: 10) { edges { node { customerId } } } }"
    with TestClient(create_app(settings, shop.catalog)) as client:
        for _ in range(3):
            got = data(client, query, auth(signed))["customerStatsList"]["edges"]
            assert {e["node"]["customerId"] for e in got} <= {mine}
        assert _JWKSHandler.hits == 1  # fetched once, then cached
        _assert_401(client.post("/graphql", json={"query": query}, headers=auth(
            jwt.encode({"role": "admin"}, rsa_key, algorithm="RS256", headers={"kid": "k2"}))),
            "no key for this token")
    # An unknown kid may fetch the keys again only after PyJWKClient's cooldown (30 s), so
    # tokens with made-up kids cannot make the gateway hammer the identity provider.
    assert _JWKSHandler.hits == 1


def test_anonymous_role_applies_to_requests_without_a_token(shop):
    settings = shop.settings.model_copy(update={"auth_anonymous_role": "analyst"})
    with TestClient(create_app(settings, shop.catalog)) as client:
        got = data(client, "{ customers(first: 3) { edges { node { customerId tier } } } "
                   "productSalesList(first: 1) { totalCount } }", {})
        assert len(got["customers"]["edges"]) == 3 and got["productSalesList"]["totalCount"] > 0
        hidden = post(client, "{ customers(first: 1) { edges { node { name } } } }")
        assert "Cannot query field 'name' on type 'Customer'" in hidden["errors"][0]["message"]
        # A token still counts: an admin token sees the names.
        admin = data(client, "{ customers(first: 1) { edges { node { name } } } }",
                     auth(token("admin")))
        assert admin["customers"]["edges"][0]["node"]["name"]


def test_the_role_header_chooses_among_the_token_roles(client, shop):
    mine, _ = two_customers(shop)
    both = token(["customer", "analyst"], customer_id=mine)
    query = "{ productSalesList(first: 1) { totalCount } }"
    refused = post(client, query, auth(both))  # the first role, customer, has no sales
    assert "Cannot query field 'productSalesList'" in refused["errors"][0]["message"]
    assert data(client, query, {**auth(both), "x-viewgate-role": "analyst"})
    _assert_401(client.post("/graphql", json={"query": query},
                            headers={**auth(both), "x-viewgate-role": "admin"}),
                "not among the token's roles")


# --- row rules ----------------------------------------------------------------------------


def test_row_rules_in_lookups_lists_and_relationships(client, shop):
    mine, theirs = two_customers(shop)
    me = customer_headers(mine)
    lookup = "query($id: String!) { customer(customerId: $id) { customerId } " \
             "customerStats(customerId: $id) { customerId } }"
    assert data(client, lookup, me, {"id": mine})["customer"] == {"customerId": mine}
    assert data(client, lookup, me, {"id": theirs}) == {"customer": None, "customerStats": None}

    orders = data(client, "{ orders(first: 500) { totalCount edges { node { orderId "
                  "customerId } } } }", me)["orders"]
    assert orders["totalCount"] == len(shop.orders_of(mine))
    assert sorted(e["node"]["orderId"] for e in orders["edges"]) == shop.orders_of(mine)
    # The rule joins the caller's own filter: asking for another customer's orders is empty.
    other = data(client, "query($c: String!) { orders(where: {customerId: {eq: $c}}) "
                 "{ totalCount } }", me, {"c": theirs})["orders"]
    assert other["totalCount"] == 0
    placed = data(client, '{ orders(where: {status: {eq: "placed"}}, first: 500) '
                  "{ edges { node { customerId status } } } }", me)["orders"]["edges"]
    assert all(e["node"]["customerId"] == mine for e in placed)

    theirs_order = shop.orders_of(theirs)[0]
    by_key = "query($id: String!) { order(orderId: $id) { orderId customer { customerId " \
             "stats { customerId } } } }"
    assert data(client, by_key, me, {"id": theirs_order})["order"] is None
    own = data(client, by_key, me, {"id": shop.orders_of(mine)[0]})["order"]
    assert own["customer"]["customerId"] == mine
    nested = data(client, "query($id: String!) { customer(customerId: $id) "
                  "{ orders(first: 50) { orderId } } }", me, {"id": mine})["customer"]
    assert sorted(o["orderId"] for o in nested["orders"]) == shop.orders_of(mine)


def test_a_relationship_applies_the_target_views_rules(client, shop):
    # `support` sees every order but only gold customers (a constant rule).
    support = auth(token("support"))
    query = "query($id: String!) { order(orderId: $id) { orderId customer { tier } } }"
    by_tier: dict[str, dict] = {}
    for key, order in sorted(shop.orders.items()):
        customer = shop.customers.get(order["customer_id"])
        if customer is not None:
            by_tier.setdefault(customer["tier"], key)
    gold = data(client, query, support, {"id": by_tier["gold"]})["order"]
    assert gold["customer"] == {"tier": "gold"}
    other_tier = next(k for t, k in by_tier.items() if t != "gold")
    other = data(client, query, support, {"id": other_tier})["order"]
    assert other["orderId"] == other_tier and other["customer"] is None
    customers = data(client, "{ customers(first: 500) { totalCount edges { node { tier } } } }",
                     support)["customers"]
    assert customers["totalCount"] == sum(c["tier"] == "gold" for c in shop.customers.values())
    assert {e["node"]["tier"] for e in customers["edges"]} == {"gold"}


def test_a_to_many_page_holds_the_first_visible_rows(client, shop):
    # `payments` sees only paid orders: Customer.orders finds them by customer_id, and the
    # rule on status must not leave the page short of the paid orders there are.
    def paid(customer: str) -> list[str]:
        return [k for k in shop.orders_of(customer) if shop.orders[k]["status"] == "paid"]
    customer = next((c for c in sorted(shop.customers) if len(paid(c)) >= 2
                     and shop.orders_of(c)[:2] != paid(c)[:2]), None)
    assert customer is not None, "the events have no customer with unpaid orders first"
    query = ("query($id: String!) { customer(customerId: $id) "
             "{ orders(first: 2) { orderId status } } }")
    orders = data(client, query, auth(token("payments")), {"id": customer})["customer"]["orders"]
    assert [o["orderId"] for o in orders] == paid(customer)[:2]
    assert {o["status"] for o in orders} == {"paid"}


def test_row_rules_in_as_of_reads(client, shop):
    mine, theirs = two_customers(shop)
    me = customer_headers(mine)
    version = {"version": shop.order_version}
    lookup = "query($id: String!, $v: AsOfInput) { order(orderId: $id, asOf: $v) { orderId } }"
    assert data(client, lookup, me, {"id": shop.orders_of(theirs)[0], "v": version}) == {
        "order": None}
    assert data(client, lookup, me, {"id": shop.orders_of(mine)[0], "v": version})["order"]
    listed = data(client, "query($v: AsOfInput) { orders(asOf: $v, first: 500) "
                  "{ totalCount edges { node { customerId } } } }", me, {"v": version})["orders"]
    assert listed["totalCount"] == len(shop.orders_of(mine))
    assert {e["node"]["customerId"] for e in listed["edges"]} == {mine}
    # The admin's asOf read of the same version sees the other customer's order.
    assert data(client, lookup, auth(token("admin")),
                {"id": shop.orders_of(theirs)[0], "v": version})["order"]


def test_compiled_plans_answer_only_the_admin_role(client, shop):
    mine, theirs = two_customers(shop)
    lookup = "query($id: String!) { order(orderId: $id) { orderId customerId } }"
    listing = "query { orders(first: 500) { totalCount edges { node { orderId } } } }"
    admin = auth(token("admin"))
    for _ in range(2):
        assert data(client, lookup, admin, {"id": shop.orders_of(theirs)[0]})["order"]
        assert data(client, listing, admin)["orders"]["totalCount"] == len(shop.orders)
    plans = client.app.state.fast.plans
    assert plans.get((lookup, None)) is not None and plans.get((listing, None)) is not None
    me = customer_headers(mine)
    assert data(client, lookup, me, {"id": shop.orders_of(theirs)[0]})["order"] is None
    assert data(client, listing, me)["orders"]["totalCount"] == len(shop.orders_of(mine))
    got = client.get("/graphql", params={"query": listing}, headers=me).json()
    assert got["data"]["orders"]["totalCount"] == len(shop.orders_of(mine))


# --- what each role sees of the schema -----------------------------------------------------


def _type_fields(client: TestClient, headers: dict, name: str) -> set[str] | None:
    got = data(client, "query($n: String!) { __type(name: $n) { fields { name } } }", headers,
               {"n": name})["__type"]
    return None if got is None else {f["name"] for f in got["fields"]}


def test_introspection_and_sdl_show_each_role_only_what_it_may_query(client, shop):
    mine, _ = two_customers(shop)
    me, admin = customer_headers(mine), auth(token("admin"))
    assert "tier" in _type_fields(client, admin, "Customer")
    assert "tier" not in _type_fields(client, me, "Customer")
    assert "customerTier" not in _type_fields(client, me, "Order")
    assert _type_fields(client, me, "ProductSales") is None
    roots = _type_fields(client, me, "Query")
    assert {"orders", "customer", "customerStatsList"} <= roots
    assert not roots & {"productSales", "productSalesList", "system"}
    assert "productSales" in _type_fields(client, admin, "Subscription")
    assert "productSales" not in _type_fields(client, me, "Subscription")
    # A hidden field cannot be queried nor filtered on.
    for query in (f'{{ customer(customerId: "{mine}") {{ tier }} }}',
                  '{ customers(where: {tier: {eq: "gold"}}) { totalCount } }'):
        errors = post(client, query, me)["errors"]
        assert "tier" in errors[0]["message"], errors
    sdl = client.get("/schema.graphql", headers=me).text
    assert "type Customer {" in sdl and "customerTier" not in sdl and "ProductSales" not in sdl
    assert "customerTier" in client.get("/schema.graphql", headers=admin).text


def test_introspection_can_be_turned_off(shop):
    settings = shop.settings.model_copy(update={"gateway_introspection": False})
    with TestClient(create_app(settings, shop.catalog)) as client:
        admin = auth(token("admin"))
        body = post(client, "{ __schema { queryType { name } } }", admin)
        assert "introspection has been disabled" in body["errors"][0]["message"]
        assert "data" not in body or body["data"] is None
        assert data(client, "{ orders(first: 1) { __typename totalCount } }", admin)
        assert client.get("/schema.graphql", headers=admin).status_code == 404


# --- websockets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(shop, tmp_path_factory) -> Iterator[GatewayServer]:
    # `shop_views:PREFIXED_CATALOG`: the demo catalog and its grants on this module's topics.
    server = GatewayServer(shop.settings, tmp_path_factory.mktemp("auth-gateway"), PREFIX,
                           VIEWGATE_AUTH_JWT_SECRET=SECRET)
    try:
        yield server.start()
    finally:
        server.stop()


async def _closed_with(url: str, payload: dict) -> tuple[int, str]:
    async with connect(url, subprotocols=["graphql-transport-ws"]) as ws:
        await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), TIMEOUT_S)
        assert closed.value.rcvd is not None
        return closed.value.rcvd.code, closed.value.rcvd.reason


async def _legacy_error(url: str, payload: dict) -> dict:
    async with connect(url, subprotocols=["graphql-ws"]) as ws:
        await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
        return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))


def test_websocket_tokens_are_checked_in_connection_init(gateway, shop):
    expired = jwt.encode({"role": "admin", "exp": int(time.time()) - 10}, SECRET,
                         algorithm="HS256")
    forged = token("admin", secret="not-the-gateway-secret-but-long-enough")
    cases = [({}, "authentication required"),
             ({"Authorization": f"Bearer {expired}"}, "the token has expired"),
             ({"authorization": f"Bearer {forged}"}, "signature does not verify"),
             ({"authToken": "abc.def"}, "malformed token")]

    async def scenario() -> None:
        for payload, reason in cases:
            code, text = await _closed_with(gateway.url, payload)
            assert code == 4403 and reason in text, (code, text)
            message = await _legacy_error(gateway.url, payload)
            assert message["type"] == "connection_error", message
            assert reason in message["payload"]["message"]
        # A good token is acknowledged by both protocols.
        for protocol in (TransportWS, LegacyWS):
            client = await protocol.open(gateway.url, {"authToken": token("admin")})
            await client.close()
    asyncio.run(scenario())


def test_subscriptions_never_send_rows_the_subscriber_may_not_see(gateway, shop):
    mine, theirs = two_customers(shop)
    my_order, their_order = shop.orders_of(mine)[0], shop.orders_of(theirs)[0]
    changes = "subscription { orderChanges { op key row { orderId customerId status } } }"
    live_list = "subscription { orders(first: 50) { totalCount edges { node { customerId } } } }"
    live_value = "subscription($id: String!) { order(orderId: $id) { op row { orderId } } }"

    async def scenario() -> None:
        admin = await TransportWS.open(gateway.url, {"authToken": token("admin")})
        me = await TransportWS.open(
            gateway.url, {"Authorization": f"Bearer {token('customer', customer_id=mine)}"})
        them = await LegacyWS.open(
            gateway.url, {"authToken": token("customer", customer_id=theirs)})
        admin_op = await admin.subscribe(changes)
        my_changes = await me.subscribe(changes)
        my_list = await me.subscribe(live_list)
        page = await me.next(my_list)
        assert {e["node"]["customerId"] for e in page["orders"]["edges"]} == {mine}
        # Same arguments, other claims: another page, not a shared one.
        their_list = await them.subscribe(live_list)
        their_page = await them.next(their_list)
        assert {e["node"]["customerId"] for e in their_page["orders"]["edges"]} == {theirs}
        # A live value of a row the subscriber may not see is refused like a missing one.
        refused = await me.subscribe(live_value, {"id": their_order})
        error = await me.receive()
        assert error["id"] == refused and error["type"] == "error", error
        assert error["payload"][0]["extensions"]["code"] == "NOT_FOUND"
        wait_until(lambda: gateway.stats()["subscribers"] >= 4, timeout_s=30,
                   what="the subscriptions to register")

        # First their order changes, then mine, in two engine runs: the admin sees both in
        # that order; my first change message must be mine (theirs came before it).
        await asyncio.to_thread(shop.commit, [shop.order(their_order, status="refunded")])
        first = await admin.next(admin_op)
        assert first["orderChanges"]["key"] == their_order
        await asyncio.to_thread(shop.commit, [shop.order(my_order, status="refunded")])
        second = await admin.next(admin_op)
        assert second["orderChanges"]["key"] == my_order
        got: dict[str, list] = {}
        while len(got.get(my_changes, [])) < 1 or len(got.get(my_list, [])) < 1:
            message = await me.receive()
            assert message["type"] == "next", message
            got.setdefault(message["id"], []).append(message["payload"]["data"])
        mine_change = got[my_changes][0]["orderChanges"]
        assert mine_change["key"] == my_order
        assert mine_change["row"] == {"orderId": my_order, "customerId": mine,
                                      "status": "refunded"}
        assert {e["node"]["customerId"] for e in got[my_list][0]["orders"]["edges"]} == {mine}
        for client in (admin, me, them):
            await client.close()
    asyncio.run(scenario())


# --- what a role learns about views it may not read: nothing ---------------------------------


def _answer(client: TestClient, headers: dict, min_version: dict) -> tuple[int, str]:
    response = client.post("/graphql", headers={"Accept": "application/json", **headers},
                           json={"query": "{ __typename }",
                                 "extensions": {"minVersion": min_version}})
    return response.status_code, response.text


def test_min_version_answers_a_view_not_granted_as_one_that_does_not_exist(client, shop):
    mine, _ = two_customers(shop)
    me = customer_headers(mine)
    # ProductSales exists (the admin waits on it) but is not granted to customers.
    assert _answer(client, auth(token("admin")), {"ProductSales": 0})[0] == 200
    for version in (1, 999_999_999):
        status, text = _answer(client, me, {"ProductSales": version})
        assert status == 422, text  # a malformed request (GraphQL-over-HTTP draft)
        unknown = _answer(client, me, {"NoSuchView": version})
        assert (status, text.replace("ProductSales", "NoSuchView")) == unknown
        assert "VIEW_BEHIND" not in text and "ProductSales" not in text.replace(
            "'ProductSales'", "")
    # The list of views in the answer is the caller's own.
    error = json.loads(_answer(client, me, {"NoSuchView": 1})[1])["errors"][0]["message"]
    assert error.endswith("views: Customer, CustomerStats, Order"), error
    # A view the customer reads: VIEW_BEHIND names no setting.
    behind = json.loads(_answer(client, me, {"Order": 999_999_999})[1])
    assert behind["errors"][0]["extensions"]["code"] == "VIEW_BEHIND"
    assert "gateway_" not in behind["errors"][0]["message"], behind


def test_views_shows_a_role_only_its_views_and_not_the_engines_input(client, shop):
    mine, _ = two_customers(shop)
    me, admin = customer_headers(mine), auth(token("admin"))
    mine_views = data(client, "{ views { name version committedAtMs sinceCommitMs } }",
                      me)["views"]
    assert {v["name"] for v in mine_views} == {"Customer", "CustomerStats", "Order"}
    assert all(v["committedAtMs"] > 1_600_000_000_000 for v in mine_views), mine_views
    for hidden in ("kafkaOffsets", "lateEvents", "deadLetters"):
        errors = post(client, f"{{ views {{ {hidden} }} }}", me)["errors"]
        assert f"Cannot query field '{hidden}'" in errors[0]["message"], errors
    everything = data(client, "{ views { name kafkaOffsets lateEvents deadLetters "
                      "committedAtMs } }", admin)["views"]
    assert "ProductSales" in {v["name"] for v in everything}
    assert all(v["kafkaOffsets"] for v in everything), everything


def test_a_role_nothing_grants_gets_403_with_the_reason(client, shop):
    stranger = auth(token("stranger"))
    for response in (client.post("/graphql", json={"query": "{ __typename }"},
                                 headers=stranger),
                     client.get("/schema.graphql", headers=stranger)):
        assert response.status_code == 403, response.text
        error = response.json()["errors"][0]
        assert error["extensions"]["code"] == "FORBIDDEN"
        assert "role 'stranger'" in error["message"] and "no view grants it" in error["message"]
        assert 'error="insufficient_scope"' in response.headers["www-authenticate"]


def test_a_bad_list_cursor_is_not_repeated_in_the_error(client, shop):
    cursor = "bm90LWEtY3Vyc29yLXNlY3JldA"
    body = post(client, f'{{ orders(first: 1, after: "{cursor}") {{ totalCount }} }}',
                auth(token("admin")))
    error = body["errors"][0]
    assert error["extensions"]["code"] == "BAD_CURSOR" and cursor not in error["message"]
    assert error["message"].startswith("invalid cursor"), error


def test_websocket_refusals_on_both_protocols_and_the_handshake_header(gateway, shop):
    mine, _ = two_customers(shop)
    header = {"Authorization": f"Bearer {token('customer', customer_id=mine)}"}
    stranger = {"authToken": token("stranger")}
    whoami = "subscription { productSalesList(first: 1) { totalCount } }"

    async def scenario() -> None:
        # A role nothing grants: 4403 with the reason on both protocols (not 1011).
        code, reason = await _closed_with(gateway.url, stranger)
        assert code == 4403 and "no view grants it" in reason, (code, reason)
        async with connect(gateway.url, subprotocols=["graphql-ws"]) as ws:
            await ws.send(json.dumps({"type": "connection_init", "payload": {}}))
            message = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            assert message["type"] == "connection_error", message
            assert "authentication required" in message["payload"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), TIMEOUT_S)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 4403, closed.value.rcvd
            assert "authentication required" in closed.value.rcvd.reason
        # The handshake's Authorization header counts when the payload has no token...
        for protocol in (TransportWS, LegacyWS):
            client = await protocol.open(gateway.url, {}, additional_headers=header)
            op = await client.subscribe(
                "subscription($id: String!) { customer(customerId: $id) { op } }",
                {"id": mine})
            assert (await client.next(op))["customer"]["op"] == "CURRENT"
            # ...as the customer: what customers may not read is not there.
            refused = await client.subscribe(whoami)
            error = await client.receive()
            assert error["id"] == refused and error["type"] == "error", error
            await client.close()
        # The payload's token wins over the header's: here the admin's.
        admin = await TransportWS.open(gateway.url, {"authToken": token("admin")},
                                       additional_headers=header)
        op = await admin.subscribe(whoami)
        assert (await admin.next(op))["productSalesList"]["totalCount"] >= 0
        await admin.close()
    asyncio.run(scenario())
