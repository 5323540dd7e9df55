"""One readable line for why a streaming query failed.

Spark wraps an error raised in a foreachBatch function in its own message, with the Python
traceback and a dump of the query in between; the line that says what went wrong is the
traceback's last one ("redis.exceptions.ConnectionError: Error 111 connecting ...")."""

from __future__ import annotations

import re

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*")
_MAX_CHARS = 500


def summarize(error: str) -> str:
    text = error.split("=== Streaming Query ===")[0]
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    found = [line for line in lines if _EXCEPTION_LINE.match(line)]
    chosen = found[-1] if found else (lines[0] if lines else "unknown error")
    return chosen[:_MAX_CHARS]
