"""What a streaming query's batch function holds beside it (Kafka producers, Redis clients,
a Delta table's key index, a read-ahead process), released once its query has stopped.

Spark keeps a query's foreachBatch function referenced from the JVM (through Py4J) after
the query stops, until the JVM collects its proxy, which a long-running engine may never
do. Every restart of a query in one process (after a failure: Kafka or Redis down for a
while; after a rebuild switched its views) left the old function's producers, their
threads and its tables' key indexes behind. Each query's resources are therefore held
here and released explicitly, but only once that query is no longer active: a rebuild run
in the process of a live engine starts queries of its own while the live one still runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

log = logging.getLogger("viewgate.engine.query_resources")


class Closeable(Protocol):
    def close(self) -> None: ...


class Query(Protocol):
    """The part of pyspark's StreamingQuery used here."""

    @property
    def isActive(self) -> bool: ...  # noqa: N802 - pyspark's name


_HELD: list[tuple[Query, Closeable]] = []
_LOCK = threading.Lock()

T = TypeVar("T")
Q = TypeVar("Q", bound=Query)


def hold(query: Query, resource: Closeable) -> None:
    """Keep `resource` until `query` has stopped (release_stopped)."""
    with _LOCK:
        _HELD.append((query, resource))


def start_holding(resource: Closeable, start: Callable[[], Q]) -> Q:
    """The query `start()` starts, `resource` (what its batch function holds) kept until
    it stops; closed at once if the query does not start."""
    try:
        query = start()
    except BaseException:
        resource.close()
        raise
    hold(query, resource)
    return query


def held(kind: type[T]) -> list[T]:
    """The resources of type `kind` held for queries, stopped or not (yet) released."""
    with _LOCK:
        return [r for _, r in _HELD if isinstance(r, kind)]


def release_stopped() -> None:
    """Close the resources of every query that is no longer active, once each."""
    with _LOCK:
        running: list[tuple[Query, Closeable]] = []
        stopped: list[Closeable] = []
        for query, resource in _HELD:
            if _active(query):
                running.append((query, resource))
            else:
                stopped.append(resource)
        _HELD[:] = running
    for resource in stopped:
        try:
            resource.close()
        except Exception:  # noqa: BLE001 - one resource failing to close leaves the others
            log.exception("closing %r failed", resource)


def _active(query: Any) -> bool:
    try:
        return bool(query.isActive)
    except Exception:  # noqa: BLE001 - a JVM gone (killed) has no active query left
        return False
