"""The ASGI app: a Strawberry GraphQL schema built from the catalog, on Starlette."""
