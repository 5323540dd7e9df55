"""Compiled lists (gateway.compiled.fastlists) answer byte for byte like the general path, on many
query shapes, and leave every error to it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app

pytestmark = pytest.mark.integration

SINCE_COMMIT = re.compile(rb'"sinceCommitMs":\d+')
NODE = "orderId amount status ts customerTier"
CONNECTION = ("totalCount edges { cursor node { " + NODE + " } } "
              "pageInfo { hasNextPage hasPreviousPage startCursor endCursor }")


def _orders(args: str, selection: str = CONNECTION) -> str:
    return f"{{ orders({args}) {{ {selection} }} }}"


SHAPES: list[tuple[str, dict | None]] = [
    (_orders("first: 100"), None),
    (_orders("where: {amount: {lt: 50}}, orderBy: {field: AMOUNT}"), None),
    (_orders("where: {amount: {lte: 50, gte: 20}}, orderBy: {field: AMOUNT, direction: DESC}"),
     None),
    (_orders("where: {amount: {gt: 400}}, first: 7"), None),
    (_orders('where: {status: {eq: "paid"}}, first: 30'), None),
    (_orders('where: {status: {in: ["shipped", "cancelled"]}}, orderBy: {field: TS}'), None),
    (_orders('where: {customerId: {prefix: "C0000"}}, orderBy: {field: CUSTOMER_ID}'), None),
    (_orders('where: {ts: {gte: "2024-01-01T00:00:00Z"}}, orderBy: {field: TS, '
             'direction: DESC}, first: 9'), None),
    (_orders('where: {status: {eq: "placed"}, amount: {gte: 100}}, '
             'orderBy: {field: AMOUNT}, first: 11'), None),  # two fields: candidates
    (_orders('where: {orderId: {in: ["NO-SUCH", "ALSO-NOT"]}}'), None),  # empty page
    (_orders("last: 6"), None),
    (_orders("orderBy: {field: STATUS, direction: DESC}, last: 5"), None),
    ("query($w: OrderWhere, $o: OrderOrderBy, $n: Int, $after: String) "
     "{ orders(where: $w, orderBy: $o, first: $n, after: $after) { " + CONNECTION + " } }",
     {"w": {"amount": {"gte": 10.5}, "status": {"in": "paid"}},
      "o": {"field": "AMOUNT", "direction": "DESC"}, "n": 4}),
    ("query($n: Int!, $before: String) { orders(last: $n, before: $before) "
     "{ edges { cursor } pageInfo { startCursor hasPreviousPage } } }", {"n": 3}),
    ("query Orders($after: String) { orders(first: 100, after: $after) "
     "{ edges { node { orderId amount customer { name } } } pageInfo { endCursor } } }",
     {"after": None}),
    ("{ __typename o: orders(first: 3) { __typename n: totalCount edges { __typename "
     "c: cursor node { __typename id: orderId customer { __typename customerId tier "
     "country } } } pageInfo { __typename hasNextPage } } }", None),
    ("{ customerStatsList(orderBy: {field: ORDER_COUNT, direction: DESC}, first: 10) "
     "{ edges { node { customerId orderCount lastOrderAt totalSpent customer { name } } } } "
     "customers(where: {tier: {eq: \"gold\"}}, first: 5) { totalCount edges { node "
     "{ customerId name stats { orderCount } } } } }", None),
    ('{ customer(customerId: "C00001") { name } orders(first: 2) { totalCount } }', None),
    ("query($v: Int!) { orders(asOf: {version: $v}, first: 3) { " + CONNECTION + " } }",
     "as_of"),
]


@pytest.fixture(scope="module")
def clients(gateway_shop) -> Iterator[tuple[TestClient, TestClient]]:
    general = create_app(gateway_shop.settings, gateway_shop.catalog, fast_path=False)
    fast = create_app(gateway_shop.settings, gateway_shop.catalog)
    with TestClient(general) as slow_client, TestClient(fast) as fast_client:
        yield slow_client, fast_client


def _answer(client: TestClient, query: str, variables: dict | None) -> bytes:
    response = client.post("/graphql", json={"query": query, "variables": variables})
    assert response.status_code == 200, response.text
    return SINCE_COMMIT.sub(b'"sinceCommitMs":0', response.content)


def _general_refused(monkeypatch, client: TestClient) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the general path ran for a compiled query")
    monkeypatch.setattr(client.app.state.schema, "execute", refuse)


@pytest.mark.parametrize(("query", "variables"), SHAPES)
def test_compiled_lists_answer_byte_for_byte_like_the_general_path(
        clients, gateway_shop, monkeypatch, query, variables):
    slow, fast = clients
    if variables == "as_of":
        variables = {"v": gateway_shop.order_versions[0]}
    expected = _answer(slow, query, variables)
    assert b'"errors"' not in expected
    assert _answer(fast, query, variables) == expected  # learns the plan
    assert fast.app.state.fast.plans[(query, None)] is not None
    with monkeypatch.context() as patch:
        _general_refused(patch, fast)
        assert _answer(fast, query, variables) == expected
    # Pages further on, through cursors the compiled answer gave.
    if "endCursor" in query and "$after" in query:
        cursor = re.search(rb'"endCursor":"([^"]+)"', expected)
        if cursor:
            later = {**(variables or {}), "after": cursor.group(1).decode()}
            assert _answer(fast, query, later) == _answer(slow, query, later)


def test_uncompilable_shapes_stay_on_the_general_path(clients):
    _, fast = clients
    for query in ("{ orders { edges { node { customer { orders(first: 2) { orderId } } } } } }",
                  "{ orders { ...F } } fragment F on OrderConnection { totalCount }",
                  "{ orders { edges { node { orderId @include(if: true) } } } }"):
        _answer(fast, query, None)
        assert fast.app.state.fast.plans[(query, None)] is None


@pytest.fixture(scope="module")
def limited(gateway_shop) -> Iterator[TestClient]:
    settings = gateway_shop.settings.model_copy(update={
        "gateway_max_cost": 150, "gateway_max_page_size": 100})
    with TestClient(create_app(settings, gateway_shop.catalog)) as client:
        yield client


@pytest.mark.parametrize(("variables", "code"), [
    ({"n": 101}, "LIMIT_PAGE_SIZE"),
    ({"n": -1}, "BAD_PAGE"),
    ({"n": 5, "after": "not-a-cursor"}, "BAD_CURSOR"),
    ({"n": "five"}, None),  # a variable of the wrong type: graphql-core's own error
])
def test_errors_of_a_learned_list_come_from_the_general_path(limited, variables, code):
    query = ("query($n: Int, $after: String) { orders(first: $n, after: $after) "
             "{ edges { node { orderId } } } }")
    assert "errors" not in limited.post("/graphql", json={"query": query,
                                                          "variables": {"n": 2}}).json()
    assert limited.app.state.fast.plans[(query, None)] is not None
    body = limited.post("/graphql", json={"query": query, "variables": variables}).json()
    assert body["errors"], body
    if code is not None:
        assert body["errors"][0]["extensions"]["code"] == code


def test_the_cost_limit_holds_for_a_learned_plan(limited):
    query = ("query($n: Int, $m: Int) { a: orders(first: $n) { totalCount } "
             "b: customers(first: $m) { totalCount } }")
    ok = limited.post("/graphql", json={"query": query, "variables": {"n": 10, "m": 10}})
    assert "errors" not in ok.json()
    over = limited.post("/graphql", json={"query": query, "variables": {"n": 100, "m": 100}})
    assert over.status_code == 422 and over.json()["errors"][0]["extensions"]["code"] \
        == "LIMIT_COST"


def test_compiled_answers_keep_the_http_semantics(clients):
    _, fast = clients
    query = "query($n: Int) { orders(first: $n) { totalCount } }"
    body = {"query": query, "variables": {"n": 2}}
    fast.post("/graphql", json=body)
    assert fast.app.state.fast.plans[(query, None)] is not None
    for accept in ("application/json", "application/graphql-response+json"):
        response = fast.post("/graphql", json=body, headers={"accept": accept})
        assert response.status_code == 200
        assert response.headers["content-type"] == f"{accept}; charset=utf-8"
    got = fast.get("/graphql", params={"query": query, "variables": '{"n": 2}'},
                   headers={"accept": "application/json"})
    assert got.status_code == 200 and got.json()["data"]["orders"]["totalCount"] > 0
    assert fast.post("/graphql", json=body, headers={"accept": "text/csv"}).status_code == 406
    text = fast.post("/graphql", content=orjson.dumps(body),
                     headers={"content-type": "text/plain"})
    assert text.status_code == 415
    put = fast.put("/graphql", json=body)
    assert put.status_code == 405
    wrong = fast.post("/graphql", json={"query": query, "variables": {"n": "x"}},
                      headers={"accept": "application/graphql-response+json"})
    assert wrong.status_code == 422 and wrong.json()["errors"]
