"""What a query's batch function holds is released once that query has stopped, once, and
never while it runs (engine.query_resources); a producer is closed without waiting for
deliveries that cannot come (engine.sinks.changefeed.close_producer)."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Producer

from engine import query_resources
from engine.query_resources import held, hold, release_stopped, start_holding
from engine.sinks.changefeed import close_producer
from viewgate.stack.process import free_port


class FakeQuery:
    def __init__(self, active: bool = True) -> None:
        self.active = active

    @property
    def isActive(self) -> bool:  # noqa: N802 - pyspark's name
        if self.active is None:
            raise RuntimeError("the JVM is gone")
        return self.active


class Resource:
    def __init__(self, fails: bool = False) -> None:
        self.closed = 0
        self.fails = fails

    def close(self) -> None:
        self.closed += 1
        if self.fails:
            raise OSError("cannot close")


@pytest.fixture(autouse=True)
def nothing_held(monkeypatch):
    monkeypatch.setattr(query_resources, "_HELD", [])


def test_only_the_resources_of_stopped_queries_are_released_and_each_once():
    running, stopped, gone = FakeQuery(True), FakeQuery(False), FakeQuery(None)
    kept, released, also_released = Resource(), Resource(), Resource()
    hold(running, kept)
    hold(stopped, released)
    hold(gone, also_released)  # a query whose JVM died counts as stopped

    release_stopped()
    release_stopped()

    assert (kept.closed, released.closed, also_released.closed) == (0, 1, 1)
    assert held(Resource) == [kept]

    running.active = False
    release_stopped()
    assert kept.closed == 1 and held(Resource) == []


def test_a_resource_that_fails_to_close_does_not_keep_the_others_open():
    query = FakeQuery(False)
    failing, other = Resource(fails=True), Resource()
    hold(query, failing)
    hold(query, other)

    release_stopped()

    assert (failing.closed, other.closed) == (1, 1)
    assert held(Resource) == []


def test_a_query_that_does_not_start_closes_its_resource_at_once():
    resource = Resource()

    def start() -> FakeQuery:
        raise RuntimeError("checkpoint unreadable")

    with pytest.raises(RuntimeError, match="checkpoint"):
        start_holding(resource, start)
    assert resource.closed == 1 and held(Resource) == []

    started = start_holding(resource, FakeQuery)
    assert isinstance(started, FakeQuery) and held(Resource) == [resource]


def test_held_names_resources_by_type():
    query = FakeQuery()
    resource = Resource()
    hold(query, resource)
    hold(query, FakeQuery())  # anything with close() is held; only Resource is asked for
    assert held(Resource) == [resource]


def test_a_producer_with_undeliverable_messages_closes_at_once_and_refuses_more():
    # Nothing listens on the port: the message can never be delivered.
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{free_port()}",
                         "enable.idempotence": True, "log_level": 0})
    producer.produce("feed", b"an event")
    closing = threading.Thread(target=lambda: [close_producer(producer) for _ in range(2)])
    closing.start()  # closing again does nothing
    # Without the purge, close() would wait for the delivery until message.timeout.ms
    # (5 minutes): the deadline is far above a close, far below that.
    closing.join(timeout=60)
    assert not closing.is_alive(), "the producer waited for a delivery that cannot come"
    with pytest.raises(RuntimeError, match="closed"):
        producer.produce("feed", b"another")
