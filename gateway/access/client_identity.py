"""Who a request comes from, for per-client limits: its bearer token, hashed (so the same
token shares one bucket whichever address it comes from, and no token is kept in Redis),
or else its address: the connection's, or the last one in a trusted proxy's header."""

from __future__ import annotations

import hashlib
from collections.abc import MutableMapping
from typing import Any

# Where the per-client entry (gateway.http.limit_entry) leaves a websocket's client key in
# its ASGI scope, for the websocket handlers (gateway.subscriptions.ws_admission).
CLIENT_SCOPE_KEY = "viewgate.client"


def client_key(scope: MutableMapping[str, Any], address_header: str | None = None) -> str:
    """`token:<sha256 prefix>` or `addr:<address>` for an ASGI http or websocket scope."""
    header = address_header.lower().encode("latin-1") if address_header else None
    forwarded = None
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                digest = hashlib.sha256(token.strip().encode()).hexdigest()[:32]
                return f"token:{digest}"
        elif name == header:
            forwarded = value.decode("latin-1")
    if forwarded is not None:
        # The proxy appends the address it saw; earlier entries are the client's to forge.
        address = forwarded.split(",")[-1].strip()
        if address:
            return f"addr:{address}"
    client = scope.get("client")
    return f"addr:{client[0]}" if client else "addr:unknown"
