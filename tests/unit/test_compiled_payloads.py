"""Compiled change payloads say what graphql-core's executor says, byte for byte, and the
selections that do not compile stay with the executor (gateway.subscriptions.compiled_payloads)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest
from graphql import parse

from gateway.app import build_schema
from gateway.reads.reads import Reads
from gateway.subscriptions.compiled_payloads import compile_payload
from gateway.subscriptions.fanout import Fanout
from gateway.subscriptions.subscriptions import ChangeOp, SubscriptionContext
from schema.demo import CATALOG
from schema.settings import Settings


@pytest.fixture(scope="module")
def demo():
    settings = Settings()
    reads = Reads(CATALOG, settings)
    schema, types = build_schema(settings, reads.redis.client, CATALOG, reads,
                                 Fanout(CATALOG, settings, reads))
    return schema, types


def executor(schema: Any, query: str, variables: dict | None = None) -> Any:
    return schema.execution_context_class.build(
        schema._schema, parse(query), None, SubscriptionContext(websocket=None),
        variables or {}, None, middleware=schema._get_middleware_manager([]))


def general(executor: Any, message: Any) -> str:
    result = executor.build_per_event_executor(message).execute_operation(False)
    payload: dict[str, Any] = {"data": result.data}
    if result.errors:
        payload["errors"] = [e.formatted for e in result.errors]
    return orjson.dumps(payload).decode()


def change(schema: Any, types: dict, view: str, op: str, row: dict | None,
           before: dict | None = None, **overrides: Any) -> Any:
    """A change message as gateway.subscriptions.subscriptions builds it."""
    vt = types[view]
    cls = schema.get_type_by_name(f"{view}Change").origin
    fields = dict(op=ChangeOp(op), key="k-1", version=42, cursor="c\"ursor",
                  row=vt.to_object(row) if row is not None else None,
                  before=vt.to_object(before) if before is not None else None,
                  committed_at_ms=1_795_760_844_160)
    return cls(**{**fields, **overrides})


CUSTOMER = {"customer_id": "C1", "name": "Ada \"Lovelace\" ü\n", "tier": "gold",
            "country": "DE"}
STATS = {"customer_id": "C1", "order_count": 3, "total_spent": 30.5, "avg_order": 10.1666,
         "max_order": 20.0, "min_order": 0.5, "last_order_at": "2026-11-27T06:27:21.534Z"}
STATS_AGAIN = dict(STATS, order_count=4, total_spent=1e-7, last_order_at="2026-11-27T06:28:00")
ORDER = {"order_id": "O1", "customer_id": "C1", "product_id": "P1", "amount": 12.25,
         "status": "placed", "ts": "2026-11-27T06:27:21Z", "customer_tier": None,
         "customer_country": "FR"}

COMPILED = [
    ("Customer", "subscription { customerChanges { op version } }"),
    ("Customer", "subscription { customerChanges { __typename op key version cursor "
                 "committedAtMs row { __typename customerId name tier country } "
                 "before { name } } }"),
    ("Customer", "subscription S($id: String!) { live: customer(customerId: $id) "
                 "{ what: op v: version row { n: name } } }"),
    ("Customer", "subscription($w: CustomerWhere) { customerChanges(where: $w) "
                 "{ op row { tier } } }"),
    ("CustomerStats", "subscription { customerStatsChanges { op row { customerId "
                      "orderCount totalSpent avgOrder maxOrder minOrder lastOrderAt } "
                      "before { orderCount lastOrderAt } } }"),
    ("Order", "subscription { orderChanges { op row { orderId amount ts customerTier "
              "customerCountry } } }"),
]

NOT_COMPILED = [
    # A relationship resolves through Redis: the executor's.
    "subscription { orderChanges { op row { customer { name } } } }",
    "subscription { orderChanges { ...F } } fragment F on OrderChange { op }",
    "subscription { orderChanges { ... on OrderChange { op } } }",
    "subscription($x: Boolean!) { orderChanges { op @include(if: $x) } }",
    "subscription { orderChanges { op op } }",  # merged by the executor
    # A live list page: edges are a list.
    "subscription { customers(first: 2) { edges { node { name } } } }",
]


@pytest.mark.parametrize(("view", "query"), COMPILED)
def test_compiled_payloads_match_the_executor(demo, view, query):
    schema, types = demo
    ex = executor(schema, query, {"id": "C1"})
    compiled = compile_payload(ex)
    assert compiled is not None
    rows = {"Customer": [CUSTOMER], "CustomerStats": [STATS, STATS_AGAIN],
            "Order": [ORDER]}[view]
    messages = [change(schema, types, view, "CURRENT", rows[0]),
                change(schema, types, view, "DELETE", None, rows[0], cursor=None)]
    messages += [change(schema, types, view, "UPDATE", row, rows[0]) for row in rows]
    for message in messages:
        payload = compiled(message)
        assert payload is not None
        assert payload == general(ex, message)
        assert orjson.loads(payload)["data"]  # a real layout, not an empty answer


@pytest.mark.parametrize("query", NOT_COMPILED)
def test_other_selections_stay_with_the_executor(demo, query):
    schema, _ = demo
    assert compile_payload(executor(schema, query, {"x": True})) is None


def test_what_the_executor_would_refuse_goes_back_to_it(demo):
    schema, types = demo
    ex = executor(schema, "subscription { customerChanges { op key version } }")
    compiled = compile_payload(ex)
    assert compiled is not None
    # A null key (non-null in the schema) and a version past GraphQL's Int: errors.
    for message in (change(schema, types, "Customer", "INSERT", CUSTOMER, key=None),
                    change(schema, types, "Customer", "INSERT", CUSTOMER, version=2**40)):
        assert compiled(message) is None
        assert "errors" in orjson.loads(general(ex, message))
    # A null in a row's non-null column.
    ex = executor(schema, "subscription { customerStatsChanges { row { totalSpent } } }")
    compiled = compile_payload(ex)
    assert compiled is not None
    message = change(schema, types, "CustomerStats", "UPDATE",
                     dict(STATS, total_spent=None), STATS)
    assert compiled(message) is None
    assert "errors" in orjson.loads(general(ex, message))


def test_a_datetime_row_value_is_serialized_by_its_scalar(demo):
    schema, types = demo
    ex = executor(schema, "subscription { orderChanges { row { ts } } }")
    compiled = compile_payload(ex)
    assert compiled is not None
    message = change(schema, types, "Order", "INSERT", ORDER)
    assert isinstance(message.row.ts, dt.datetime)
    assert orjson.loads(compiled(message))["data"]["orderChanges"]["row"]["ts"] \
        == orjson.loads(general(ex, message))["data"]["orderChanges"]["row"]["ts"]


def test_a_rows_columns_are_converted_when_first_read(demo):
    _, types = demo
    vt = types["Order"]
    stored = dict(ORDER)
    row = vt.to_object(stored)
    assert isinstance(row, vt.object)  # what GraphQL checks a value of the type against
    assert "amount" not in vars(row)  # nothing converted yet
    assert row.ts == dt.datetime(2026, 11, 27, 6, 27, 21, tzinfo=dt.UTC)
    assert row.customer_tier is None and row.amount == 12.25
    assert vars(row)["amount"] == 12.25  # kept once read
    stored["amount"] = 99  # the row is read once per column
    assert row.amount == 12.25
    fresh = vt.to_object(ORDER)
    assert {name: getattr(fresh, name) for name in vt.fields} == {
        "order_id": "O1", "customer_id": "C1", "product_id": "P1", "amount": 12.25,
        "status": "placed", "ts": dt.datetime(2026, 11, 27, 6, 27, 21, tzinfo=dt.UTC),
        "customer_tier": None, "customer_country": "FR"}
    with pytest.raises(AttributeError):
        row.not_a_column  # noqa: B018
