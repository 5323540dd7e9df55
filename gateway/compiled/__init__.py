"""The compiled path: plans that answer what the general path (gateway.http) answers,
byte for byte, without parsing, validating or executing the document again.

Which documents: a query that already ran cleanly through the general path for the
admin role, made only of lookups by key selecting scalar fields (fastpath) and of
Relay connections whose nodes select scalar fields and to-one relationships (fastlists),
is compiled once into a plan (what fastlayout lays out, with the schema's own scalar
serializers). Anything else, a caller of another role, a `minVersion`, and any surprise
while running a plan (a variable of the wrong type, a limit now exceeded, a read error)
goes to the general path, which answers with its own status codes and errors.
fast_http is the lean ASGI entry in front of the router that sends a plan's bytes.

How the tests guard it: tests/integration/test_gateway_compiled.py runs each of many
list shapes through an app without plans and one with them and compares the response
bytes (only `sinceCommitMs` masked), then makes the general path raise and compares
again, so a learned plan must answer alone and exactly; it also checks which shapes stay
uncompiled and that errors and limits still come from the general path.
test_gateway_http.py compares compiled point queries with the general path's answers;
test_auth.py, test_persisted_queries.py and test_rate_limits.py check that plans answer
only the admin role, serve persisted queries and are rate limited.

May import: `http` (the general path it falls back to), `types`, `access`, `reads`,
`ops` and `schema`. Only `gateway.app` imports it.
"""
