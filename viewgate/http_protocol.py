"""uvicorn's httptools HTTP protocol as the gateway runs it: the same, but a connection it
upgrades to a websocket leaves nothing to the cyclic garbage collector.

uvicorn's HTTP protocol and its parser refer to each other (the parser calls back the
protocol's bound methods), and after an upgrade nothing else refers to them: each websocket
left that cycle behind, holding the connection's transport, socket and flow control
(29 objects) until a collection found it. The gateway's collector runs full passes rarely
(gateway.app.GC_THRESHOLDS): a minute of 200 tabs a second opening and closing left
thousands of them, and the gateway's memory grew with every tab that came and went
(docs/benchmarks.md, "Browser scale"). Dropping the parser once the websocket protocol has
the connection frees the HTTP protocol by reference counting, as a closed websocket is.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GatewayHttpToolsProtocol(HttpToolsProtocol):
    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        # The connection is the websocket protocol's now; this protocol reads no more.
        self.parser = None  # type: ignore[assignment]
