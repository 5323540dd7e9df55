"""Persisted queries against the real gateway and Redis, as Apollo Client sends them: a hash
alone (PersistedQueryNotFound), then the hash with the query (stored), then the hash alone
(served, by the compiled path); the GET form; a wrong hash; documents shared through Redis;
over both websocket protocols; and the persisted-only mode with a manifest and
`viewgate persist`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY
from starlette.testclient import TestClient
from ws_clients import GatewayServer, LegacyWS, TransportWS

from gateway.access.persisted import client_key
from gateway.app import create_app

pytestmark = pytest.mark.integration

LOOKUP = "query Persisted($id: String!) { customer(customerId: $id) { customerId name } }"
MANIFEST_DOC = "query Tiers($id: String!) { customer(customerId: $id) { customerId tier } }"
OPERATOR_DOC = "query Countries($id: String!) { customer(customerId: $id) { country } }"


def sha(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


def apq(document: str) -> dict:
    return {"persistedQuery": {"version": 1, "sha256Hash": sha(document)}}


@pytest.fixture(scope="module")
def client(gateway_shop) -> Iterator[TestClient]:
    with TestClient(create_app(gateway_shop.settings, gateway_shop.catalog)) as client:
        yield client


def _compiled() -> float:
    return REGISTRY.get_sample_value("viewgate_gateway_requests_total",
                                     {"operation": "Persisted", "path": "compiled"}) or 0.0


def test_the_apollo_round_trip_miss_register_hit(client, gateway_shop):
    document = LOOKUP
    key = sorted(gateway_shop.customers)[1]
    variables = {"id": key}
    expected = {"customer": {"customerId": key, "name": gateway_shop.customers[key]["name"]}}
    # 1. The hash alone: not known yet. HTTP 200, Apollo's message and code.
    miss = client.post("/graphql", json={"extensions": apq(document), "variables": variables,
                                         "operationName": "Persisted"})
    assert miss.status_code == 200
    assert miss.json() == {"errors": [{"message": "PersistedQueryNotFound",
                                       "extensions": {"code": "PERSISTED_QUERY_NOT_FOUND"}}]}
    # 2. The hash with the query: stored, and run.
    registered = client.post("/graphql", json={"query": document, "extensions": apq(document),
                                               "variables": variables,
                                               "operationName": "Persisted"})
    assert registered.status_code == 200 and registered.json()["data"] == expected
    stored = redis.Redis.from_url(gateway_shop.settings.redis_url)
    try:
        assert stored.get(client_key(sha(document))) == document.encode()
        assert 0 < stored.ttl(client_key(sha(document))) <= 7 * 24 * 3600
    finally:
        stored.close()
    # 3. The hash alone again: served, by the compiled plan the clean run made.
    before = _compiled()
    for _ in range(2):
        hit = client.post("/graphql", json={"extensions": apq(document),
                                            "variables": variables,
                                            "operationName": "Persisted"})
        assert hit.status_code == 200 and hit.json()["data"] == expected
    assert _compiled() == before + 2
    # The GET form Apollo Client uses for hashed queries.
    got = client.get("/graphql", params={"extensions": json.dumps(apq(document)),
                                         "variables": json.dumps(variables),
                                         "operationName": "Persisted"})
    assert got.status_code == 200 and got.json()["data"] == expected


def test_get_registers_and_misses_like_post(client, gateway_shop):
    document = "query { views { name } }"
    params = {"extensions": json.dumps(apq(document))}
    miss = client.get("/graphql", params=params)
    assert miss.status_code == 200
    assert miss.json()["errors"][0]["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND"
    registered = client.get("/graphql", params={**params, "query": document})
    assert registered.status_code == 200 and registered.json()["data"]["views"]
    hit = client.get("/graphql", params=params)
    assert hit.status_code == 200 and hit.json()["data"] == registered.json()["data"]


def test_a_document_stored_by_one_gateway_is_served_by_another(client, gateway_shop):
    document = "query Other { views { name version } }"
    assert client.post("/graphql", json={"query": document, "extensions": apq(document)}
                       ).status_code == 200
    # A second gateway process (an empty LRU) finds it in Redis.
    with TestClient(create_app(gateway_shop.settings, gateway_shop.catalog)) as other:
        hit = other.post("/graphql", json={"extensions": apq(document)})
        assert hit.status_code == 200 and hit.json()["data"]["views"]


@pytest.mark.parametrize("accept", ["application/json", "application/graphql-response+json"])
def test_a_hash_that_is_not_the_querys_is_a_bad_request(client, accept):
    response = client.post("/graphql", headers={"accept": accept}, json={
        "query": "{ views { name } }", "extensions": apq("{ views { version } }")})
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "BAD_REQUEST"
    assert sha("{ views { name } }") in error["message"]
    bad_version = client.post("/graphql", json={"extensions": {"persistedQuery": {
        "version": 2, "sha256Hash": sha("{ views { name } }")}}})
    assert bad_version.status_code == 400 and "version" in bad_version.json()["errors"][0][
        "message"]


def test_persisted_queries_over_both_websocket_protocols(gateway_shop, tmp_path):
    key = sorted(gateway_shop.customers)[2]
    server = GatewayServer(gateway_shop.settings, tmp_path, "gateway-test").start()

    async def scenario() -> None:
        for kind in (TransportWS, LegacyWS):
            # A document of each protocol's own, not stored yet.
            document = (f"subscription Live{kind.__name__}($id: String!) "
                        "{ customer(customerId: $id) { op } }")
            ws = await kind.open(server.url)
            payload = {"variables": {"id": key}, "extensions": apq(document)}
            await ws.send({"id": "miss", "type": kind.start_type, "payload": payload})
            error = await ws.receive()
            assert (error["type"], error["id"]) == ("error", "miss"), error
            errors = error["payload"] if kind is TransportWS else [error["payload"]]
            assert errors[0]["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND"
            await ws.send({"id": "register", "type": kind.start_type,
                           "payload": {**payload, "query": document}})
            assert (await ws.next("register"))["customer"]["op"] == "CURRENT"
            await ws.send({"id": "hit", "type": kind.start_type, "payload": payload})
            assert (await ws.next("hit"))["customer"]["op"] == "CURRENT"
            await ws.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


# Persisted-only mode.

@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("manifest") / "persisted-query-manifest.json"
    path.write_text(json.dumps({
        "format": "apollo-persisted-query-manifest", "version": 1,
        "operations": [{"id": sha(MANIFEST_DOC), "name": "Tiers", "type": "query",
                        "body": MANIFEST_DOC}]}))
    return path


@pytest.fixture(scope="module")
def only(gateway_shop, manifest) -> Iterator[TestClient]:
    settings = gateway_shop.settings.model_copy(update={
        "gateway_persisted_only": True, "gateway_persisted_manifest": manifest})
    with TestClient(create_app(settings, gateway_shop.catalog)) as client:
        yield client


def _refused(response, document: str | None = None) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "PERSISTED_QUERY_NOT_IN_LIST"
    assert "VIEWGATE_GATEWAY_PERSISTED_ONLY" in error["message"]
    if document is not None:
        assert sha(document) in error["message"]


def test_persisted_only_serves_the_manifest_and_refuses_anything_else(only, gateway_shop):
    key = sorted(gateway_shop.customers)[3]
    expected = {"customer": {"customerId": key, "tier": gateway_shop.customers[key]["tier"]}}
    variables = {"id": key}
    by_hash = only.post("/graphql", json={"extensions": apq(MANIFEST_DOC),
                                          "variables": variables})
    assert by_hash.status_code == 200 and by_hash.json()["data"] == expected
    by_text = only.post("/graphql", json={"query": MANIFEST_DOC, "variables": variables})
    assert by_text.status_code == 200 and by_text.json()["data"] == expected
    got = only.get("/graphql", params={"extensions": json.dumps(apq(MANIFEST_DOC)),
                                       "variables": json.dumps(variables)})
    assert got.status_code == 200 and got.json()["data"] == expected
    # Anything else: a new document, by text, by hash, or offered for registration.
    new = "{ views { name } }"
    _refused(only.post("/graphql", json={"query": new}))
    _refused(only.get("/graphql", params={"query": new}))
    _refused(only.post("/graphql", json={"extensions": apq(new)}), new)
    _refused(only.post("/graphql", json={"query": new, "extensions": apq(new)}), new)
    _refused(only.post("/graphql", json={"extensions": apq(new)}), new)  # still not stored


def test_viewgate_persist_registers_a_manifest_for_every_gateway(only, gateway_shop, tmp_path):
    key = sorted(gateway_shop.customers)[4]
    _refused(only.post("/graphql", json={"extensions": apq(OPERATOR_DOC),
                                         "variables": {"id": key}}))
    path = tmp_path / "more.json"
    path.write_text(json.dumps({"format": "apollo-persisted-query-manifest", "version": 1,
                                "operations": [{"id": sha(OPERATOR_DOC), "name": "Countries",
                                                "type": "query", "body": OPERATOR_DOC}]}))
    env = {**os.environ, "VIEWGATE_REDIS_URL": gateway_shop.settings.redis_url}
    done = subprocess.run([sys.executable, "-m", "viewgate", "persist", str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "registered 1 persisted documents" in done.stdout
    served = only.post("/graphql", json={"extensions": apq(OPERATOR_DOC),
                                         "variables": {"id": key}})
    assert served.status_code == 200
    assert served.json()["data"] == {"customer": {
        "country": gateway_shop.customers[key]["country"]}}
    # A manifest whose id is not its body's hash is refused, naming the operation.
    path.write_text(path.read_text().replace(sha(OPERATOR_DOC), "0" * 64))
    bad = subprocess.run([sys.executable, "-m", "viewgate", "persist", str(path)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "Countries" in bad.stdout
