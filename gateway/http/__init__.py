"""The HTTP entry, general path: GraphQL over HTTP on `/graphql` (GET and POST, media
type negotiation, status codes, GraphiQL), bounded request bodies, and the per-client
entry in front of `/graphql` (rate limit of requests, open websockets per client).

May import: `types`, `access`, `reads`, `ops` and `schema`. Not `compiled`: compiled
plans are handed in by `gateway.app` (GraphQLHTTP's `fast`), and not `subscriptions`.
"""
