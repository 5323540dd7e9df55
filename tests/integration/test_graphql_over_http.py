"""The GraphQL-over-HTTP specification's draft (graphql/graphql-over-http,
spec/GraphQLOverHTTP.md), rule by rule, against a running gateway (uvicorn, as `viewgate
gateway` runs it) over the engine's shop. Every rule a successful answer touches is checked
twice: on the general path (a document the gateway has not compiled) and on the compiled
path (the same document once learned; the metrics say which path answered), and the two
must agree. Every refusal is sent with a document that has a plan, so the compiled entry
must step aside for it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from ws_clients import GatewayServer

pytestmark = pytest.mark.integration

GQL = "application/graphql-response+json"
JSON = "application/json"
GQL_UTF8 = f"{GQL}; charset=utf-8"
JSON_UTF8 = f"{JSON}; charset=utf-8"
LOOKUP = "query {name}($id: String!) {{ customer(customerId: $id) {{ customerId name }} }}"
_names = itertools.count()


@pytest.fixture(scope="module")
def server(gateway_shop, tmp_path_factory, request) -> GatewayServer:
    # A low alias limit, so one of our validation rules can be hit on purpose.
    gateway = GatewayServer(gateway_shop.settings, tmp_path_factory.mktemp("http-spec-logs"),
                            "gateway-test", VIEWGATE_GATEWAY_MAX_ALIASES="3")
    request.addfinalizer(gateway.stop)
    return gateway.start()


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def key(gateway_shop) -> str:
    return sorted(gateway_shop.customers)[0]


def _answered_by(http: httpx.Client, operation: str) -> dict[str, float]:
    """Requests answered per path for an operation name, from /metrics."""
    counts = {"general": 0.0, "compiled": 0.0}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "viewgate_gateway_requests_total" \
                    and sample.labels.get("operation") == operation:
                counts[sample.labels["path"]] = sample.value
    return counts


def _document(http: httpx.Client, path: str) -> tuple[str, str]:
    """A lookup document and its operation name: never seen (general) or learned, with
    the next answer checked to come from its plan (compiled). Requests name the operation
    (`operationName`): the metrics count them by that name."""
    name = f"Spec{path.title()}{next(_names)}"
    query = LOOKUP.format(name=name)
    if path == "compiled":
        learn = http.post("/graphql", json={"query": query, "variables": {"id": "x"},
                                            "operationName": name}, headers={"accept": GQL})
        assert learn.status_code == 200, learn.text
        assert _answered_by(http, name) == {"general": 1.0, "compiled": 0.0}
    return name, query


def _body(query: str, variables: dict) -> bytes:
    return orjson.dumps({"query": query, "variables": variables,
                         "operationName": query.split()[1].split("(")[0]})


def _post(http: httpx.Client, query: str, variables: dict, accept: str | None) -> httpx.Response:
    headers = {"content-type": JSON} if accept is None else {"content-type": JSON,
                                                             "accept": accept}
    return http.post("/graphql", content=_body(query, variables), headers=headers)


# --- Media types of a successful answer, on both paths --------------------------------

@pytest.mark.parametrize("path", ["general", "compiled"])
@pytest.mark.parametrize(("accept", "content_type"), [
    (None, JSON_UTF8),  # no Accept: plain JSON, what older clients expect
    ("*/*", JSON_UTF8),  # curl's default: plain JSON
    (JSON, JSON_UTF8),
    (GQL, GQL_UTF8),  # asked for: the spec's own type
    (f"{GQL}, {JSON};q=0.9", GQL_UTF8),  # what the spec tells clients to send
    (f"{JSON}, {GQL};q=0.5", JSON_UTF8),  # the client's priority wins
    (f"*/*, {GQL}", GQL_UTF8),  # named beats a wildcard
])
def test_a_successful_answer_takes_the_media_type_the_client_prefers(
        http, key, gateway_shop, path, accept, content_type):
    name, query = _document(http, path)
    before = _answered_by(http, name)
    response = _post(http, query, {"id": key}, accept)
    assert response.status_code == 200, response.text
    # The spec: Content-Type names the media type and SHOULD name the encoding.
    assert response.headers["content-type"] == content_type
    assert response.json()["data"] == {"customer": {
        "customerId": key, "name": gateway_shop.customers[key]["name"]}}
    after = _answered_by(http, name)
    assert after[path] == before[path] + 1, (before, after)  # the path under test answered


@pytest.mark.parametrize("path", ["general", "compiled"])
def test_get_answers_a_query_like_post(http, key, path):
    name, query = _document(http, path)
    got = http.get("/graphql", params={"query": query, "variables": orjson.dumps(
        {"id": key}).decode(), "operationName": name, "extensions": ""},  # "" means absent
                   headers={"accept": GQL})
    posted = _post(http, query, {"id": key}, GQL)
    assert got.status_code == posted.status_code == 200
    assert got.headers["content-type"] == posted.headers["content-type"] == GQL_UTF8
    assert got.json()["data"] == posted.json()["data"]
    counts = _answered_by(http, name)
    # Compiled: both answered by the plan; general: the GET ran first, on the general path.
    assert counts["compiled"] == 2 if path == "compiled" else counts["general"] >= 1, counts


def test_a_null_optional_parameter_is_absent_and_unknown_ones_are_ignored(http, key):
    name = f"SpecNulls{next(_names)}"
    body = {"query": LOOKUP.format(name=name), "variables": {"id": key},
            "operationName": None, "extensions": None, "somethingElse": [1, 2]}
    response = http.post("/graphql", json=body, headers={"accept": GQL})
    assert response.status_code == 200, response.text
    assert response.json()["data"]["customer"]["customerId"] == key


# --- 406 and 415: media types we do not speak ------------------------------------------

@pytest.mark.parametrize("path", ["general", "compiled"])
@pytest.mark.parametrize("accept", ["text/csv", "text/html;q=0.9, application/xml",
                                    f"{GQL};q=0, {JSON};q=0"])
def test_an_accept_header_without_our_types_gets_406(http, key, path, accept):
    name, query = _document(http, path)
    response = _post(http, query, {"id": key}, accept)
    assert response.status_code == 406, response.text
    assert response.json()["errors"][0]["extensions"]["code"] == "NOT_ACCEPTABLE"
    assert _answered_by(http, name)["compiled"] == 0  # the compiled entry stepped aside


@pytest.mark.parametrize("path", ["general", "compiled"])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/graphql",
                                          "application/x-www-form-urlencoded",
                                          "application/json; charset=latin1"])
def test_a_post_body_we_do_not_read_gets_415(http, key, path, content_type):
    name, query = _document(http, path)
    headers = {"accept": GQL} if content_type is None else {"accept": GQL,
                                                            "content-type": content_type}
    # httpx sends raw content without a Content-Type of its own.
    response = http.post("/graphql", content=_body(query, {"id": key}), headers=headers)
    assert response.status_code == 415, response.text
    assert response.headers["content-type"] == GQL_UTF8
    assert _answered_by(http, name)["compiled"] == 0


def test_json_in_utf8_is_read_whatever_its_spelling(http, key):
    for content_type in (JSON, "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"):
        response = http.post("/graphql", content=orjson.dumps(
            {"query": LOOKUP.format(name="SpecCharset"), "variables": {"id": key}}),
            headers={"content-type": content_type, "accept": GQL})
        assert response.status_code == 200, (content_type, response.text)


# --- Methods: GET for queries only, 405 with Allow ------------------------------------

@pytest.mark.parametrize(("query", "operation_name"), [
    ("mutation { nothing }", None),  # the schema has no mutations: still 405, not 422
    ('subscription { customer(customerId: "x") { op } }', None),
    ('query Q { views { name } } subscription S { customerChanges { op } }', "S"),
])
def test_mutations_and_subscriptions_over_get_get_405_with_allow(http, query, operation_name):
    params = {"query": query, **({"operationName": operation_name} if operation_name else {})}
    for accept in (GQL, JSON):
        response = http.get("/graphql", params=params, headers={"accept": accept})
        assert response.status_code == 405, response.text
        assert response.headers["allow"] == "POST"
        # Not a 2xx: the watershed says it is a GraphQL response whatever the client took.
        assert response.headers["content-type"] == GQL_UTF8
        assert response.json()["errors"][0]["extensions"]["code"] == "METHOD_NOT_ALLOWED"
        assert "data" not in response.json()


def test_the_query_of_a_mixed_document_is_served_over_get(http):
    response = http.get("/graphql", params={
        "query": 'query Q { views { name } } subscription S { customerChanges { op } }',
        "operationName": "Q"}, headers={"accept": GQL})
    assert response.status_code == 200, response.text
    assert response.json()["data"]["views"]


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_other_methods_get_405_with_allow(http, method):
    response = http.request(method, "/graphql", json={"query": "{ views { name } }"},
                            headers={"accept": GQL})
    assert response.status_code == 405
    assert set(response.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


def test_a_subscription_over_post_is_refused_and_points_to_the_websocket(http):
    response = http.post("/graphql", json={"query": "subscription { customerChanges { op } }"},
                         headers={"accept": GQL})
    assert response.status_code == 422, response.text
    assert "websocket" in response.json()["errors"][0]["message"]


# --- Status codes of request errors, per media type (the watershed) --------------------

@pytest.mark.parametrize(("body", "status"), [
    (b"NONSENSE", 400),  # the body is not JSON
    (b'{"query":', 400),
    (b'{"qeury": "{ __typename }"}', 422),  # no query: not a GraphQL-over-HTTP request
    (b'{"query": 42}', 422),
    (b'{"query": "{ views { name } }", "variables": [7]}', 422),
    (b'{"query": "{ views { name } }", "variables": "{}"}', 422),  # a string, not a map
    (b'{"query": "{ views { name } }", "operationName": ["A"]}', 422),
    (b'{"query": "{ views { name } }", "extensions": 3}', 422),
    (b'[{"query": "{ views { name } }"}]', 422),  # a batch
    (b'{"query": "{"}', 400),  # the document does not parse
    (b'{"query": "{ nope }"}', 422),  # it does not validate
    (b'{"query": "{ a: views { name } b: views { name } c: views { name } d: views '
     b'{ name } }"}', 422),  # one of our own validation rules (the alias limit)
    (b'{"query": "query A { views { name } } query B { views { name } }"}', 422),  # which?
    (b'{"query": "query A { views { name } }", "operationName": "B"}', 422),
    (b'{"query": "query($id: String!) { customer(customerId: $id) { name } }"}', 422),
    (b'{"query": "query($id: String!) { customer(customerId: $id) { name } }", '
     b'"variables": {"id": 5}}', 422),  # variables that cannot be coerced
    (b'{"query": "{ views { name } }", "extensions": {"minVersion": "soon"}}', 422),
])
@pytest.mark.parametrize("accept", [GQL, JSON, "*/*", None])
def test_request_errors_get_the_spec_status_codes_for_every_media_type(http, body, status,
                                                                       accept):
    headers = {"content-type": JSON, **({"accept": accept} if accept else {})}
    response = http.post("/graphql", content=body, headers=headers)
    assert response.status_code == status, response.text
    # Not a 2xx: `application/graphql-response+json` even for a client that asked for JSON.
    assert response.headers["content-type"] == GQL_UTF8
    answer = response.json()
    assert answer["errors"] and "data" not in answer


@pytest.mark.parametrize("path", ["general", "compiled"])
def test_errors_of_a_learned_document_come_from_the_general_path(http, path):
    name, query = _document(http, path)
    for accept in (GQL, JSON):
        wrong = _post(http, query, {"id": 5}, accept)
        assert wrong.status_code == 422, wrong.text
        assert wrong.headers["content-type"] == GQL_UTF8
        missing = _post(http, query, {}, accept)
        assert missing.status_code == 422, missing.text
    assert _answered_by(http, name)["compiled"] == 0


@pytest.mark.parametrize(("query", "extensions"), [
    # A field error: data with an error.
    ('{ views { name } customers(where: {name: {eq: "x"}}) { totalCount } }', None),
    # A minimum version the view does not reach in time: data null, with an error.
    ("{ views { name } }", {"minVersion": {"Customer": 10**12}}),
])
def test_data_with_errors_is_294_for_the_spec_type_and_200_for_json(http, query, extensions):
    body = {"query": query, **({"extensions": extensions} if extensions else {})}
    partial = http.post("/graphql", json=body, headers={"accept": GQL})
    assert partial.status_code == 294, partial.text
    assert partial.headers["content-type"] == GQL_UTF8
    assert "data" in partial.json() and partial.json()["errors"]
    for accept in (JSON, "*/*", None):
        legacy = http.post("/graphql", json=body,
                           headers={"accept": accept} if accept else {})
        assert legacy.status_code == 200, legacy.text  # 294 only with the spec's type
        assert legacy.headers["content-type"] == JSON_UTF8
        assert "data" in legacy.json() and legacy.json()["errors"]


def test_a_get_without_a_query_is_422_and_a_browser_gets_graphiql(http):
    bare = http.get("/graphql", headers={"accept": GQL})
    assert bare.status_code == 422 and "no query" in bare.json()["errors"][0]["message"]
    browser = http.get("/graphql", headers={"accept": "text/html,*/*;q=0.8"})
    assert browser.status_code == 200 and "graphiql" in browser.text.lower()


def test_get_variables_that_are_not_json_get_400_and_not_a_map_422(http):
    query = "query($id: String!) { customer(customerId: $id) { name } }"
    not_json = http.get("/graphql", params={"query": query, "variables": "{id:"},
                        headers={"accept": GQL})
    assert not_json.status_code == 400, not_json.text
    not_a_map = http.get("/graphql", params={"query": query, "variables": "[1]"},
                         headers={"accept": GQL})
    assert not_a_map.status_code == 422, not_a_map.text


# --- Sizes: 413 for a body or document, 414 for a URL ----------------------------------

def test_a_body_too_large_gets_413_and_a_url_too_long_414(http, gateway_shop):
    limit = gateway_shop.settings.gateway_max_document_bytes
    document = "{ views { name } }" + " " * limit
    body = http.post("/graphql", json={"query": document}, headers={"accept": GQL})
    assert body.status_code == 413
    assert "gateway_max_document_bytes" in body.json()["errors"][0]["message"]
    url = http.get("/graphql", params={"query": document}, headers={"accept": GQL})
    assert url.status_code == 414, url.text
    assert "URL is too long" in url.json()["errors"][0]["message"]
    assert body.headers["content-type"] == url.headers["content-type"] == GQL_UTF8
