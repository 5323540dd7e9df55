"""GraphQL over HTTP: methods, media types, status codes, GraphiQL, the SDL, introspection
rebuilt by a client, limits, minimum versions and the compiled point-query path."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from graphql import build_client_schema, build_schema, get_introspection_query, print_schema
from graphql.utilities import lexicographic_sort_schema
from graphql_client import data, gql
from starlette.testclient import TestClient

from gateway.app import create_app
from viewgate.stack.graphql_js import ensure_graphql_js

pytestmark = pytest.mark.integration

GQL = "application/graphql-response+json"
LOOKUP = "query($id: String!) { customer(customerId: $id) { customerId name } }"


def _post(client, body, accept=GQL, **kwargs):
    return client.post("/graphql", json=body, headers={"accept": accept}, **kwargs)


def test_get_and_post_answer_the_same(gateway_client, gateway_shop):
    key = sorted(gateway_shop.customers)[0]
    posted = _post(gateway_client, {"query": LOOKUP, "variables": {"id": key}})
    got = gateway_client.get("/graphql", params={"query": LOOKUP,
                                                 "variables": f'{{"id": "{key}"}}'},
                             headers={"accept": GQL})
    assert posted.status_code == got.status_code == 200
    assert posted.headers["content-type"] == got.headers["content-type"] == \
        f"{GQL}; charset=utf-8"
    assert posted.json()["data"] == got.json()["data"] == {
        "customer": {"customerId": key, "name": gateway_shop.customers[key]["name"]}}


@pytest.mark.parametrize(("body", "status"), [
    ({"query": "{ customer(customerId: "}, 400),  # does not parse
    ({"query": "{ customer(customerId: \"x\") { nope } }"}, 422),  # unknown field
    ({"query": LOOKUP, "variables": {"id": 5}}, 422),  # variable of the wrong type
    ({"query": LOOKUP}, 422),  # required variable missing
    ({"query": "query A { views { name } }", "operationName": "B"}, 422),
    ({"query": "{ a: views { name } b: views { name } c: views { name } d: views { name } }"},
     422),  # over the alias limit of this app
    ({"variables": {}}, 422),  # no query: not a GraphQL-over-HTTP request at all
    ({"query": 12}, 422),
    ({"query": "{ views { name } }", "variables": "[1]"}, 422),
])
def test_request_errors_get_the_media_types_status_codes(limited_client, body, status):
    # The same status for both media types, and a GraphQL response that is not a 2xx says
    # so with its media type (the spec's watershed): test_graphql_over_http.py has the rest.
    for accept in (GQL, "application/json"):
        response = _post(limited_client, body, accept)
        assert response.status_code == status, (accept, response.text)
        assert response.headers["content-type"] == f"{GQL}; charset=utf-8"
        answer = response.json()
        assert answer["errors"] and "data" not in answer


def test_malformed_http_requests(gateway_client):
    bad_json = gateway_client.post("/graphql", content=b"{nope",
                                   headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["errors"]
    text = gateway_client.post("/graphql", content=b"{ views { name } }",
                               headers={"content-type": "text/plain"})
    assert text.status_code == 415
    refused = gateway_client.post("/graphql", json={"query": "{ views { name } }"},
                                  headers={"accept": "text/csv"})
    assert refused.status_code == 406
    put = gateway_client.put("/graphql", json={"query": "{ views { name } }"})
    assert put.status_code == 405
    mutation = gateway_client.get("/graphql", params={"query": "mutation { x }"},
                                  headers={"accept": GQL})
    assert mutation.status_code == 405 and mutation.headers["allow"] == "POST"
    assert mutation.json()["errors"]


def test_field_errors_keep_data_with_status_294(gateway_client):
    response = _post(gateway_client, {"query": '{ views { name } customers(where: {name: '
                                               '{eq: "x"}}) { totalCount } }'})
    assert response.status_code == 294  # the spec's Partial Success (application/json: 200)
    body = response.json()
    assert body["data"] is None or "views" in body["data"]
    assert body["errors"][0]["path"] == ["customers"]


def test_graphiql_for_browsers_and_the_sdl(gateway_client):
    page = gateway_client.get("/graphql", headers={"accept": "text/html"})
    assert page.status_code == 200 and "graphiql" in page.text.lower()
    sdl = gateway_client.get("/schema.graphql")
    assert sdl.status_code == 200
    assert "type Customer {" in sdl.text and "input OrderWhere {" in sdl.text


def test_introspection_rebuilds_the_schema_in_a_client(gateway_client):
    # graphql-core's build_client_schema is a port of graphql-js's: what codegen tools run.
    introspection = data(gateway_client, get_introspection_query(
        descriptions=True, specified_by_url=True, directive_is_repeatable=True,
        input_value_deprecation=True, one_of=True))
    rebuilt = build_client_schema(introspection)
    served = build_schema(gateway_client.get("/schema.graphql").text)
    assert print_schema(lexicographic_sort_schema(rebuilt)) == print_schema(
        lexicographic_sort_schema(served))
    assert rebuilt.get_type("CustomerConnection").fields["pageInfo"]


def test_introspection_rebuilds_the_schema_in_graphql_js(gateway_client, gateway_shop):
    # The reference implementation, as JavaScript clients and codegen run it; installed with
    # npm into the cache folder once (a missing node or npm fails, naming what to install).
    modules = ensure_graphql_js(gateway_shop.settings.cache_dir)
    introspection = data(gateway_client, get_introspection_query(
        descriptions=True, specified_by_url=True, directive_is_repeatable=True,
        input_value_deprecation=True, one_of=True))
    queries = {
        "list": 'query($after: String) { orders(where: {status: {in: ["paid"]}, amount: '
                '{gte: 10}}, orderBy: {field: AMOUNT, direction: DESC}, first: 5, after: '
                '$after) { totalCount edges { cursor node { orderId ts customer { name '
                'stats { orderCount } } } } pageInfo { hasNextPage endCursor } } }',
        "lookup": '{ productSales(productId: "P1", windowStart: "2024-01-01T00:00:00Z") '
                  '{ orderCount } customer(customerId: "C1", asOf: {version: 3}) { name } }',
        "unknown_field": "{ orders { edges { node { nope } } } }",
        "bad_argument": "{ orders(where: {amount: {eq: \"x\"}}) { totalCount } }",
    }
    request = {"introspection": introspection, "queries": queries,
               "sdl": gateway_client.get("/schema.graphql").text}
    script = Path(__file__).with_name("introspection_check.cjs")
    result = subprocess.run(["node", str(script)], input=json.dumps(request), text=True,
                            capture_output=True, timeout=60,
                            env={**os.environ, "NODE_PATH": str(modules)})
    assert result.returncode == 0, result.stderr
    checked = json.loads(result.stdout)
    assert checked["rebuilt"] == checked["served"]
    assert "type OrderConnection {" in checked["rebuilt"]
    errors = checked["errors"]
    assert errors["list"] == [] and errors["lookup"] == []
    assert 'Cannot query field "nope" on type "Order".' in errors["unknown_field"]
    assert errors["bad_argument"], "graphql-js must refuse a string for a Float"


@pytest.fixture(scope="module")
def limited_client(gateway_shop):
    settings = gateway_shop.settings.model_copy(update={
        "gateway_max_aliases": 3, "gateway_max_depth": 5, "gateway_max_tokens": 200,
        "gateway_max_document_bytes": 2000, "gateway_max_cost": 300,
        "gateway_max_page_size": 100, "gateway_min_version_wait_ms": 300})
    with TestClient(create_app(settings, gateway_shop.catalog)) as client:
        yield client


@pytest.mark.parametrize(("query", "code"), [
    ("{ a: views { name } b: views { name } c: views { name } d: views { name } }",
     "LIMIT_ALIASES"),
    ("{ orders { edges { node { customer { orders { customer { orders { orderId } } } } } } } }",
     "LIMIT_DEPTH"),
    ("{ views { " + "name " * 300 + "} }", "LIMIT_TOKENS"),
    ("{ orders(first: 101) { totalCount } }", "LIMIT_PAGE_SIZE"),
    ("{ customers(first: 50) { edges { node { orders(first: 10) { orderId } } } } }",
     "LIMIT_COST"),
])
def test_each_limit_names_itself(limited_client, query, code):
    response = _post(limited_client, {"query": query})
    assert response.status_code == 422
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == code, error


def test_the_document_size_limit(limited_client):
    response = _post(limited_client, {"query": "{ views { name } }" + " " * 3000})
    assert response.status_code == 413
    assert "gateway_max_document_bytes" in response.json()["errors"][0]["message"]


def test_minimum_version_already_reached_answers_at_once(gateway_client, gateway_shop):
    version = gateway_shop.order_versions[-1]
    body = gql(gateway_client, "{ orders(first: 1) { totalCount } }",
               extensions={"minVersion": {"Order": version}})
    assert body["extensions"]["freshness"]["Order"]["version"] >= version


def test_minimum_version_out_of_reach_says_how_far_behind(limited_client, gateway_shop):
    version = gateway_shop.order_versions[-1]
    body = gql(limited_client, "{ orders(first: 1) { totalCount } }",
               extensions={"minVersion": {"Order": version + 5}})
    assert body["data"] is None
    error = body["errors"][0]
    assert error["extensions"]["code"] == "VIEW_BEHIND"
    assert error["extensions"]["views"] == [{"view": "Order", "version": version,
                                             "requested": version + 5, "behind": 5}]
    assert "5 behind" in error["message"]
    bad = limited_client.post("/graphql", json={"query": "{ views { name } }",
                                                "extensions": {"minVersion": {"Nope": 1}}})
    assert bad.status_code == 422


def test_the_compiled_point_query_answers_exactly_like_the_general_path(gateway_shop):
    general = create_app(gateway_shop.settings, gateway_shop.catalog, fast_path=False)
    fast = create_app(gateway_shop.settings, gateway_shop.catalog)
    queries = [
        (LOOKUP, {"id": key}) for key in sorted(gateway_shop.customers)[:3]
    ] + [
        (LOOKUP, {"id": "NO-SUCH"}),
        ('{ c: customerStats(customerId: "C00001") { __typename lastOrderAt total: totalSpent '
         'orderCount } o: order(orderId: "' + sorted(gateway_shop.orders)[0] + '") '
         '{ ts amount customerTier } }', None),
    ]
    with TestClient(general) as slow_client, TestClient(fast) as fast_client:
        for query, variables in queries:
            answers = []
            for client in (slow_client, fast_client, fast_client):  # learn, then compiled
                body = _post(client, {"query": query, "variables": variables}).json()
                for seen in body["extensions"]["freshness"].values():
                    seen.pop("sinceCommitMs")
                answers.append(body)
            assert answers[0] == answers[1] == answers[2]
        plans = fast.state.fast.plans
        assert sum(plan is not None for plan in plans.values()) >= 2
        wrong = _post(fast_client, {"query": LOOKUP, "variables": {"id": 7}})
        assert wrong.status_code == 422, "a bad variable falls back to the general path"


def test_concurrent_requests_do_not_share_state(gateway_client, gateway_shop):
    keys = sorted(gateway_shop.customers)[:8]
    results: dict[str, str] = {}

    def ask(key: str) -> None:
        body = data(gateway_client, LOOKUP, {"id": key})
        results[key] = body["customer"]["customerId"]

    threads = [threading.Thread(target=ask, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {k: k for k in keys}


def test_the_dashboard_page_and_its_bundle_are_served(gateway_client, gateway_shop, tmp_path):
    from viewgate.stack.dashboard import build_dashboard

    build_dashboard()
    page = gateway_client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/dashboard/dashboard.js">' in page.text
    bundle = gateway_client.get("/dashboard/dashboard.js")
    assert bundle.status_code == 200
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert "customerStatsList" in bundle.text  # the live list it subscribes to
    # A gateway whose dashboard folder was never built says how to build it.
    unbuilt = gateway_shop.settings.model_copy(update={"gateway_dashboard_dir": tmp_path})
    with TestClient(create_app(unbuilt, gateway_shop.catalog)) as client:
        answer = client.get("/dashboard")
    assert answer.status_code == 503 and "viewgate setup" in answer.text


def _samples(client) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def test_metrics_count_requests_per_operation_errors_and_redis_reads(gateway_client,
                                                                     gateway_shop):
    key = sorted(gateway_shop.customers)[0]
    named = "query Lookup($id: String!) { customer(customerId: $id) { customerId name } }"
    before = _samples(gateway_client)
    for _ in range(3):  # the first run is general, then the plan answers
        body = {"query": named, "variables": {"id": key}, "operationName": "Lookup"}
        assert _post(gateway_client, body).status_code == 200
    bad = gateway_client.post(
        "/graphql", json={"query": "query Bad { customer(customerId: \"x\") { nope } }"},
        headers={"accept": GQL, "x-request-id": "req-7"})
    assert bad.headers["x-request-id"] == "req-7"
    after = _samples(gateway_client)

    def grew(name: str, **labels: str) -> float:
        k = (name, tuple(sorted(labels.items())))
        return after.get(k, 0) - before.get(k, 0)

    assert grew("viewgate_gateway_requests_total", operation="Lookup", path="general") >= 1
    assert grew("viewgate_gateway_requests_total", operation="Lookup", path="compiled") >= 1
    assert grew("viewgate_gateway_request_duration_seconds_count", operation="Lookup") == 3
    assert grew("viewgate_gateway_errors_total", kind="REQUEST") == 1
    assert grew("viewgate_gateway_redis_rows_total", result="hit") >= 3


def test_readyz_checks_redis_the_feed_and_that_views_committed(gateway_client, gateway_shop):
    answer = gateway_client.get("/readyz").json()
    assert answer["redis"] == "ok" and answer["changeFeed"] == "ok"
    assert set(answer["views"]) == set(gateway_shop.catalog.views)
    assert gateway_client.get("/healthz").status_code == 200
    # A gateway over a Redis database no engine ever wrote to: no view committed.
    empty = gateway_shop.settings.model_copy(update={
        "redis_url": gateway_shop.settings.redis_url.rsplit("/", 1)[0] + "/13"})
    with TestClient(create_app(empty, gateway_shop.catalog)) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert set(response.json()["views"].values()) == {"never committed"}
