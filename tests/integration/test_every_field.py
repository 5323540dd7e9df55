"""Every field of every type the schema exposes, served against the demo shop the real
engine wrote: the schema is walked by introspection, a document selecting every field
(scalars, and objects recursively to a bounded depth) is built for each root field of
Query and of Subscription, and the answers must have no errors and no null where the type
is non-null. So no field of the schema can break (as `committedAtMs`, an `Int` that could
not hold epoch milliseconds, did) without a test failing.

Required arguments are filled from real rows (a lookup's key from the first node of the
list of the same type); lists and relationships ask for two rows; change streams replay
from `afterVersion: -1` (every change the feed holds), so their messages carry real
changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from graphql import get_introspection_query
from starlette.testclient import TestClient
from websockets.exceptions import ConnectionClosed
from ws_clients import GatewayServer, TransportWS

from gateway.app import create_app

pytestmark = pytest.mark.integration

DEPTH = 4  # object levels below a root field; enough to reach every type (asserted)
PAGE = 2


@pytest.fixture(scope="module")
def client(gateway_shop) -> Iterator[TestClient]:
    with TestClient(create_app(gateway_shop.settings, gateway_shop.catalog)) as test_client:
        yield test_client


def _unwrap(ref: dict) -> tuple[dict, bool]:
    """(named type, non-null at the outermost level)."""
    non_null = ref["kind"] == "NON_NULL"
    while ref.get("ofType"):
        ref = ref["ofType"]
    return ref, non_null


class Walker:
    def __init__(self, schema: dict) -> None:
        self.types = {t["name"]: t for t in schema["types"]}
        self.query = schema["queryType"]["name"]
        self.subscription = (schema["subscriptionType"] or {}).get("name")
        self.covered: set[tuple[str, str]] = set()

    def selection(self, type_name: str, depth: int) -> str:
        parts = []
        for field in self.types[type_name]["fields"]:
            if any(_unwrap(a["type"])[1] and a["defaultValue"] is None for a in field["args"]):
                continue  # a nested field with required arguments: none today
            named, _ = _unwrap(field["type"])
            args = "(first: 2)" if any(a["name"] == "first" for a in field["args"]) else ""
            if named["kind"] in ("SCALAR", "ENUM"):
                parts.append(field["name"] + args)
            elif named["kind"] == "OBJECT" and depth > 0:
                inner = self.selection(named["name"], depth - 1)
                parts.append(f"{field['name']}{args} {{ {inner} }}")
            else:
                continue
            self.covered.add((type_name, field["name"]))
        return " ".join(parts) or "__typename"

    def every_field(self) -> set[tuple[str, str]]:
        """Every (type, field) of the object types reachable from the roots."""
        seen: set[str] = set()
        todo = [n for n in (self.query, self.subscription) if n]
        out: set[tuple[str, str]] = set()
        while todo:
            name = todo.pop()
            if name in seen or name.startswith("__"):
                continue
            seen.add(name)
            for field in self.types[name]["fields"]:
                out.add((name, field["name"]))
                named, _ = _unwrap(field["type"])
                if named["kind"] == "OBJECT":
                    todo.append(named["name"])
        return out

    def check(self, value: Any, type_ref: dict, path: str, problems: list[str]) -> None:
        """No null where the type is non-null, at every level of `value`."""
        if value is None:
            if type_ref["kind"] == "NON_NULL":
                problems.append(f"{path} is null but its type is non-null")
            return
        ref = type_ref["ofType"] if type_ref["kind"] == "NON_NULL" else type_ref
        if ref["kind"] == "LIST":
            for i, item in enumerate(value):
                self.check(item, ref["ofType"], f"{path}[{i}]", problems)
        elif ref["kind"] == "OBJECT":
            fields = {f["name"]: f for f in self.types[ref["name"]]["fields"]}
            for name, sub in value.items():
                self.check(sub, fields[name.split("(")[0]]["type"], f"{path}.{name}", problems)


def _introspect(client: TestClient) -> Walker:
    body = client.post("/graphql", json={"query": get_introspection_query()}).json()
    assert "errors" not in body, body["errors"]
    return Walker(body["data"]["__schema"])


def _arguments(client: TestClient, walker: Walker, field: dict) -> str | None:
    """The root field's arguments: required ones from a real row (None: no row found),
    `first`, and `afterVersion: -1` for change streams."""
    required = [a for a in field["args"]
                if _unwrap(a["type"])[1] and a["defaultValue"] is None]
    values: dict[str, Any] = {}
    if required:
        returns = _unwrap(field["type"])[0]["name"]
        returns = walker.types[returns]["fields"]
        row_type = next((_unwrap(f["type"])[0]["name"] for f in returns if f["name"] == "row"),
                        _unwrap(field["type"])[0]["name"])
        listing = next(f for f in walker.types[walker.query]["fields"]
                       if _node_type(walker, f) == row_type)
        names = " ".join(a["name"] for a in required)
        got = client.post("/graphql", json={"query": f"{{ {listing['name']}(first: 1) "
                                                     f"{{ edges {{ node {{ {names} }} }} }} }}"})
        edges = got.json()["data"][listing["name"]]["edges"]
        if not edges:
            return None
        values = edges[0]["node"]
    names = {a["name"] for a in field["args"]}
    parts = [f"{k}: {_literal(v)}" for k, v in values.items()]
    if "first" in names:
        parts.append(f"first: {PAGE}")
    if "afterVersion" in names:
        parts.append("afterVersion: -1")  # every change the feed holds
    return f"({', '.join(parts)})" if parts else ""


def _node_type(walker: Walker, field: dict) -> str | None:
    named = _unwrap(field["type"])[0]
    if named["kind"] != "OBJECT":
        return None
    edges = next((f for f in walker.types[named["name"]]["fields"] if f["name"] == "edges"),
                 None)
    if edges is None:
        return None
    edge = _unwrap(edges["type"])[0]["name"]
    node = next(f for f in walker.types[edge]["fields"] if f["name"] == "node")
    return _unwrap(node["type"])[0]["name"]


def _literal(value: Any) -> str:
    return json.dumps(value)


def _documents(client: TestClient, walker: Walker, root: str, operation: str) -> list[tuple]:
    out = []
    for field in walker.types[root]["fields"]:
        args = _arguments(client, walker, field)
        assert args is not None, f"no row to fill {field['name']}'s arguments"
        named = _unwrap(field["type"])[0]
        inner = (f" {{ {walker.selection(named['name'], DEPTH)} }}"
                 if named["kind"] == "OBJECT" else "")
        walker.covered.add((root, field["name"]))
        out.append((field, f"{operation} {{ {field['name']}{args}{inner} }}"))
    return out


def test_every_query_field_is_served_with_no_error_and_no_null_where_non_null(client):
    walker = _introspect(client)
    for field, document in _documents(client, walker, walker.query, "query"):
        body = client.post("/graphql", json={"query": document}).json()
        assert "errors" not in body, (document, body["errors"])
        problems: list[str] = []
        walker.check(body["data"][field["name"]], field["type"], field["name"], problems)
        assert not problems, (document, problems)
    subscription_fields = {(t, f) for t, f in walker.every_field()
                           if t == walker.subscription}
    missing = walker.every_field() - walker.covered - subscription_fields
    # Types reached only through Subscription (change messages) are covered below.
    missing = {(t, f) for t, f in missing if not t.endswith("Change")}
    assert not missing, f"fields no query selected (raise DEPTH?): {sorted(missing)}"
    # Times are served: committedAtMs, a Long, holds epoch milliseconds.
    views = client.post("/graphql", json={"query": "{ views { committedAtMs } }"}).json()
    assert all(v["committedAtMs"] > 1_600_000_000_000 for v in views["data"]["views"])


@pytest.fixture(scope="module")
def gateway(gateway_shop, tmp_path_factory) -> Iterator[GatewayServer]:
    server = GatewayServer(gateway_shop.settings, tmp_path_factory.mktemp("every-field"),
                           "gateway-test")
    try:
        yield server.start()
    finally:
        server.stop()


async def _first_messages(gateway: GatewayServer, documents: list[str]) -> list[dict]:
    """The first message of each document's subscription (a deadline for each)."""
    client = await TransportWS.open(gateway.url)
    try:
        out = []
        for document in documents:
            op = await client.subscribe(document)
            message: dict = {}
            while message.get("id") != op:  # skip what earlier (completed) ones still sent
                try:
                    message = await client.receive(timeout_s=60)
                except TimeoutError:
                    raise AssertionError(f"no first message in 60 s: {document}") from None
                except ConnectionClosed as closed:
                    raise AssertionError(f"connection ended ({closed}) waiting for the "
                                         f"first message of {document}; "
                                         f"{gateway.state()}") from closed
            out.append(message)
            await client.send({"id": op, "type": "complete"})
        return out
    finally:
        await client.close()


def test_every_subscription_field_is_served_with_no_error_and_no_null_where_non_null(
        client, gateway):
    walker = _introspect(client)
    assert walker.subscription is not None
    documents = _documents(client, walker, walker.subscription, "subscription")
    messages = asyncio.run(_first_messages(gateway, [d for _, d in documents]))
    for (field, document), message in zip(documents, messages, strict=True):
        assert message["type"] == "next", (document, message)
        assert "errors" not in message["payload"], (document, message["payload"]["errors"])
        data = message["payload"]["data"][field["name"]]
        problems: list[str] = []
        walker.check(data, field["type"], field["name"], problems)
        assert not problems, (document, problems)
        if field["name"].endswith("Changes"):  # a replayed change: a real commit time
            assert data["committedAtMs"] > 1_600_000_000_000, data
            assert data["op"] in ("INSERT", "UPDATE", "DELETE") and data["cursor"], data
    reached = {(t, f) for t, f in walker.every_field() if t.endswith("Change")}
    missing = reached - walker.covered
    assert not missing, f"fields no subscription selected: {sorted(missing)}"
