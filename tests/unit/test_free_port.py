"""viewgate.stack.process.free_port: ports no outgoing connection takes before they are bound."""

import socket

from viewgate.stack import process
from viewgate.stack.process import free_port, port_in_use


def test_ports_are_below_the_ephemeral_range_unbound_and_never_repeated() -> None:
    low = process._ephemeral_low()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(max(1024, low - process._BELOW_EPHEMERAL) <= p < low for p in ports)
    assert not any(port_in_use(p) for p in ports)


def test_a_bound_port_is_not_handed_out(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        choices = iter([busy, busy])
        monkeypatch.setattr(process.random, "randrange",
                            lambda a, b: next(choices, None) or (a + b) // 2)
        monkeypatch.setattr(process, "_handed_out", set())
        port = free_port()
        assert port != busy
        assert not port_in_use(port)


def test_without_room_below_the_range_the_kernel_picks(monkeypatch) -> None:
    monkeypatch.setattr(process, "_ephemeral_low", lambda: 1500)
    port = free_port()
    assert port >= 1024 and not port_in_use(port)
