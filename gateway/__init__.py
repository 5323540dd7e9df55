"""The ASGI app: a Strawberry GraphQL schema built from the catalog, on Starlette.

One package per concern, lowest first; a package imports only the packages listed
after "may import" (and `schema`, never `engine`). tests/unit/test_import_rules.py
holds the same rule and fails on an import that breaks it.

- `ops`: metrics, readiness, the `system`/`views` status, the dashboard page, the
  start-up check. May import nothing else of the gateway.
- `reads`: rows of views from Redis and Delta, indexes, filters, lists, to-many
  relations, freshness. May import `ops`.
- `access`: tokens, roles and their schemas, row rules, document limits, rate limits,
  persisted queries, client identity. May import `reads`, `ops`.
- `types`: the Strawberry types and root fields built from the catalog. May import
  `access`, `reads`, `ops`.
- `http`: GraphQL over HTTP, the general path, and the per-client entry in front of
  `/graphql`. May import `types`, `access`, `reads`, `ops`.
- `subscriptions`: the change feed, fan-out, subscribers, live lists, resume cursors,
  both websocket protocols. May import `types`, `access`, `reads`, `ops`.
- `compiled`: compiled plans answering what the general path answers, byte for byte,
  and their lean HTTP entry. May import `http`, `types`, `access`, `reads`, `ops`.

`app.py` is the one module that wires them; `baseline.py` is the bare-Starlette
endpoint the gateway's speed is measured against. Nothing in the gateway imports
either: only entry points (`viewgate gateway`, uvicorn factories) and tests do.
"""
