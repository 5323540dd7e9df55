"""The Strawberry types and root fields built from the catalog: a view's type, its
lookup and list fields, relationships, and the request context their resolvers read.

May import: `access` (row rules), `reads`, `ops` and `schema`.
"""
