"""Rows a view cannot store: its key is null (for example an order without a customer id,
grouped by customer). As ksqlDB drops a null group key, the view leaves such a row out; it
goes to the dead-letter topic of the view's source with the reason, the view and the batch,
so nothing disappears silently and the query never fails on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from confluent_kafka import KafkaException, Producer

from engine.sinks.changefeed import close_producer


def split_keyless(rows: Sequence[Mapping[str, Any]], key: Sequence[str]
                  ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(rows with every key column set, rows missing one)."""
    if len(key) == 1:  # most views: no generator per row (every row of every batch)
        column = key[0]
        keyed = [row for row in rows if row.get(column) is not None]
        if len(keyed) == len(rows):
            return keyed, []
        return keyed, [row for row in rows if row.get(column) is None]
    keyed, keyless = [], []
    for row in rows:
        (keyless if any(row.get(c) is None for c in key) else keyed).append(row)
    return keyed, keyless


class Rejects:
    def __init__(self, bootstrap: str, topic: str, view: str, key: Sequence[str]) -> None:
        self.topic = topic
        self.view = view
        self.key = tuple(key)
        self.bootstrap = bootstrap
        self._producer: Producer | None = None  # made on the first rejected row: rare

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.bootstrap,
                                       "enable.idempotence": True})
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            close_producer(self._producer)
            self._producer = None

    def publish(self, batch_id: int, rows: Sequence[Mapping[str, Any]],
                timeout_s: float = 60) -> None:
        for row in rows:
            missing = [c for c in self.key if row.get(c) is None]
            reason = (f"view {self.view}: key column(s) {', '.join(missing)} null; "
                      "the row cannot be stored")
            self.producer.produce(self.topic, value=orjson.dumps(dict(row), default=str),
                                  headers={"reason": reason.encode(),
                                           "view": self.view.encode(),
                                           "batch_id": str(batch_id).encode()})
            self.producer.poll(0)
        if self.producer.flush(timeout_s):
            # Failing the batch makes Spark retry it; a replay publishes again.
            raise KafkaException(f"dead-letter topic {self.topic}: rows left undelivered")
