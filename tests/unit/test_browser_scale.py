"""What each of tens of thousands of idle subscriptions holds in the gateway: a Subscriber
without an Event or an empty deque, keys and share keys without orjson's output buffers,
one copy of a document's text however many tabs send it; and the browsers bench group's
registration."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import orjson
import pytest

from gateway.reads.filters import Condition
from gateway.subscriptions.subscribers import Overflow, Subscriber, filter_key
from gateway.subscriptions.websocket import GraphQLWebSocket
from viewgate.bench.runner import select_groups


def _allocated_per(make, count: int = 2000) -> float:
    """Bytes still allocated per object made by `make()` (kept alive meanwhile)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [make() for _ in range(count)]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(kept) == count
    return (after - before) / count


def test_an_idle_subscriber_holds_no_queue_and_no_event() -> None:
    async def main() -> float:
        def idle() -> Subscriber:
            sub = Subscriber(10, lambda _: None)
            sub.put("first")  # had a message, which was read
            assert sub.queue is not None
            return sub
        subs = [idle() for _ in range(10)]
        for sub in subs:
            assert await sub.get() == "first"
            assert sub.queue is None  # an empty deque would keep its 64-slot block
        return _allocated_per(lambda: Subscriber(10, lambda _: None))
    per = asyncio.run(main())
    # An asyncio.Event (with its waiters' deque) and a deque alone cost over 1 KiB.
    assert per < 300, per


async def _until_waiting(sub: Subscriber, reader: asyncio.Future, timeout_s: float = 5) -> None:
    """Let the event loop run `reader` until it waits on `sub`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while sub._waiter is None:
        assert loop.time() < deadline, "the reader never started waiting"
        await asyncio.wait({reader}, timeout=0)  # one turn of the loop


def test_subscriber_wakes_its_reader_and_keeps_order() -> None:
    async def main() -> None:
        sub = Subscriber(3, lambda _: None)
        reader = asyncio.ensure_future(sub.get())
        await _until_waiting(sub, reader)
        assert not reader.done()
        sub.put("a")
        sub.put("b")
        assert await reader == "a"
        assert await sub.get() == "b"
        assert sub.queue is None
    asyncio.run(main())


def test_subscriber_overflow_and_failure_after_its_messages() -> None:
    overflowed: list[Subscriber] = []

    async def main() -> None:
        sub = Subscriber(2, overflowed.append)
        sub.put(1)
        sub.put(2)
        sub.put(3)  # one more than the buffer
        assert overflowed == [sub]
        with pytest.raises(Overflow):
            await sub.get()
        failing = Subscriber(5, overflowed.append)
        failing.put("last")
        failing.fail(RuntimeError("rebuilt"))
        assert await failing.get() == "last"
        with pytest.raises(RuntimeError, match="rebuilt"):
            await failing.get()
        waiting = Subscriber(5, overflowed.append)
        reader = asyncio.ensure_future(waiting.get())
        await _until_waiting(waiting, reader)
        waiting.fail(RuntimeError("gone"))
        with pytest.raises(RuntimeError, match="gone"):
            await reader
    asyncio.run(main())


def test_keys_are_compact_strings() -> None:
    a = [Condition("tier", "eq", "gold"), Condition("country", "in", ["DE", "FR"])]
    b = [Condition("country", "in", ["FR", "DE"]), Condition("tier", "eq", "gold")]
    assert filter_key(a) == filter_key(b)
    assert isinstance(filter_key(a), str)
    # orjson's bytes keep a 4 KiB buffer; every subscriber's unregistering closure holds
    # its key, so the key must not be one.
    per = _allocated_per(lambda: filter_key(a), 500)
    assert per < 512, per
    assert _allocated_per(lambda: orjson.dumps({"id": "C00001"}), 500) > 2048  # why


def test_tabs_sending_one_document_share_its_text() -> None:
    decode = GraphQLWebSocket.decode_json.__get__(object.__new__(GraphQLWebSocket))
    query = "subscription V($id: String!) { customer(customerId: $id) { op version } }"
    raw = orjson.dumps({"id": "1", "type": "subscribe",
                        "payload": {"query": query, "variables": {"id": "C1"}}})
    first, second = decode(raw), decode(raw)
    assert first["payload"]["query"] == query
    assert first["payload"]["query"] is second["payload"]["query"]
    assert decode(b"not json") is not None and decode(b"[1]") == [1]


def test_the_browsers_group_runs_when_named() -> None:
    assert [g.name for g in select_groups(["browsers"])] == ["browsers"]
    assert "browsers" not in [g.name for g in select_groups(None)]
    keys = {f.key for f in select_groups(["browsers"])[0].figures}
    assert {"ws_connections_open", "ws_subscriptions_open", "ws_fanout_10k_connections_s",
            "ws_rss_kb_per_subscription", "ws_churn_per_s", "ws_idle_cpu_share",
            "ws_generator_cpu"} <= keys


class _ClosingSocket:
    """A websocket whose send fails as uvicorn's sans-I/O implementation does once the
    closing handshake has begun."""

    async def send_json(self, message: object) -> None:
        raise RuntimeError("Unexpected ASGI message 'websocket.send', after sending "
                           "'websocket.close'.")


def test_a_send_racing_a_closing_tab_is_a_disconnect_not_an_error(caplog) -> None:
    from datetime import timedelta

    from strawberry.http.exceptions import WebSocketDisconnected

    from gateway.subscriptions.websocket import TransportWSHandler

    handler = TransportWSHandler(None, _ClosingSocket(), None, None, None,
                                 timedelta(seconds=1))

    async def main() -> None:
        with pytest.raises(WebSocketDisconnected):
            await handler.send_message({"id": "1", "type": "next", "payload": {}})
        await handler.handle_task_exception(WebSocketDisconnected())  # not logged
        await handler.handle_task_exception(ValueError("a bug"))  # logged
    with caplog.at_level("ERROR", logger="strawberry.ws.task"):
        asyncio.run(main())
    assert [r.exc_info[1].__class__ for r in caplog.records] == [ValueError]
