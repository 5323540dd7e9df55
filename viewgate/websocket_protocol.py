"""uvicorn's sans-I/O websocket implementation (`websockets-sansio`) as the gateway runs it:
permessage-deflate without context takeover, and only for messages worth compressing.

With context takeover (uvicorn's choice, 12-bit windows) each connection keeps a zlib
compressor and decompressor for its whole life: about 14 KiB of resident memory per
subscription at three subscriptions a tab, more than the rest of the connection and its
subscriptions together (docs/benchmarks.md, "Browser scale"). Without it, the gateway
compresses each message on its own and keeps nothing between messages, in both
directions: it asks browsers not to take their context over either
(`client_no_context_takeover`, which RFC 7692 lets a server require). A fresh compressor
costs about 5 microseconds a message and gains nothing on a small one (a live value's
change: 141 bytes to 125), so messages under `COMPRESS_MIN_BYTES` go uncompressed, as the
extension allows per message; a page of a live list (400 bytes to 144) is compressed.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import (
    PerMessageDeflate,
    ServerPerMessageDeflateFactory,
)
from websockets.frames import Frame, Opcode
from websockets.server import ServerProtocol

WINDOW_BITS = 12  # as uvicorn's
COMPRESS_SETTINGS = {"memLevel": 5}  # as uvicorn's
COMPRESS_MIN_BYTES = 256


class SmallUncompressed(PerMessageDeflate):
    """permessage-deflate that sends a message under COMPRESS_MIN_BYTES as it is."""

    def encode(self, frame: Frame) -> Frame:
        if frame.fin and frame.opcode in (Opcode.TEXT, Opcode.BINARY) \
                and len(frame.data) < COMPRESS_MIN_BYTES:
            return frame
        return super().encode(frame)


class Deflate(ServerPerMessageDeflateFactory):
    def __init__(self) -> None:
        super().__init__(server_no_context_takeover=True, client_no_context_takeover=True,
                         server_max_window_bits=WINDOW_BITS,
                         client_max_window_bits=WINDOW_BITS,
                         compress_settings=COMPRESS_SETTINGS)

    def process_request_params(self, *args: Any, **kwargs: Any) -> Any:
        params, agreed = super().process_request_params(*args, **kwargs)
        return params, SmallUncompressed(
            agreed.remote_no_context_takeover, agreed.local_no_context_takeover,
            agreed.remote_max_window_bits, agreed.local_max_window_bits,
            agreed.compress_settings)


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config.ws_per_message_deflate:
            self.conn = ServerProtocol(extensions=[Deflate()], max_size=self.config.ws_max_size,
                                       logger=self.conn.logger)
