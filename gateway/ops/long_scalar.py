"""`Long`: the GraphQL scalar of the schema's epoch-millisecond times, durations in
milliseconds and event counts, which outgrow `Int` (32 bits: now in epoch milliseconds is
about 1.7e12, `Int` stops at 2.1e9).

A value is a JSON integer, as `Int` is, so clients read `committedAtMs` as the number its
name promises (`new Date(committedAtMs)` in JavaScript). It holds signed 64-bit values;
JavaScript numbers hold every integer up to 2^53 exactly, which epoch milliseconds reach in
the year 287,396. Lives in `ops`, the lowest of the gateway's packages, because `ops`'
`views` query serves it as well as the change messages.
"""

from __future__ import annotations

from typing import Any, NewType

import strawberry
from graphql import IntValueNode, StringValueNode

LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1


def _serialize(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Long cannot represent {value!r}: not an integer")
    if not LONG_MIN <= value <= LONG_MAX:
        raise TypeError(f"Long cannot represent {value}: outside signed 64 bits")
    return value


def _parse_value(value: Any) -> int:
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)  # a client that sends 64-bit values as strings
    return _serialize(value)


def _parse_literal(node: Any, _variables: Any = None) -> int:
    if isinstance(node, IntValueNode | StringValueNode):
        return _parse_value(node.value if isinstance(node, StringValueNode) else int(node.value))
    raise TypeError("Long takes an integer")


# Annotate fields with `Long`; a schema serves it with `LONG_SCALARS` in its config's
# `scalar_map` (gateway.app).
Long = NewType("Long", int)

LONG_SCALARS = {Long: strawberry.scalar(
    name="Long",
    description=("A signed 64-bit integer, as a JSON number: epoch milliseconds (UTC), "
                 "durations in milliseconds and counts that outgrow Int."),
    serialize=_serialize,
    parse_value=_parse_value,
    parse_literal=_parse_literal,
)}
