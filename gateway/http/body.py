"""Reading a request body with a bound: a body longer than the limit is refused by its
Content-Length before a byte of it is read, and a chunked body (no Content-Length) as
soon as what arrived passes the limit, so no client makes the gateway buffer more."""

from __future__ import annotations

from starlette.requests import Request


class BodyTooLarge(Exception):
    pass


class BadContentLength(Exception):
    pass


async def read_limited(request: Request, limit: int, setting: str) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise BadContentLength(f"Content-Length {declared!r} is not a number")
        if int(declared) > limit:
            raise BodyTooLarge(f"the request body is {int(declared)} bytes; the limit is "
                               f"{limit} ({setting})")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes "
                               f"({setting})")
        chunks.append(chunk)
    return b"".join(chunks)
