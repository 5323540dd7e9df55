"""Browser tabs for the browsers group, many per process (viewgate.bench.workers.Worker):
each tab is a websocket of its own speaking graphql-transport-ws (the `websockets`
library's sans-I/O protocol, offering permessage-deflate as browsers do), with three
subscriptions:

- `v`: the live value of one customer every tab watches (`customer(customerId: hot)`),
  the fan-out's target;
- `c`: the changes of the hot customer and the tab's own (`customerChanges(where:
  {customerId: {in: [hot, own]}})`), a filtered change stream;
- `l`: a live list page, the tab's customer's last orders (`orders(where: {customerId:
  {eq: own}}, first: 5)`).

The live value and the list send their first message at once; the change stream sends its
first with the first change it sees (the fan-out's change of the hot customer reaches
every tab's). Receive times are wall-clock milliseconds, comparable across processes.

A held tab (hold_tabs) is an asyncio.Protocol driving the `websockets` library's
sans-I/O ClientProtocol (`Tab`: the handshake, permessage-deflate, fragments, control
frames, the close handshake and websocket pongs are the library's), on uvloop: what it
receives is handled in the event loop's read callback, with no task or future per tab or
per message, and its keep-alive pings are timers. A complete, uncompressed text frame (a
fan-out's copies: the gateway sends messages under 256 bytes uncompressed) is cut from the
bytes here rather than by the library's parser, and a `next` in the gateway's own shape
(`{"id":"<op>","type":"next","payload":`, no `"errors"` in it) is not parsed as JSON:
its operation is its start; every other message is parsed and checked. Reading a copy
costs about a third of what the library's asyncio client took (docs/benchmarks.md).

A churning tab (churn_tabs) still runs the library's asyncio client: its cost is its
opening, not messages, and a cheaper churning client offered the gateway its 220 tabs a
second sooner than the gateway accepted them (docs/benchmarks.md, 2026-11-27, late).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import enable_client_permessage_deflate
from websockets.frames import Frame, Opcode
from websockets.http11 import USER_AGENT, Response
from websockets.protocol import State
from websockets.uri import parse_uri

PROTOCOL = "graphql-transport-ws"

VALUE = ("subscription V($id: String!) "
         "{ customer(customerId: $id) { op version row { name tier } } }")
CHANGES = ("subscription C($ids: [String!]!) "
           "{ customerChanges(where: {customerId: {in: $ids}}) "
           "{ op key version cursor row { name } } }")
LIST = ("subscription L($id: String!) { orders(where: {customerId: {eq: $id}}, first: 5) "
        "{ totalCount edges { node { orderId status amount } } } }")
KINDS = ("v", "c", "l")
INIT = b'{"type":"connection_init","payload":{}}'
PING = b'{"type":"ping"}'
PONG = b'{"type":"pong"}'
# The gateway frames a `next` as {"id":<id>,"type":"next","payload":<payload>}
# (gateway.subscriptions.live_operations._frame): one of ours in that shape, without an
# "errors" key in it, needs no parsing to know its operation.
NEXT = {f'{{"id":"{op}","type":"next","payload":'.encode(): op for op in KINDS}
NEXT_LEN = len(next(iter(NEXT)))
CLOSE_TIMEOUT_S = 5.0


class TabFailed(RuntimeError):
    pass


def subscribe_messages(hot: str, own: str) -> list[bytes]:
    """The three `subscribe` messages of a tab watching `own` besides `hot`."""
    def subscribe(op: str, query: str, variables: dict[str, Any]) -> bytes:
        return orjson.dumps({"id": op, "type": "subscribe",
                             "payload": {"query": query, "variables": variables}})
    return [subscribe("v", VALUE, {"id": hot}), subscribe("c", CHANGES, {"ids": [hot, own]}),
            subscribe("l", LIST, {"id": own})]


def classify(data: bytes) -> tuple[str, str | None]:
    """A message's type and operation id. An `error`, or a `next` with errors, raises
    TabFailed."""
    op = NEXT.get(data[:NEXT_LEN])
    if op is not None and b'"errors"' not in data:
        return "next", op
    message = orjson.loads(data)
    kind = message.get("type")
    if kind == "error" or (kind == "next" and (message.get("payload") or {}).get("errors")):
        raise TabFailed(f"subscription {message.get('id')}: {message.get('payload')}")
    return kind, message.get("id")


class Tab(asyncio.Protocol):
    """One browser tab's websocket. Subclasses say what a message does (`on_next`) and
    what the tab does once acknowledged (`on_ack`); `on_end` is called once, when the
    connection is gone, with the reason it failed (None: closed as asked)."""

    def __init__(self, uri: str, compression: str | None, on_end: Callable[[Any, str | None],
                                                                            None]) -> None:
        extensions = enable_client_permessage_deflate(None) if compression == "deflate" \
            else None
        self.conn = ClientProtocol(parse_uri(uri), subprotocols=[PROTOCOL],  # type: ignore[list-item]
                                   extensions=extensions, max_size=None)
        self.transport: asyncio.Transport | None = None
        self.acked = False
        self.closing = False  # we asked for the close: its end is no failure
        self.failure: str | None = None
        self.parts: list[bytes] | None = None  # a fragmented message's frames so far
        self.pending = b""  # the start of a frame not all received
        self.close_timer: asyncio.TimerHandle | None = None  # drops a close that hangs
        self.later: asyncio.TimerHandle | None = None  # the tab's next step (ping, leave)
        self.on_end = on_end
        self.ended = False

    # --- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        if self.ended:  # given up on while connecting
            transport.abort()
            return
        self.transport = transport
        request = self.conn.connect()
        request.headers["User-Agent"] = USER_AGENT
        self.conn.send_request(request)
        self.flush()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn.state is State.OPEN and not conn.reader.buffer:
            # Frames read here; the library's parser gets whole frames only, and only
            # those that are not a complete, uncompressed text message.
            if self.pending:
                data, self.pending = self.pending + data, b""
            end = len(data)
            start = 0
            while start < end:
                if end - start < 2:
                    break
                head, size = data[start], data[start + 1]
                at = start + 2
                if size > 125:
                    if size == 126:
                        if end - at < 2:
                            break
                        size = int.from_bytes(data[at:at + 2], "big")
                        at += 2
                    elif size == 127:
                        if end - at < 8:
                            break
                        size = int.from_bytes(data[at:at + 8], "big")
                        at += 8
                    else:  # masked: the library refuses it
                        return self.library(data[start:])
                if end - at < size:
                    break
                if head != 0x81 or conn.current_size is not None \
                        or conn.state is not State.OPEN:
                    self.library(data[start:at + size])
                else:
                    try:
                        self.message(data[at:at + size])
                    except Exception as exc:  # noqa: BLE001 - a tab that fails is counted
                        return self.fail(str(exc) if isinstance(exc, TabFailed) else repr(exc))
                start = at + size
            if start < end:
                self.pending = data[start:]
            return None
        if self.pending:
            data, self.pending = self.pending + data, b""
        return self.library(data)

    def library(self, data: bytes) -> None:
        conn = self.conn
        conn.receive_data(data)
        try:
            for event in conn.events_received():
                if type(event) is Frame:
                    self.frame(event)
                else:
                    self.response(event)
        except TabFailed as exc:
            self.fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - a tab that fails is counted
            self.fail(repr(exc))
        self.flush()
        if conn.state is State.CLOSED or conn.close_expected():
            self.expect_close()

    def eof_received(self) -> bool | None:
        self.conn.receive_eof()
        self.flush()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.close_timer, self.later):
            if timer is not None:
                timer.cancel()
        self.close_timer = self.later = None
        if self.failure is None and not self.closing:
            conn = self.conn
            reason = conn.handshake_exc or conn.close_rcvd or exc
            self.failure = "closed by the server" + (f": {reason!r}" if reason else "")
        self.end()

    # --- the tab -----------------------------------------------------------------------

    def flush(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            self.conn.data_to_send()
            return
        for data in self.conn.data_to_send():
            if data:
                transport.write(data)
            elif transport.can_write_eof():
                transport.write_eof()

    def send(self, data: bytes) -> None:
        if self.conn.state is State.OPEN:
            self.conn.send_text(data)
            self.flush()

    def response(self, response: Response) -> None:
        conn = self.conn
        if conn.handshake_exc is not None:
            raise TabFailed(f"handshake: {conn.handshake_exc!r}")
        if conn.subprotocol != PROTOCOL:
            raise TabFailed(f"the server chose subprotocol {conn.subprotocol!r}")
        self.send(INIT)

    def frame(self, frame: Frame) -> None:
        opcode = frame.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            data = frame.data
            if not frame.fin:
                self.parts = [bytes(data)]
                return
        elif opcode is Opcode.CONT:
            if self.parts is None:
                return
            self.parts.append(bytes(frame.data))
            if not frame.fin:
                return
            data, self.parts = b"".join(self.parts), None
        else:  # ping (answered by the protocol), pong, close
            return
        if type(data) is not bytes:
            data = bytes(data)
        self.message(data)

    def message(self, data: bytes) -> None:
        """A text message, as a browser's `onmessage` gets it: decoded (invalid UTF-8
        fails the tab), then read as graphql-transport-ws."""
        data.decode()
        kind, op = classify(data)
        if kind == "next":
            self.on_next(op, data)  # type: ignore[arg-type]
        elif kind == "ping":
            self.send(PONG)
        elif kind == "pong":
            self.on_pong()
        elif kind == "connection_ack" and not self.acked:
            self.acked = True
            self.on_ack()
        elif not self.acked:
            raise TabFailed(f"expected connection_ack, got {data[:200]!r}")

    def on_ack(self) -> None:
        pass

    def on_next(self, op: str, data: bytes) -> None:
        pass

    def on_pong(self) -> None:
        pass

    def fail(self, reason: str) -> None:
        """Give up on the tab: counted as failed, its connection dropped."""
        if self.failure is None and not self.closing:
            self.failure = reason
        if self.transport is not None:
            self.transport.abort()
        else:
            self.end()

    def close(self) -> None:
        """Close as a browser closing the tab does: a close frame (no `complete`), the
        server's answer, the TCP connection's end (dropped after CLOSE_TIMEOUT_S)."""
        if self.closing:
            return
        self.closing = True
        if self.later is not None:
            self.later.cancel()
            self.later = None
        conn = self.conn
        if self.transport is None:
            self.end()
            return
        if conn.state is State.OPEN:
            conn.send_close(1000)  # as the asyncio client before (its close())
            self.flush()
            self.expect_close()
        elif conn.state is State.CONNECTING:
            self.transport.abort()
        else:
            self.expect_close()

    def expect_close(self) -> None:
        if self.close_timer is None and self.transport is not None:
            self.close_timer = asyncio.get_running_loop().call_later(
                CLOSE_TIMEOUT_S, self.transport.abort)

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.on_end(self, self.failure)


async def connect(tab: Tab, url: str, timeout_s: float) -> None:
    """Open `tab`'s TCP connection to `url` (the handshake follows in the protocol); a
    tab not acknowledged within `timeout_s` fails."""
    loop = asyncio.get_running_loop()
    parts = urlsplit(url)
    timer = loop.call_later(timeout_s, lambda: None if tab.acked else tab.fail(
        f"connect: not acknowledged within {timeout_s:.0f} s"))
    try:
        await loop.create_connection(lambda: tab, parts.hostname, parts.port or 80)
    except OSError as exc:
        timer.cancel()
        tab.failure = f"connect: {exc!r}"
        tab.end()


def _run(main: Callable[[], Any]) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] installs it
        return asyncio.run(main())
    return uvloop.run(main())


def hold_tabs(url: str, tabs: int, hot: str, keys: Sequence[str], ready: Any, stop: Any,
              markers: Sequence[str], reached: Sequence[Any], compression: str | None,
              ping_s: float, open_rate: float) -> dict[str, Any]:
    """Open `tabs` tabs (at most `open_rate` new ones a second), each watching a key of
    `keys` besides `hot`. `ready` is set once every tab's live value and list have their
    first message (or failed). Until `stop`: records, per marker of `markers` (a name the
    hot customer is given), when each tab's live value and change stream received it;
    with `ping_s`, each tab sends a graphql-transport-ws `ping` that often (a client's
    keep-alive). `reached[i]` is set once every tab (that did not fail) has `markers[i]`
    on its live value and its change stream. Returns {"tabs", "firsts": {kind: count},
    "arrivals": {marker: {kind: [ms]}}, "failed": [first reasons], "failures",
    "pongs", "copy_cpu_us": {marker: this process's CPU from its first copy of the marker
    to the last tab's, in microseconds per copy (the load generator's cost of a
    message)}}."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        firsts = dict.fromkeys(KINDS, 0)
        arrivals = {m: {"v": [], "c": []} for m in markers}
        failed: list[str] = []
        counts = {"failures": 0, "pongs": 0, "pending": tabs, "dead": 0}
        opened = asyncio.Event()
        encoded = [(i, m.encode(), arrivals[m]) for i, m in enumerate(markers)]
        complete = [0] * len(markers)  # tabs with the marker on both subscriptions
        stopping = False

        unset = list(enumerate(reached))  # markers not reached by every tab yet
        cpu: list[list[float]] = [[] for _ in markers]  # CPU s at the first, the last copy

        def check_reached() -> None:
            # A multiprocessing Event's set() takes a lock shared with other processes:
            # each is set once.
            for item in list(unset):
                if complete[item[0]] + counts["dead"] >= tabs:
                    cpu[item[0]].append(time.process_time())
                    item[1].set()
                    unset.remove(item)

        def settle() -> None:
            counts["pending"] -= 1
            if counts["pending"] == 0:
                opened.set()

        class Held(Tab):
            def __init__(self, index: int) -> None:
                super().__init__(url, compression, ended)
                self.own = keys[index % len(keys)]
                self.seen = 0  # bits: v 1, c 2, l 4
                self.settled = False
                self.got = [0] * len(markers)  # of each marker: 1 live value, 2 changes

            def on_ack(self) -> None:
                for message in subscribe_messages(hot, self.own):
                    self.send(message)
                if ping_s > 0:
                    self.timer_ping(random.uniform(0, ping_s))

            def timer_ping(self, delay: float) -> None:
                self.later = loop.call_later(delay, self.ping)

            def ping(self) -> None:
                self.send(PING)
                self.timer_ping(ping_s)

            def on_pong(self) -> None:
                counts["pongs"] += 1

            def on_next(self, op: str, data: bytes) -> None:
                bit = 1 if op == "v" else 2 if op == "c" else 4
                if not self.seen & bit:
                    self.seen |= bit
                    firsts[op] += 1
                    if not self.settled and self.seen & 5 == 5:
                        self.settled = True
                        settle()
                if bit != 4:
                    now = None
                    for i, text, arrived in encoded:
                        if text in data:
                            if not cpu[i]:  # this process's first copy of the marker
                                cpu[i].append(time.process_time())
                            now = now or time.time() * 1000
                            arrived[op].append(now)
                            got = self.got[i] | bit
                            if got == 3:
                                got = 4  # counted
                                complete[i] += 1
                                check_reached()
                            self.got[i] = got

        def ended(tab: Any, failure: str | None) -> None:
            if failure is not None and not stopping:
                counts["failures"] += 1
                counts["dead"] += 1
                check_reached()
                if len(failed) < 5:
                    failed.append(failure[:300])
            if not tab.settled:
                tab.settled = True
                settle()
            tab_set.discard(tab)
            if not tab_set and stopping:
                all_closed.set()

        tab_set: set[Held] = set()
        all_closed = asyncio.Event()
        openings = []
        started = time.monotonic()
        for i in range(tabs):
            delay = started + i / open_rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tab = Held(i)
            tab_set.add(tab)
            openings.append(loop.create_task(connect(tab, url, 120)))
        while not opened.is_set() and not stop.is_set():
            await asyncio.sleep(0.05)  # polls a cross-process Event: no await-able form
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        stopping = True
        await asyncio.gather(*openings, return_exceptions=True)
        for tab in list(tab_set):
            tab.close()
        if tab_set:
            try:
                await asyncio.wait_for(all_closed.wait(), CLOSE_TIMEOUT_S + 5)
            except TimeoutError:
                pass
        copy_cpu_us = {}
        for i, marker in enumerate(markers):
            copies = len(arrivals[marker]["v"]) + len(arrivals[marker]["c"])
            copy_cpu_us[marker] = round((cpu[i][1] - cpu[i][0]) * 1e6 / (copies - 1), 1) \
                if len(cpu[i]) == 2 and copies > 1 else None
        return {"tabs": tabs, "firsts": firsts, "arrivals": arrivals, "failed": failed,
                "failures": counts["failures"], "pongs": counts["pongs"],
                "copy_cpu_us": copy_cpu_us}

    return _run(main)


async def open_tab(url: str, compression: str | None, open_timeout_s: float = 120) -> Any:
    """A connected, acknowledged graphql-transport-ws websocket."""
    from websockets.asyncio.client import connect

    ws = await connect(url, subprotocols=[PROTOCOL], compression=compression,  # type: ignore[list-item]
                       open_timeout=open_timeout_s, ping_interval=None, max_queue=None,
                       close_timeout=5)
    await ws.send(b'{"type":"connection_init","payload":{}}', text=True)
    while True:
        message = orjson.loads(await ws.recv())
        if message["type"] == "connection_ack":
            return ws
        if message["type"] == "ping":
            await ws.send(b'{"type":"pong"}', text=True)
            continue
        raise TabFailed(f"expected connection_ack, got {message}")


def churn_tabs(url: str, rate: float, seconds: float, hot: str, keys: Sequence[str],
               hold_s: float, compression: str | None) -> dict[str, Any]:
    """Tabs coming and going: `rate` new tabs a second for `seconds`, each subscribing as
    hold_tabs' tabs do, waiting for its live value's and list's first messages, staying
    `hold_s`, then closing its websocket (as a closed browser tab does: no `complete`).
    Returns {"started", "completed", "failures", "failed", "first_ms": [per tab: subscribe
    -> both first messages], "open_ms": [per tab opened: connect -> acknowledged],
    "seconds": from the first start to the last close, "served": [first, last]: when the
    first and the last tab had their first messages, in seconds from the first start}."""

    async def main() -> dict[str, Any]:
        completed = failures = 0
        failed: list[str] = []
        first_ms: list[float] = []
        open_ms: list[float] = []
        served: list[float] = []  # the first and last tab's first messages (s from start)

        async def tab(index: int) -> None:
            nonlocal completed, failures
            own = keys[index % len(keys)]
            opening = time.monotonic()
            try:
                ws = await open_tab(url, compression, open_timeout_s=30)
                open_ms.append((time.monotonic() - opening) * 1000)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                failures += 1
                if len(failed) < 5:
                    failed.append(f"connect: {exc!r}"[:300])
                return
            try:
                began = time.monotonic()
                for message in subscribe_messages(hot, own):
                    await ws.send(message, text=True)
                seen: set[str] = set()
                async with asyncio.timeout(30):
                    while not {"v", "l"} <= seen:
                        raw = await ws.recv()
                        kind, op = classify(raw.encode() if isinstance(raw, str) else raw)
                        if kind == "next":
                            seen.add(op)  # type: ignore[arg-type]
                first_ms.append((time.monotonic() - began) * 1000)
                done = time.monotonic() - started
                served[:] = [min(served[0], done), max(served[1], done)] if served \
                    else [done, done]
                await asyncio.sleep(hold_s)
                completed += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                failures += 1
                if len(failed) < 5:
                    failed.append(repr(exc)[:300])
            finally:
                await ws.close()

        tasks = []
        count = int(rate * seconds)
        started = time.monotonic()
        for i in range(count):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(tab(i)))
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"started": count, "completed": completed, "failures": failures,
                "failed": failed, "first_ms": first_ms, "open_ms": open_ms,
                "seconds": time.monotonic() - started, "served": served}

    return asyncio.run(main())
