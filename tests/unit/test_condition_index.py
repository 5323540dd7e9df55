"""gateway.subscriptions.condition_index: the filters a change may concern, found by value
instead of trying every one, must be exactly those that trying every one finds."""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass

import pytest

from gateway.reads.filters import Condition, parse_where
from gateway.subscriptions.condition_index import ConditionIndex, anchor
from gateway.subscriptions.subscribers import touches
from schema.catalog import graphql_fields
from schema.demo import CATALOG
from schema.storage import ChangeEvent, decode_row, encode_row

ORDER = CATALOG.view("Order")
FIELDS = graphql_fields(ORDER)
CUSTOMERS = [f"C{i}" for i in range(8)]
STATUSES = ["placed", "shipped", "cancelled"]
AMOUNTS = [0.0, 5.0, 12.5, 99.0]
TIMES = [datetime.datetime(2026, 11, 28, h, tzinfo=datetime.UTC) for h in range(4)]


@dataclass
class Watched:
    conditions: list[Condition]


def _random_where(rnd: random.Random) -> dict:
    where: dict = {}
    for _ in range(rnd.randint(0, 3)):
        kind = rnd.choice(["customer_eq", "customer_in", "status", "amount", "ts", "prefix"])
        if kind == "customer_eq":
            where["customer_id"] = {"eq": rnd.choice(CUSTOMERS)}
        elif kind == "customer_in":
            where["customer_id"] = {"in": rnd.sample(CUSTOMERS, rnd.randint(1, 3))}
        elif kind == "status":
            where["status"] = ({"eq": rnd.choice(STATUSES)} if rnd.random() < 0.5
                               else {"in": rnd.sample(STATUSES, 2)})
        elif kind == "amount":
            where["amount"] = {rnd.choice(["eq", "gte", "lt"]): rnd.choice(AMOUNTS)}
        elif kind == "ts":
            where["ts"] = {rnd.choice(["eq", "gt"]): rnd.choice(TIMES)}
        else:
            where["status"] = {"prefix": rnd.choice(["pl", "s", "c"])}
    return where


def _random_row(rnd: random.Random) -> dict | None:
    if rnd.random() < 0.2:
        return None
    # Rows as the change feed carries them: stored JSON (timestamps as text).
    return decode_row(encode_row({"order_id": "O1", "customer_id": rnd.choice(CUSTOMERS),
                                  "amount": rnd.choice(AMOUNTS), "ts": rnd.choice(TIMES),
                                  "status": rnd.choice(STATUSES)}))


@pytest.mark.parametrize("seed", range(20))
def test_the_candidates_that_match_are_exactly_the_filters_that_match(seed):
    rnd = random.Random(seed)
    index: ConditionIndex[Watched] = ConditionIndex(FIELDS)
    every: dict[str, Watched] = {}
    for i in range(60):
        key = f"f{i}"
        every[key] = index[key] = Watched(parse_where(ORDER, FIELDS, _random_where(rnd)))
    for key in rnd.sample(sorted(every), 20):  # forgotten filters are never candidates
        del index[key], every[key]
    assert len(index) == len(every)
    for _ in range(200):
        before, row = _random_row(rnd), _random_row(rnd)
        event = ChangeEvent("Order", "O1", "update", row, before, 1, 0, 0)
        candidates = index.candidates(event)
        assert len(candidates) == len({id(c) for c in candidates})  # each once
        found = [c for c in candidates if touches(event, c.conditions, FIELDS)]
        expected = [w for w in every.values() if touches(event, w.conditions, FIELDS)]
        assert sorted(map(id, found)) == sorted(map(id, expected))


def test_a_change_tries_only_the_filters_filed_under_its_values():
    index: ConditionIndex[Watched] = ConditionIndex(FIELDS)
    for i, customer in enumerate(CUSTOMERS):
        index[f"own{i}"] = Watched(parse_where(ORDER, FIELDS, {"customer_id": {"eq": customer}}))
    both = index["both"] = Watched(parse_where(
        ORDER, FIELDS, {"customer_id": {"in": ["C1", "C2"]}, "amount": {"gt": 1.0}}))
    ranged = index["ranged"] = Watched(parse_where(ORDER, FIELDS, {"amount": {"gte": 5.0}}))
    moved = ChangeEvent("Order", "O1", "update",
                        {"customer_id": "C2", "amount": 1.0}, {"customer_id": "C1"}, 1, 0, 0)
    found = index.candidates(moved)
    assert found == [index.get("own1"), both, index.get("own2"), ranged]
    assert anchor(both.conditions).op == "in"  # filed under each of its values, once each
    del index["own1"], index["both"], index["ranged"]
    assert index.candidates(moved) == [index.get("own2")]
    assert index.get("own1") is None and len(index) == len(CUSTOMERS) - 1
