"""Which views keep a gateway from being ready."""

from __future__ import annotations

from gateway.ops.readiness import view_problems
from schema import demo
from schema.storage import ViewMeta

NOW_MS = 1_000_000_000.0


def _metas(**changes: ViewMeta) -> dict[str, ViewMeta]:
    topic = {name: demo.CATALOG.source_of(v).topic for name, v in demo.CATALOG.views.items()}
    caught_up = {name: ViewMeta(version=5, committed_at_ms=int(NOW_MS) - 120_000,
                                offsets={topic[name]: {"0": 100}})
                 for name in demo.CATALOG.views}
    return {**caught_up, **changes}


ENDS = {"orders": {"0": 100}, "customers": {"0": 100}}


def test_caught_up_views_are_ready_even_when_their_last_commit_is_old():
    assert view_problems(demo.CATALOG, _metas(), ENDS, NOW_MS, 60) == {}


def test_a_view_that_never_committed_or_lags_too_long_is_not_ready():
    metas = _metas(Customer=ViewMeta(version=-1))
    ends = {**ENDS, "orders": {"0": 130}}  # 30 order events not processed for 120 s
    problems = view_problems(demo.CATALOG, metas, ends, NOW_MS, 60)
    assert problems["Customer"] == "never committed"
    assert set(problems) == {"Customer", "OrderRecord", "Order", "CustomerStats",
                             "ProductSales"}
    assert "30 source events waiting" in problems["Order"]
    # Within the allowed lag, or with Kafka unreachable, only the uncommitted view counts.
    assert set(view_problems(demo.CATALOG, metas, ends, NOW_MS, 300)) == {"Customer"}
    assert set(view_problems(demo.CATALOG, metas, None, NOW_MS, 60)) == {"Customer"}
