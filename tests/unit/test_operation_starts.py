"""Fair starts (gateway.subscriptions.operation_starts): a connection holds at most a few
operations starting at once; a start settles once, by id, by its task ending, or from the
operation's own task through the context variable it inherits."""

from __future__ import annotations

import asyncio

from gateway.subscriptions.operation_starts import (
    OperationStarts,
    enter,
    leave,
    settle_current,
)


async def _run_pending() -> None:
    """Let every task already scheduled take its next step (the loop runs callbacks in
    order, so ours comes after theirs)."""
    ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(ran.set)
    await ran.wait()


async def _nothing() -> None:
    return None


def test_the_next_start_waits_until_one_settles():
    async def scenario() -> None:
        starts = OperationStarts(limit=2)
        await starts.begin("1")
        await starts.begin("2")
        third = asyncio.create_task(starts.begin("3"))
        await _run_pending()
        assert not third.done()  # both permits held
        starts.settle("1")
        starts.settle("1")  # a second settle gives nothing more back
        await asyncio.wait_for(third, 5)
        fourth = asyncio.create_task(starts.begin("4"))
        await _run_pending()
        assert not fourth.done()
        fourth.cancel()
    asyncio.run(scenario())


def test_a_start_settles_from_its_task_or_when_the_task_ends():
    async def scenario() -> None:
        starts = OperationStarts(limit=1)
        waiting = asyncio.Event()

        async def operation() -> None:
            settle_current()  # e.g. its subscription now waits for changes
            await waiting.wait()

        token = enter(await starts.begin("a"))
        task = asyncio.create_task(operation())  # inherits the start
        leave(token)
        starts.settle_when_done("a", task)
        await asyncio.wait_for(starts.begin("b"), 5)  # settled by the task, still running
        done = asyncio.create_task(_nothing())
        starts.settle_when_done("b", done)
        await asyncio.wait_for(starts.begin("c"), 5)  # settled when that task ended
        waiting.set()
        await task
    asyncio.run(scenario())
