"""Positions in a view's change feed, as the opaque cursors subscription messages carry.

A cursor names the view, the generation its events belong to and the Kafka offset of one
event (the feed topic has one partition); resuming `after` it starts at the next offset.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import orjson

from gateway.reads.filters import QueryError

INVALID = "invalid cursor: pass the `cursor` of a message of this subscription"
CURSOR_PREFIX = "vgc1."  # tells a feed cursor from a list cursor, and versions the format


@dataclass(frozen=True)
class FeedCursor:
    view: str
    generation: int
    offset: int  # the offset of the last event the client has; -1: before the first


def encode_feed_cursor(cursor: FeedCursor) -> str:
    raw = orjson.dumps([cursor.view, cursor.generation, cursor.offset])
    return CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_feed_cursor(text: str, view: str) -> FeedCursor:
    """The cursor of a message of `view`'s feed; QueryError BAD_CURSOR otherwise."""
    try:
        if not text.startswith(CURSOR_PREFIX):
            raise ValueError("not a change-feed cursor")
        body = text[len(CURSOR_PREFIX):]
        name, generation, offset = orjson.loads(base64.urlsafe_b64decode(body + "=" * (
            -len(body) % 4)))
        if not (isinstance(name, str) and type(generation) is int and type(offset) is int):
            raise ValueError("malformed")
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise QueryError(INVALID, "BAD_CURSOR") from None
    if name != view:  # the same answer: the error names no view, nor repeats the cursor
        raise QueryError(INVALID, "BAD_CURSOR")
    return FeedCursor(name, generation, offset)
