"""When the engine restarts a failed query: a growing pause, reset once it ran a while."""

from __future__ import annotations

from engine.runner import Restarts


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _wait_until_due(restarts: Restarts, clock: Clock, step: float = 0.5) -> float:
    """Seconds from the failure until the restart is due, polled like the engine does."""
    started = clock.now
    while not restarts.due("view:Order:g0", "KafkaException: broker down"):
        clock.now += step
    return clock.now - started


def test_pause_doubles_while_failing_again_soon_and_is_capped():
    clock = Clock()
    restarts = Restarts(clock)
    pauses = [_wait_until_due(restarts, clock) for _ in range(9)]  # fails right after each
    assert pauses[:4] == [1.0, 2.0, 4.0, 8.0]
    assert pauses[-1] == Restarts.MAX_S


def test_a_query_that_ran_a_while_starts_again_from_the_first_pause():
    clock = Clock()
    restarts = Restarts(clock)
    for _ in range(4):
        _wait_until_due(restarts, clock)
    clock.now += Restarts.HEALTHY_S + 1  # it ran for over a minute, then failed
    assert _wait_until_due(restarts, clock) == Restarts.FIRST_S


def test_queries_are_paced_independently():
    clock = Clock()
    restarts = Restarts(clock)
    assert not restarts.due("view:Order:g0", "boom")
    assert not restarts.due("deadletters:orders", "boom")
    clock.now += 1.0
    assert restarts.due("view:Order:g0", "boom") and restarts.due("deadletters:orders", "boom")
