"""The websocket opening gate (viewgate.opening_gate): its turns on a loop whose clock the
test moves (waiting clients take turns), then through a real uvicorn with the gateway's
HTTP and websocket protocols: an upgrade that waits is answered when its turn comes, a
waiting client that leaves is forgotten, one that sends more than its upgrade is dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from viewgate.opening_gate import ADMIT_PER_TICK, ADMIT_WHEN_LATE, TICK_S, OpeningGate, gate_of

LAG_LIMIT_S = 0.1
UPGRADE = (b"GET /gone HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


class Loop:
    """What the gate uses of an event loop, with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.ticks: list[tuple[float, Callable[[], None]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        self.ticks.append((when, callback))

    def tick(self, late_s: float = 0.0) -> None:
        """Run the gate's next tick, `late_s` after it was due."""
        when, callback = self.ticks.pop(0)
        self.now = when + late_s
        callback()


CLIENT = "addr:10.0.0.1"


class Upgrade:
    def __init__(self, name: str, opened: list[str]) -> None:
        self.name = name
        self.opened = opened

    def upgrade_now(self) -> None:
        self.opened.append(self.name)


def admit(gate: OpeningGate, upgrade: Upgrade, client: str) -> bool:
    """What the gateway's HTTP protocol does with an upgrade: True if it went through now,
    else it waits in its client's line."""
    if gate.admit_now():
        return True
    gate.wait(upgrade, client)  # type: ignore[arg-type]
    return False


def _gate() -> tuple[Loop, OpeningGate, list[str]]:
    loop = Loop()
    return loop, OpeningGate(loop, LAG_LIMIT_S), []  # type: ignore[arg-type]


def test_upgrades_go_through_while_the_loop_keeps_up_and_wait_in_order_past_a_tick_s_share():
    loop, gate, opened = _gate()
    assert all(admit(gate, Upgrade("now", opened), CLIENT) for _ in range(ADMIT_PER_TICK))
    later = [Upgrade(f"later{i}", opened) for i in range(ADMIT_PER_TICK + 3)]
    assert not any(admit(gate, u, CLIENT) for u in later)
    assert gate.waited == len(later) and opened == []
    loop.tick()  # on time: a tick's share, first come first
    assert opened == [u.name for u in later[:ADMIT_PER_TICK]]
    last = Upgrade("last", opened)
    assert not admit(gate, last, CLIENT)  # others wait: it waits behind them
    loop.tick()
    assert opened[ADMIT_PER_TICK:] == [u.name for u in later[ADMIT_PER_TICK:]] + ["last"]
    assert not gate.waiting and loop.ticks[0][0] == pytest.approx(loop.now + TICK_S)


def test_waiting_clients_take_turns_so_one_client_s_flood_delays_its_own_upgrades():
    loop, gate, opened = _gate()
    assert all(admit(gate, Upgrade("now", opened), CLIENT) for _ in range(ADMIT_PER_TICK))
    flood = [Upgrade(f"a{i}", opened) for i in range(3 * ADMIT_PER_TICK)]
    assert not any(admit(gate, u, "addr:10.0.0.66") for u in flood)
    others = {c: [Upgrade(f"{c[-1]}{i}", opened) for i in range(2)]
              for c in ("addr:10.0.0.2", "token:b")}
    for client, upgrades in others.items():
        assert not any(admit(gate, u, client) for u in upgrades)
    assert gate.queued == len(flood) + 4
    loop.tick()
    # One upgrade a client a turn, the clients in the order they first waited.
    assert opened[:7] == ["a0", "20", "b0", "a1", "21", "b1", "a2"]
    first_tick = ADMIT_PER_TICK - 4  # the flood's share of the tick
    assert opened[7:] == [f"a{i}" for i in range(3, first_tick)]
    assert list(gate.waiting) == ["addr:10.0.0.66"] and gate.queued == len(flood) - first_tick
    gate.forget(flood[-1], "addr:10.0.0.66")
    gate.forget(flood[-1], "addr:10.0.0.66")  # once only
    gate.forget(Upgrade("never", opened), "addr:10.9.9.9")  # a client with no line
    assert gate.queued == len(flood) - first_tick - 1
    while gate.waiting:
        loop.tick()
    assert opened[-1] == flood[-2].name and not gate.waiting and gate.queued == 0


def test_a_late_loop_lets_a_few_through_a_tick_and_a_client_gone_is_forgotten():
    loop, gate, opened = _gate()
    assert all(admit(gate, Upgrade("now", opened), CLIENT) for _ in range(ADMIT_PER_TICK))
    waiting = [Upgrade(f"w{i}", opened) for i in range(2 * ADMIT_WHEN_LATE + 2)]
    assert not any(admit(gate, u, CLIENT) for u in waiting)
    loop.tick(late_s=LAG_LIMIT_S * 3)  # the loop is busy: a few through, not a tick's share
    assert opened == [u.name for u in waiting[:ADMIT_WHEN_LATE]]
    assert gate.lag_s == pytest.approx(LAG_LIMIT_S * 3)
    gate.forget(waiting[ADMIT_WHEN_LATE], CLIENT)  # its client left while it waited
    gate.forget(waiting[0], CLIENT)  # already through: nothing to forget
    loop.tick(late_s=LAG_LIMIT_S * 3)
    assert opened == [u.name for u in waiting[:2 * ADMIT_WHEN_LATE + 1]
                      if u is not waiting[ADMIT_WHEN_LATE]]
    assert not admit(gate, Upgrade("next", opened), CLIENT)  # no budget left in a late tick
    loop.tick()
    assert opened[-2:] == [waiting[-1].name, "next"] and not gate.waiting


def test_an_upgrade_that_fails_in_its_turn_stops_neither_the_others_nor_the_ticks(caplog):
    class Failing(Upgrade):
        def upgrade_now(self) -> None:
            raise RuntimeError("the websocket protocol refused it")

    loop, gate, opened = _gate()
    assert all(admit(gate, Upgrade("now", opened), CLIENT) for _ in range(ADMIT_PER_TICK))
    for upgrade in (Failing("bad", opened), Upgrade("after", opened)):
        assert not admit(gate, upgrade, CLIENT)
    loop.tick()
    assert opened == ["after"] and not gate.waiting and len(loop.ticks) == 1
    assert "a websocket upgrade that waited failed" in caplog.text


def test_no_gate_when_its_limit_is_zero_and_one_per_server():
    class Server:
        pass

    server, loop = Server(), Loop()
    assert gate_of(server, loop, 0) is None  # type: ignore[arg-type]
    gate = gate_of(server, loop, LAG_LIMIT_S)  # type: ignore[arg-type]
    assert gate is not None and gate_of(server, loop, LAG_LIMIT_S) is gate  # type: ignore[arg-type]


class HeldGate(OpeningGate):
    """A gate whose turns the test gives (`let_through`): every upgrade waits."""

    def __init__(self) -> None:
        self.budget = 0
        self.waiting = {}
        self.queued = 0
        self.waited = 0

    def let_through(self) -> None:
        self._next().upgrade_now()


def test_through_uvicorn_a_waiting_upgrade_is_answered_in_its_turn_and_forgotten_if_gone():
    import uvicorn
    import uvloop
    from websockets.asyncio.client import connect

    from schema.settings import Settings
    from viewgate.http_protocol import MAX_EARLY_BYTES
    from viewgate.serving import uvicorn_options
    from viewgate.stack.process import eventually

    accepted: list[str] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        assert scope["type"] == "websocket"
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        accepted.append(scope["path"])
        await send({"type": "websocket.send", "text": "hello"})
        while (await receive())["type"] != "websocket.disconnect":
            pass

    async def until(done: Callable[[], bool], what: str) -> None:
        async def holds() -> bool | None:
            return True if done() else None
        await eventually(holds, timeout_s=10, what=what, interval_s=0.01)

    async def main() -> None:
        options = uvicorn_options(Settings())
        config = uvicorn.Config(app, port=0, http=options["http"], ws=options["ws"],
                                lifespan="off", log_level="warning")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        try:
            await until(lambda: server.started, "uvicorn started")
            gate = server.server_state.opening_gate = HeldGate()  # the server's gate
            port = server.servers[0].sockets[0].getsockname()[1]

            # A client that leaves while its upgrade waits: forgotten, never opened.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(UPGRADE)
            await until(lambda: gate.queued == 1, "the first upgrade waiting")
            writer.close()
            await until(lambda: not gate.waiting, "the gone client forgotten")

            # One that sends more than an upgrade before its answer: not a websocket client.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(UPGRADE.replace(b"/gone", b"/pushy"))
            await until(lambda: gate.queued == 1, "the second upgrade waiting")
            writer.write(b"x" * (MAX_EARLY_BYTES + 1))
            await until(lambda: not gate.waiting, "the pushy one dropped")
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, unanswered
            writer.close()

            # One that waits, then gets its turn: the handshake completes and it is served.
            opening = asyncio.ensure_future(connect(f"ws://127.0.0.1:{port}/kept"))
            await until(lambda: gate.queued == 1, "the third upgrade waiting")
            assert list(gate.waiting) == ["addr:127.0.0.1"]  # in its client's line
            assert not opening.done() and accepted == []
            gate.let_through()
            ws = await asyncio.wait_for(opening, 10)
            assert await asyncio.wait_for(ws.recv(), 10) == "hello"
            await ws.close()
            assert accepted == ["/kept"] and gate.waited == 3
        finally:
            server.should_exit = True
            await serving

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as the gateway runs
        runner.run(main())
