"""One version of the view graph within a request (gateway.reads.consistency): the
seqlock's decisions, over scripted marks (the integration tests read the engine's own)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace

from gateway.reads.consistency import ATTEMPTS, GraphVersion
from gateway.reads.freshness import Freshness, Seen
from schema import demo


class ScriptedMarks:
    """Stands in for RedisStore's two calls the seqlock makes: the marks, in turn."""

    def __init__(self, marks: list[tuple[int | None, int | None]]) -> None:
        self.marks: Iterator[tuple[int | None, int | None]] = iter(marks)
        self.asked = 0

    def generation(self, view: str) -> int:
        return 0

    async def graph_mark(self, generation: int) -> tuple[int | None, int | None]:
        self.asked += 1
        return next(self.marks)


def _attempts(views: tuple[str, ...], versions: list[int]):
    """An execution that reads `views` from Redis at the given meta version, each run."""
    runs = iter(versions)

    async def attempt():
        fresh = Freshness()
        version = next(runs)
        for view in views:
            fresh.note(view, Seen(version, None, None, "redis"))
        return "answer", fresh
    return attempt


def _run(graph: GraphVersion, attempt) -> Freshness:
    seen: list[Freshness] = []

    async def recorded():
        result, fresh = await attempt()
        seen.append(fresh)
        return result, fresh

    answer, fresh = asyncio.run(graph.run(("q", None), recorded))
    assert answer == "answer" and fresh is seen[-1]
    return fresh


def test_one_view_is_never_bracketed():
    marks = ScriptedMarks([])
    fresh = _run(GraphVersion(marks, demo.CATALOG), _attempts(("Order",), [7, 7]))
    assert marks.asked == 0 and not GraphVersion(marks, demo.CATALOG).read_several(fresh)


def test_a_new_document_over_several_views_runs_again_bracketed_then_stays_bracketed():
    marks = ScriptedMarks([(8, None), (8, None), (8, None), (9, None), (9, None)])
    graph = GraphVersion(marks, demo.CATALOG)
    fresh = _run(graph, _attempts(("Order", "Customer"), [7, 8]))
    # The cached meta said 7 for the second run; the bracket proves the rows are at 8.
    assert fresh.graph_version == 8 and fresh.latest["Customer"].version == 8
    assert marks.asked == 3
    fresh = _run(graph, _attempts(("Order", "Customer"), [9]))
    assert fresh.graph_version == 9 and marks.asked == 5  # bracketed at once


def test_without_a_graph_version_in_redis_nothing_is_promised_nor_run_again():
    # An emptied Redis (the answer came from Delta) holds no marks: one run, no version.
    marks = ScriptedMarks([(None, None)])
    fresh = _run(GraphVersion(marks, demo.CATALOG), _attempts(("Order", "Customer"), [5]))
    assert fresh.graph_version is None and fresh.latest["Order"].version == 5
    assert marks.asked == 1


def test_a_batch_landing_during_the_reads_runs_the_request_again():
    marks = ScriptedMarks([(8, None), (9, None), (9, None), (9, None)])
    graph = GraphVersion(marks, demo.CATALOG)
    graph._learn(("q", None))
    fresh = _run(graph, _attempts(("Order", "CustomerStats"), [8, 9]))
    assert fresh.graph_version == 9 and marks.asked == 4


def test_batches_landing_every_time_give_up_and_say_so():
    marks = ScriptedMarks([(v, None) for v in range(2 * ATTEMPTS)])
    graph = GraphVersion(marks, demo.CATALOG)
    graph._learn(("q", None))
    fresh = _run(graph, _attempts(("Order", "Customer"), list(range(ATTEMPTS))))
    assert fresh.graph_version is None and marks.asked == 2 * ATTEMPTS


def test_a_stream_aggregate_with_a_query_of_its_own_is_not_part_of_the_graph():
    # An average cannot be kept from a window's rows: the view keeps a query of its own.
    averages = dataclasses.replace(
        demo.PRODUCT_SALES, name="AverageSale",
        sql="SELECT product_id, avg(amount) AS average FROM orders GROUP BY product_id",
        key=("product_id",))
    catalog = SimpleNamespace(views={**demo.CATALOG.views, "AverageSale": averages})
    marks = ScriptedMarks([])
    fresh = _run(GraphVersion(marks, catalog), _attempts(("Order", "AverageSale"), [3]))
    assert marks.asked == 0 and not GraphVersion(marks, catalog).read_several(fresh)
    # The demo's windowed sales are kept from their rows, in the graph.
    assert GraphVersion(marks, demo.CATALOG).views >= {"ProductSales", "Order"}
