"""Websocket subscribers for the subscriptions group, each run in a process of its own
(viewgate.bench.workers.Worker), speaking graphql-transport-ws with the `websockets`
library, as a browser's graphql-ws client would.

Receive times are wall-clock milliseconds (time.time()), comparable with the Kafka
create times of the produced events on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

PROTOCOL = "graphql-transport-ws"


class SubscriptionFailed(RuntimeError):
    pass


async def _open(url: str) -> Any:
    import websockets

    ws = await websockets.connect(url, subprotocols=[PROTOCOL], max_queue=None,
                                  open_timeout=60, ping_interval=None)
    await ws.send(json.dumps({"type": "connection_init", "payload": {}}))
    while True:
        message = json.loads(await ws.recv())
        if message["type"] == "connection_ack":
            return ws
        if message["type"] == "ping":
            await ws.send(json.dumps({"type": "pong"}))
            continue
        raise SubscriptionFailed(f"expected connection_ack, got {message}")


async def _subscribe(ws: Any, sub_id: str, query: str, variables: Mapping[str, Any]) -> None:
    await ws.send(json.dumps({"id": sub_id, "type": "subscribe",
                              "payload": {"query": query, "variables": dict(variables)}}))


async def _operation_message(ws: Any, raw: str | bytes) -> dict[str, Any] | None:
    """A `next` or `error` message of a subscription; pings are answered, the rest
    (pongs, completes) skipped."""
    message = orjson.loads(raw)
    if message["type"] == "ping":
        await ws.send(json.dumps({"type": "pong"}))
        return None
    return message if message["type"] in ("next", "error") else None


def _payload(message: dict[str, Any]) -> dict[str, Any]:
    """The data of a `next` message; a GraphQL or protocol error raises."""
    if message["type"] == "error":
        raise SubscriptionFailed(f"subscription {message.get('id')}: {message.get('payload')}")
    payload = message.get("payload") or {}
    if payload.get("errors"):
        raise SubscriptionFailed(f"subscription {message.get('id')}: {payload['errors']}")
    return payload.get("data") or {}


def watch_versions(url: str, subscriptions: Mapping[str, tuple[str, str]], ready: Any,
                   stop: Any) -> dict[str, Any]:
    """One connection with one subscription per name: name -> (query, the field to read).
    Each message's field carries a `version`; returns {"versions": per name, when each
    version was first received ([(version, ms)]), "cpu_s": this process's CPU seconds
    from `ready` on}. Sets `ready` once subscribed, runs until `stop`.

    It shares the bench machine's cores with the engine and the gateway it measures, so it
    reads as cheaply as it can: messages as they come (`async for`, no timeout per
    message: `asyncio.wait_for` made a task for each), parsed with orjson; `stop` (a
    multiprocessing event) is polled beside it and closes the connection."""

    async def main() -> dict[str, Any]:
        ws = await _open(url)
        names = list(subscriptions)
        fields = [subscriptions[name][1] for name in names]
        seen: list[dict[int, float]] = [{} for _ in names]
        try:
            for i, name in enumerate(names):
                await _subscribe(ws, str(i), subscriptions[name][0], {})
            cpu_from = time.process_time()
            ready.set()
            closer = asyncio.create_task(_close_on(stop, ws))
            async for raw in ws:
                now_ms = time.time() * 1000
                message = await _operation_message(ws, raw)
                if message is None:
                    continue
                index = int(message["id"])
                change = _payload(message)[fields[index]]
                seen[index].setdefault(int(change["version"]), now_ms)
            await closer
        finally:
            await ws.close()
        return {"versions": {name: sorted(seen[i].items()) for i, name in enumerate(names)},
                "cpu_s": round(time.process_time() - cpu_from, 3)}

    return asyncio.run(main())


async def _close_on(stop: Any, ws: Any) -> None:
    """Close `ws` once `stop` is set (polled: a multiprocessing event has no awaitable)."""
    while not stop.is_set():
        await asyncio.sleep(0.2)
    await ws.close()


def hold_live(url: str, connections: int, per_connection: int, query: str,
              variables: Mapping[str, Any], ready: Any, stop: Any,
              wanted: Sequence[str]) -> dict[str, Any]:
    """Open `connections` websockets with `per_connection` identical subscriptions each.
    Every subscription's first message is its current value; once all have one, `ready`
    is set. Afterwards, records when each subscription receives a message whose JSON
    contains every string of `wanted` (the awaited change), until all have or `stop`.
    Returns {"initial": subscriptions that got their current value, "received": [ms, ...],
    "failed": [the first reasons], "cpu_s": this process's CPU seconds from `ready` on}."""

    async def main() -> dict[str, Any]:
        total = connections * per_connection
        initial = 0
        received: list[float] = []
        failed: list[str] = []
        all_initial = asyncio.Event()
        all_received = asyncio.Event()

        async def one(index: int) -> None:
            nonlocal initial
            try:
                ws = await _open(url)
            except Exception as exc:  # noqa: BLE001 - counted and reported, not fatal
                failed.append(f"connect: {exc}")
                return
            try:
                for j in range(per_connection):
                    await _subscribe(ws, f"{index}-{j}", query, variables)
                firsts: set[str] = set()
                while True:
                    raw = await ws.recv()
                    message = await _operation_message(ws, raw)
                    if message is None:
                        continue
                    _payload(message)
                    if message["id"] not in firsts:
                        firsts.add(message["id"])
                        initial += 1
                        if initial == total:
                            all_initial.set()
                    elif all(w in raw for w in wanted):
                        received.append(time.time() * 1000)
                        if len(received) == total:
                            all_received.set()
            except Exception as exc:  # noqa: BLE001 - a closed socket ends this one
                if not stop.is_set():
                    failed.append(str(exc))
            finally:
                await ws.close()

        tasks = [asyncio.create_task(one(i)) for i in range(connections)]
        while not all_initial.is_set() and not stop.is_set() and len(failed) < total:
            await asyncio.sleep(0.05)  # polls a cross-process Event: no await-able form
        ready.set()
        cpu_at_ready = time.process_time()
        while not all_received.is_set() and not stop.is_set():
            await asyncio.sleep(0.05)
        cpu_s = time.process_time() - cpu_at_ready  # reading the change, mostly
        # Not `stop.set()`: the other client processes share it, and one done first cut
        # them off short of their last copies (18,300 of 20,000 in a run on 2026-11-28).
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"initial": initial, "received": received, "failed": failed[:5],
                "cpu_s": cpu_s}

    return asyncio.run(main())


def hold_and_count(url: str, connections: int, per_connection: int, query: str, field: str,
                   keys: Sequence[str], ready: Any, stop: Any) -> dict[str, Any]:
    """For the soak: open `connections` websockets with `per_connection` live
    subscriptions each (`query` with {"id": key}, keys taken in turn), and count what
    they get until `stop`: current values, changes, GraphQL or protocol errors, closes
    the client did not ask for, and changes whose `version` did not grow (a repeated or
    older version of the subscription's key). A key deleted before its subscription
    started is answered NOT_FOUND: counted apart (`not_found`), it is no error. `ready` is
    set once every subscription has had its first answer."""

    async def main() -> dict[str, Any]:
        import websockets

        total = connections * per_connection
        counts = dict.fromkeys(("current", "changes", "errors", "not_found", "closes",
                                "stale_versions"), 0)
        samples: list[str] = []

        def note(kind: str, text: str) -> None:
            counts[kind] += 1
            if len(samples) < 5:
                samples.append(f"{kind}: {text[:300]}")

        def answered() -> int:
            return counts["current"] + counts["errors"] + counts["not_found"] + counts["closes"]

        async def one(index: int) -> None:
            try:
                ws = await _open(url)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                for _ in range(per_connection):
                    note("closes", f"connect: {exc}")
                return
            last: dict[str, int] = {}
            try:
                for j in range(per_connection):
                    key = keys[(index * per_connection + j) % len(keys)]
                    await _subscribe(ws, str(j), query, {"id": key})
                while True:
                    message = await _operation_message(ws, await ws.recv())
                    if message is None:
                        continue
                    sub = message["id"]
                    text = json.dumps(message.get("payload"))
                    if message["type"] == "error" or message["payload"].get("errors"):
                        note("not_found" if sub not in last and "NOT_FOUND" in text
                             else "errors", text)
                        last.setdefault(sub, -1)
                        continue
                    version = int(message["payload"]["data"][field]["version"])
                    if sub not in last:
                        counts["current"] += 1
                    else:
                        counts["changes"] += 1
                        if version <= last[sub]:
                            note("stale_versions", f"{sub}: {version} after {last[sub]}")
                    last[sub] = version
            except websockets.ConnectionClosed as exc:
                if not stop.is_set():
                    for _ in range(per_connection):
                        note("closes", str(exc))
            finally:
                await ws.close()

        tasks = [asyncio.create_task(one(i)) for i in range(connections)]
        while answered() < total and not stop.is_set():
            await asyncio.sleep(0.05)  # polls a cross-process Event: no await-able form
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {**counts, "subscriptions": total, "samples": samples}

    return asyncio.run(main())
