"""The per-connection websocket message budget: a burst, then the rate; 0 is no limit."""

from __future__ import annotations

from gateway.subscriptions.message_rate import MessageBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate():
    clock = Clock()
    budget = MessageBudget(rate=2, burst=3, clock=clock)
    assert [budget.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one message's worth at 2/s
    assert [budget.take(), budget.take()] == [True, False]
    clock.now += 60  # refills up to the burst, not beyond
    assert [budget.take() for _ in range(4)] == [True, True, True, False]


def test_rate_zero_is_no_limit():
    budget = MessageBudget(rate=0, burst=1)
    assert all(budget.take() for _ in range(10_000))
