"""uvicorn's httptools HTTP protocol as the gateway runs it: the same, but a websocket
upgrade takes its turn at the opening gate (viewgate.opening_gate), and a connection it
upgrades leaves nothing to the cyclic garbage collector.

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

from gateway.access.client_identity import client_key
from schema.settings import get_settings
from viewgate.opening_gate import OpeningGate, gate_of


class GatewayHttpToolsProtocol(HttpToolsProtocol):
    gate: OpeningGate | None = None  # while its upgrade waits
    client: str = ""  # whose line it waits in (the per-client limits' key)
    early: bytes = b""  # what the client sent while its upgrade waited (it should not)

    def handle_websocket_upgrade(self) -> None:
        settings = get_settings()
        gate = gate_of(self.server_state, self.loop, settings.gateway_ws_opening_lag_ms / 1000)
        if gate is None or gate.admit_now():
            self._upgrade()
            return
        # Reading goes on, so that a client leaving is seen (connection_lost) and
        # forgotten; it sends nothing more before the answer.
        self.gate = gate
        self.client = client_key(self.scope, settings.gateway_client_address_header)
        gate.wait(self, self.client)

    def upgrade_now(self) -> None:
        """The opening gate's turn for a waiting upgrade."""
        self.gate = None
        if self.transport.is_closing():
            return
        try:
            self._upgrade()
        except Exception:
            self.transport.close()  # as uvicorn would have: this connection only
            raise
        early, self.early = self.early, b""
        if early:
            self.transport.get_protocol().data_received(early)

    def _upgrade(self) -> None:
        super().handle_websocket_upgrade()
        # The connection is the websocket protocol's now; this protocol reads no more.
        self.parser = None  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.gate is None:
            super().data_received(data)
        elif len(self.early) + len(data) > MAX_EARLY_BYTES:
            self.transport.close()  # not a websocket client waiting for its answer
        else:
            self.early += data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gate is not None:  # gone while its upgrade waited
            self.gate.forget(self, self.client)
            self.gate = None
        super().connection_lost(exc)


MAX_EARLY_BYTES = 64 * 1024
