"""The gateway's pure logic: filters, index ranges, cursors, paging, cost, negotiation."""

from __future__ import annotations

import datetime
import random

import pytest
from graphql import parse

from gateway.access.limits import query_cost
from gateway.http.http import (
    GRAPHQL_RESPONSE,
    JSON,
    is_json_body,
    media_for,
    negotiate,
    operation_type,
)
from gateway.reads.filters import (
    Condition,
    Order,
    Page,
    QueryError,
    decode_cursor,
    encode_cursor,
    key_lookup,
    make_page,
    matches,
    paginate,
    parse_order,
    parse_where,
)
from gateway.reads.indexes import after_cursor, ranges
from schema.catalog import graphql_fields
from schema.demo import CATALOG
from schema.storage import INDEX_SEPARATOR

ORDER = CATALOG.view("Order")
CUSTOMER = CATALOG.view("Customer")
FIELDS = graphql_fields(ORDER)


def test_a_filter_on_an_unindexed_field_lists_the_filterable_fields():
    with pytest.raises(QueryError) as error:
        parse_where(ORDER, FIELDS, {"product_id": {"eq": "P1"}})
    assert "productId" in error.value.message
    assert "orderId, customerId, status, amount, ts" in error.value.message
    assert error.value.extensions["code"] == "FIELD_NOT_INDEXED"


def test_the_key_takes_only_eq_and_in_unless_indexed():
    with pytest.raises(QueryError):
        parse_where(ORDER, FIELDS, {"order_id": {"gt": "A"}})
    conditions = parse_where(ORDER, FIELDS, {"order_id": {"in": ["b", "a", "b"]}})
    assert conditions == [Condition("order_id", "in", ("b", "a"))]
    assert key_lookup(ORDER, conditions) == ["a", "b"]


def test_sorting_by_an_unindexed_field_is_refused_and_the_default_follows_the_filter():
    with pytest.raises(QueryError) as error:
        parse_order(ORDER, FIELDS, "product_id", False, [])
    assert "customerId, status, amount, ts" in error.value.message
    filtered = [Condition("amount", "gt", 3.0)]
    assert parse_order(ORDER, FIELDS, None, False, filtered) == Order("amount")
    assert parse_order(ORDER, FIELDS, None, True, []) == Order("customer_id", True)


def test_matches_compares_timestamps_strings_and_numbers_like_the_indexes():
    row = {"order_id": "o1", "customer_id": "C7", "amount": 10, "status": "paid",
           "ts": "2024-01-01T00:00:01.500000Z"}
    ts = datetime.datetime(2024, 1, 1, 0, 0, 1, 500000, tzinfo=datetime.UTC)
    assert matches(row, [Condition("ts", "eq", ts), Condition("amount", "gte", 10.0)], FIELDS)
    assert matches(row, [Condition("customer_id", "prefix", "C")], FIELDS)
    assert not matches(row, [Condition("status", "in", ("placed",))], FIELDS)
    assert not matches(row, [Condition("amount", "lt", 10)], FIELDS)


def _members(values: list[str]) -> list[bytes]:
    return sorted(f"{v}{INDEX_SEPARATOR}k{i}".encode() for i, v in enumerate(values))


def _in_lex_range(member: bytes, low: bytes, high: bytes) -> bool:
    """ZRANGEBYLEX's bound semantics, for checking the ranges without Redis."""
    ok_low = low == b"-" or (member >= low[1:] if low[:1] == b"[" else member > low[1:])
    ok_high = high == b"+" or (member <= high[1:] if high[:1] == b"[" else member < high[1:])
    return ok_low and ok_high


@pytest.mark.parametrize("op", ["eq", "lt", "lte", "gt", "gte", "prefix"])
def test_string_index_ranges_select_exactly_the_matching_values(op):
    rng = random.Random(op)
    alphabet = ["a", "ab", "abc", "b", "ba", "é", "z", "a b", ""]
    values = [rng.choice(alphabet) for _ in range(200)]
    info = FIELDS["status"]
    for probe in alphabet:
        (r,) = ranges(info, [Condition("status", op, probe)]) or [None]
        selected = {m for m in _members(values) if r is not None and _in_lex_range(m, *r.lex())}
        expected = {m for m in _members(values) if matches(
            {"status": m.decode().split(INDEX_SEPARATOR)[0]},
            [Condition("status", op, probe)], FIELDS)}
        assert selected == expected, (op, probe)


def test_score_ranges_and_in_lists():
    info = FIELDS["amount"]
    (r,) = ranges(info, [Condition("amount", "gt", 2.5), Condition("amount", "lte", 7)])
    assert r.score() == ("(2.5", "7.0")
    both = ranges(info, [Condition("amount", "in", (3.0, 1.0, 9.0)), Condition("amount", "lt", 5)])
    assert [x.score() for x in both] == [("1.0", "1.0"), ("3.0", "3.0")]
    assert ranges(info, [Condition("amount", "gt", 5), Condition("amount", "lt", 5)]) == []


def test_after_cursor_excludes_the_cursor_member_in_a_string_index():
    info = FIELDS["status"]
    (r,) = ranges(info, [Condition("status", "gte", "a")])
    low, high = after_cursor(r, info, ("paid", "o5"), reverse=False).lex()
    assert low == b"(paid\x00o5" and high == b"+"
    low, high = after_cursor(r, info, ("paid", "o5"), reverse=True).lex()
    assert (low, high) == (b"[a\x00", b"(paid\x00o5")


def test_cursors_round_trip_and_reject_garbage():
    order = Order("amount")
    assert decode_cursor(encode_cursor((12.5, "o1")), order, FIELDS) == (12.5, "o1")
    for bad in ("???", encode_cursor(("text", "o1")), "eyJhIjoxfQ"):
        with pytest.raises(QueryError) as error:
            decode_cursor(bad, order, FIELDS)
        assert error.value.extensions["code"] == "BAD_CURSOR"


def test_paginate_walks_both_ways_without_gaps_or_repeats():
    items = [((float(v), f"k{i:02d}"), i) for i, v in enumerate([1, 1, 2, 3, 3, 3, 4, 5, 8, 9])]
    items.sort(key=lambda item: item[0])
    for descending in (False, True):
        order = Order("amount", descending)
        expected = [i for _, i in (reversed(items) if descending else items)]
        seen, cursor = [], None
        while True:
            page, more = paginate(items, order, Page(3, False, cursor))
            seen += [i for _, i in page]
            if not more:
                break
            cursor = page[-1][0]
        assert seen == expected
        seen, cursor = [], None
        while True:
            page, more = paginate(items, order, Page(4, True, cursor))
            seen = [i for _, i in page] + seen
            if not more:
                break
            cursor = page[0][0]
        assert seen == expected


def test_page_arguments_are_checked():
    order = Order("amount")
    with pytest.raises(QueryError):
        make_page(1, None, 1, None, order, FIELDS, 20, 100)
    with pytest.raises(QueryError) as error:
        make_page(101, None, None, None, order, FIELDS, 20, 100)
    assert error.value.extensions["code"] == "LIMIT_PAGE_SIZE"
    assert make_page(None, None, None, None, order, FIELDS, 20, 100) == Page(20)


def test_query_cost_multiplies_nested_page_sizes():
    from gateway.app import build_schema
    from gateway.reads.reads import Reads
    from schema.settings import Settings

    settings = Settings()
    reads = Reads(CATALOG, settings)
    schema, _ = build_schema(settings, reads.redis.client, CATALOG, reads)
    document = parse("query($n: Int) { customers(first: $n) { edges { node { name "
                     "orders(first: 30) { orderId customer { name } } } } } "
                     "order(orderId: \"x\") { orderId } }")
    assert query_cost(schema._schema, document, None, {"n": 10}, 20, 500) == 10 + 10 * 30
    assert query_cost(schema._schema, document, None, {}, 20, 500) == 20 + 20 * 30
    with pytest.raises(QueryError):
        query_cost(schema._schema, document, None, {"n": 501}, 20, 500)


@pytest.mark.parametrize(("accept", "media"), [
    (None, JSON),
    ("application/json", JSON),
    (GRAPHQL_RESPONSE, GRAPHQL_RESPONSE),
    (f"{GRAPHQL_RESPONSE}, application/json;q=0.9", GRAPHQL_RESPONSE),
    (f"application/json, {GRAPHQL_RESPONSE};q=0.5", JSON),
    ("*/*", JSON),  # what curl and older clients send: plain JSON
    ("", JSON),
    ("application/*", JSON),
    (f"*/*, {GRAPHQL_RESPONSE}", GRAPHQL_RESPONSE),  # named beats a wildcard
    (f"application/json, {GRAPHQL_RESPONSE}", GRAPHQL_RESPONSE),  # ours at equal quality
    ("application/json;q=0.5, */*", GRAPHQL_RESPONSE),  # */* covers ours at q=1
    ("application/json;q=0, */*", GRAPHQL_RESPONSE),
    (f"{GRAPHQL_RESPONSE};q=0, */*", JSON),
    ("APPLICATION/JSON; charset=utf-8", JSON),
    ("text/plain", None),
    ("text/html;q=0.9, application/xml", None),
    (f"{GRAPHQL_RESPONSE};q=0, application/json;q=0", None),
])
def test_accept_negotiation(accept, media):
    assert negotiate(accept) == media


@pytest.mark.parametrize(("media", "status", "header"), [
    (JSON, 200, "application/json; charset=utf-8"),
    (GRAPHQL_RESPONSE, 294, "application/graphql-response+json; charset=utf-8"),
    # The watershed: a GraphQL response that is not a 2xx says what it is.
    (JSON, 422, "application/graphql-response+json; charset=utf-8"),
    (JSON, 405, "application/graphql-response+json; charset=utf-8"),
])
def test_the_content_type_of_an_answer(media, status, header):
    assert media_for(media, status) == header


@pytest.mark.parametrize(("content_type", "read"), [
    ("application/json", True),
    ("Application/JSON; charset=UTF-8", True),
    ('application/json; charset="utf-8"', True),
    ("application/json; charset=latin1", False),
    ("text/plain", False),
    ("application/x-www-form-urlencoded", False),
    ("application/jsonx", False),
    (None, False),
    ("", False),
])
def test_which_post_bodies_are_read(content_type, read):
    assert is_json_body(content_type) is read


@pytest.mark.parametrize(("query", "name", "kind"), [
    ("mutation { x }", None, "mutation"),
    ("subscription S { a } query Q { b }", "S", "subscription"),
    ("subscription S { a } query Q { b }", "Q", "query"),
    ("subscription S { a } query Q { b }", None, None),  # ambiguous: validation says so
    ("{ a }", None, "query"),
    ("mutation {", None, None),  # does not parse
])
def test_the_operation_a_request_picks(query, name, kind):
    assert operation_type(query, name) == kind
