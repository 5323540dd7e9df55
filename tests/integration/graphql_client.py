"""Posting GraphQL to the app under test."""

from __future__ import annotations

from starlette.testclient import TestClient


def gql(client: TestClient, query: str, variables: dict | None = None, **extra) -> dict:
    """POST a query; the JSON answer (asserting HTTP 200)."""
    response = client.post("/graphql", json={"query": query, "variables": variables, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def data(client: TestClient, query: str, variables: dict | None = None, **extra) -> dict:
    """The `data` of a query that must succeed without errors."""
    body = gql(client, query, variables, **extra)
    assert "errors" not in body, body["errors"]
    return body["data"]
