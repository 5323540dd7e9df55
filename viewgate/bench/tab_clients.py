"""Browser tabs for the browsers group, many per process (viewgate.bench.workers.Worker):
each tab is a websocket of its own speaking graphql-transport-ws (the `websockets`
library, offering permessage-deflate as browsers do), with three subscriptions:

- `v`: the live value of one customer every tab watches (`customer(customerId: hot)`),
  the fan-out's target;
- `c`: the changes of the hot customer and the tab's own (`customerChanges(where:
  {customerId: {in: [hot, own]}})`), a filtered change stream;
- `l`: a live list page, the tab's customer's last orders (`orders(where: {customerId:
  {eq: own}}, first: 5)`).

The live value and the list send their first message at once; the change stream sends its
first with the first change it sees (the fan-out's change of the hot customer reaches
every tab's). Receive times are wall-clock milliseconds, comparable across processes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import orjson

PROTOCOL = "graphql-transport-ws"

VALUE = ("subscription V($id: String!) "
         "{ customer(customerId: $id) { op version row { name tier } } }")
CHANGES = ("subscription C($ids: [String!]!) "
           "{ customerChanges(where: {customerId: {in: $ids}}) "
           "{ op key version cursor row { name } } }")
LIST = ("subscription L($id: String!) { orders(where: {customerId: {eq: $id}}, first: 5) "
        "{ totalCount edges { node { orderId status amount } } } }")
KINDS = ("v", "c", "l")


class TabFailed(RuntimeError):
    pass


def subscribe_messages(hot: str, own: str) -> list[bytes]:
    """The three `subscribe` messages of a tab watching `own` besides `hot`."""
    def subscribe(op: str, query: str, variables: dict[str, Any]) -> bytes:
        return orjson.dumps({"id": op, "type": "subscribe",
                             "payload": {"query": query, "variables": variables}})
    return [subscribe("v", VALUE, {"id": hot}), subscribe("c", CHANGES, {"ids": [hot, own]}),
            subscribe("l", LIST, {"id": own})]


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


def _checked(message: dict[str, Any]) -> str | None:
    """The operation id of a `next`; an error raises; other messages give None."""
    kind = message["type"]
    if kind == "error" or (kind == "next" and message["payload"].get("errors")):
        raise TabFailed(f"subscription {message.get('id')}: {message.get('payload')}")
    return message.get("id") if kind == "next" else None


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
    "pongs"}."""

    async def main() -> dict[str, Any]:
        firsts = dict.fromkeys(KINDS, 0)
        arrivals = {m: {"v": [], "c": []} for m in markers}
        failed: list[str] = []
        failures = 0
        pongs = 0
        opened = asyncio.Event()
        pending = tabs  # tabs whose live value and list have not both answered
        encoded = [m.encode() for m in markers]
        complete = [0] * len(markers)  # tabs with the marker on both subscriptions
        dead = 0  # tabs that failed

        def check_reached() -> None:
            for i, event in enumerate(reached):
                if complete[i] + dead >= tabs:
                    event.set()

        def settle() -> None:
            nonlocal pending
            pending -= 1
            if pending == 0:
                opened.set()

        def fail(reason: str) -> None:
            nonlocal failures, dead
            failures += 1
            dead += 1
            check_reached()
            if len(failed) < 5:
                failed.append(reason[:300])

        async def pinger(ws: Any) -> None:
            await asyncio.sleep(random.uniform(0, ping_s))
            while True:
                await ws.send(b'{"type":"ping"}', text=True)
                await asyncio.sleep(ping_s)

        async def tab(index: int) -> None:
            nonlocal pongs
            own = keys[index % len(keys)]
            settled = False
            ping_task = None
            try:
                ws = await open_tab(url, compression)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                fail(f"connect: {exc!r}")
                settle()
                return
            try:
                for message in subscribe_messages(hot, own):
                    await ws.send(message, text=True)
                seen: set[str] = set()
                got = [0] * len(markers)  # of each marker: 1 live value, 2 change stream
                if ping_s > 0:
                    ping_task = asyncio.create_task(pinger(ws))
                async for raw in ws:
                    message = orjson.loads(raw)
                    op = _checked(message)
                    if op is None:
                        if message["type"] == "pong":
                            pongs += 1
                        elif message["type"] == "ping":
                            await ws.send(b'{"type":"pong"}', text=True)
                        continue
                    if op not in seen:
                        seen.add(op)
                        firsts[op] += 1
                        if not settled and "v" in seen and "l" in seen:
                            settled = True
                            settle()
                    if op != "l":
                        data = raw.encode() if isinstance(raw, str) else raw
                        for i, text in enumerate(encoded):
                            if text in data:
                                arrivals[markers[i]][op].append(time.time() * 1000)
                                got[i] |= 1 if op == "v" else 2
                                if got[i] == 3:
                                    got[i] = 4  # counted
                                    complete[i] += 1
                                    check_reached()
                if not stop.is_set():
                    fail("closed by the server")
            except Exception as exc:  # noqa: BLE001 - a failed tab is counted
                if not stop.is_set():
                    fail(repr(exc))
            finally:
                if not settled:
                    settle()
                if ping_task is not None:
                    ping_task.cancel()
                await ws.close()

        tasks = []
        started = time.monotonic()
        for i in range(tabs):
            due = started + i / open_rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(tab(i)))
        while not opened.is_set() and not stop.is_set():
            await asyncio.sleep(0.05)  # polls a cross-process Event: no await-able form
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"tabs": tabs, "firsts": firsts, "arrivals": arrivals, "failed": failed,
                "failures": failures, "pongs": pongs}

    return asyncio.run(main())


def churn_tabs(url: str, rate: float, seconds: float, hot: str, keys: Sequence[str],
               hold_s: float, compression: str | None) -> dict[str, Any]:
    """Tabs coming and going: `rate` new tabs a second for `seconds`, each subscribing as
    hold_tabs' tabs do, waiting for its live value's and list's first messages, staying
    `hold_s`, then closing its websocket (as a closed browser tab does: no `complete`).
    Returns {"started", "completed", "failures", "failed", "first_ms": [per tab: subscribe
    -> both first messages], "seconds": from the first start to the last close, "served":
    [first, last]: when the first and the last tab had their first messages, in seconds from
    the first start}."""

    async def main() -> dict[str, Any]:
        completed = failures = 0
        failed: list[str] = []
        first_ms: list[float] = []
        served: list[float] = []  # the first and last tab's first messages (s from start)

        async def tab(index: int) -> None:
            nonlocal completed, failures
            own = keys[index % len(keys)]
            try:
                ws = await open_tab(url, compression, open_timeout_s=30)
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
                        message = orjson.loads(await ws.recv())
                        op = _checked(message)
                        if op is not None:
                            seen.add(op)
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
                "failed": failed, "first_ms": first_ms,
                "seconds": time.monotonic() - started, "served": served}

    return asyncio.run(main())
