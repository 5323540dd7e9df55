"""Operating the gateway: Prometheus metrics (/metrics), readiness (/readyz), the
`system` and `views` status queries, the /dashboard page and the start-up check of each
view against what the engine wrote.

May import: `schema` only, nothing else of the gateway, so every other package may
record metrics here.
"""
