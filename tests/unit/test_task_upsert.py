"""The pure parts of an upsert view computed by Spark's tasks (engine.task_upsert): when a
task hands the view back, how its change events come back to the driver, and how the
tasks' shares of the Redis writes join into one apply."""

from __future__ import annotations

import datetime

import orjson

from engine.sinks.redis_sink import Before, RowWrites
from engine.task_upsert import TaskUpsert, UpsertInTask
from schema.catalog import graphql_fields
from schema.demo import CATALOG
from schema.storage import BatchWrites, ChangeEvent, events_from_bytes, join_writes

VIEW = CATALOG.views["OrderRecord"]
SPEC = UpsertInTask("OrderRecord", 0, ("order_id",), "order_id",
                    (("order_id", "order_id"), ("customer_id", "customer_id")),
                    RowWrites.of(VIEW, graphql_fields(VIEW)), "redis://127.0.0.1:1/0")


def test_a_task_computes_a_view_only_from_redis_at_the_previous_batch():
    stored = {"O1": {"order_id": "O1"}}
    assert SPEC._usable(Before(stored, 4, True), ["O1", "O2"], 5)
    assert SPEC._usable(Before(stored, None, False), ["O1"], 5)  # as the driver takes it
    assert not SPEC._usable(Before(stored, 5, True), ["O1"], 5)  # a replay: Redis holds it
    assert not SPEC._usable(Before(stored, 2, True), ["O1"], 5)  # lost batches: from Delta
    # Rows missing from a Redis that lost its complete mark: the driver reads Delta.
    assert not SPEC._usable(Before(stored, 4, False), ["O1", "O2"], 5)


def test_a_row_without_a_key_is_handed_back_before_redis_is_read():
    # The client's URL leads nowhere: reaching Redis would fail the test.
    assert SPEC.compute({"O1": {"order_id": None, "customer_id": "C1"}}, 5, 0) \
        == TaskUpsert.refused()
    assert SPEC.compute({}, 5, 0) == TaskUpsert(True)


def test_the_tasks_events_come_back_as_they_were_sent():
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    sent = [ChangeEvent("OrderRecord", "O1", "update", {"order_id": "O1", "ts": when},
                        {"order_id": "O1", "ts": "2025-01-01T00:00:00Z"}, 5, 0, 99,
                        b'{"order_id":"O1","ts":"2025-01-01T00:00:00Z"}'),
            ChangeEvent("OrderRecord", "O2", "delete", None, None, 5, 0, 99)]
    back = events_from_bytes([e.to_bytes() for e in sent])
    assert [e.to_bytes() for e in back] == [e.to_bytes() for e in sent]
    assert back[0].row == {"order_id": "O1", "ts": "2026-01-01T00:00:00Z"}  # JSON form
    assert back[0].before == sent[0].before and back[1].op == "delete"
    assert events_from_bytes([]) == []


def test_the_tasks_shares_of_the_writes_join_into_one_list_of_commands():
    first = BatchWrites([{"op": "set", "k": "a", "v": "1"}]).encoded()
    second = BatchWrites([{"op": "zrem", "k": "i", "m": "b"},
                          {"op": "set", "k": "b", "v": "2"}]).encoded()
    joined = orjson.loads(join_writes([first, b"[]", second]))
    assert joined == [["set", "", ["a", "1"]], ["zrem", "i", ["b"]], ["set", "", ["b", "2"]]]
    assert join_writes([b"[]", b"[]"]) == b"[]"
