"""An asyncio transport's stand-in for driving uvicorn's websocket protocol in a test: what
the protocol writes is kept (and `written` set), the rest does nothing."""

from __future__ import annotations

import asyncio
from typing import Any


class Transport:
    """What uvicorn's protocol uses of an asyncio transport."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closing = False
        self.written = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.data += data
        self.written.set()

    def take(self) -> bytes:
        data, self.data = bytes(self.data), bytearray()
        return data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000),
                "sockname": ("127.0.0.1", 8000)}.get(name, default)
