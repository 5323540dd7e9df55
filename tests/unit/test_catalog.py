"""The catalog's structural checks and the type-versus-SQL column comparison."""

from __future__ import annotations

import dataclasses
import datetime
import decimal

import pytest
import strawberry

from schema.catalog import (
    Catalog,
    Relationship,
    Source,
    View,
    ViewKind,
    compare_columns,
    expected_spark_columns,
    graphql_fields,
    parse_ddl,
    parse_duration_ms,
)
from schema.demo import CATALOG, PRODUCT_SALES
from schema.errors import CatalogError, Problem
from schema.loader import load_catalog


@strawberry.type
class Thing:
    thing_id: str
    owner_id: str
    size: int
    price: float | None
    created_at: datetime.datetime


@strawberry.type
class Owner:
    owner_id: str
    name: str


THINGS = Source("things", "things", "thing_id STRING, owner_id STRING, size BIGINT, "
                "price DOUBLE, created_at TIMESTAMP", key="thing_id")
OWNERS = Source("owners", "owners", "owner_id STRING, name STRING", key="owner_id")
THING = View("Thing", "things", "SELECT * FROM things", ("thing_id",), Thing, ViewKind.UPSERT,
             indexes=("owner_id",))
OWNER = View("Owner", "owners", "SELECT * FROM owners", ("owner_id",), Owner, ViewKind.UPSERT)


def catalog(*views: View, sources: tuple[Source, ...] = (THINGS, OWNERS)) -> Catalog:
    return Catalog.of(sources, [OWNER, *views])


def problems(cat: Catalog) -> list[Problem]:
    with pytest.raises(CatalogError) as info:
        cat.validate()
    return info.value.problems


def only(cat: Catalog, view: str, field: str | None) -> Problem:
    """The one problem found, after checking it names the view and field."""
    found = problems(cat)
    assert len(found) == 1, [str(p) for p in found]
    assert (found[0].view, found[0].field) == (view, field)
    return found[0]


def test_demo_catalog_validates() -> None:
    CATALOG.validate()
    assert set(CATALOG.views) == {"Customer", "OrderRecord", "Order", "CustomerStats",
                                   "ProductSales"}
    assert load_catalog(None) is CATALOG
    assert {v.name for v in CATALOG.views_reading("orders")} == {"OrderRecord", "ProductSales"}
    assert [v.name for v in CATALOG.upstream(CATALOG.view("CustomerStats"))] == [
        "Order", "Customer", "OrderRecord"]


def test_small_catalog_validates() -> None:
    catalog(THING).validate()


def test_unknown_view_lists_known_views() -> None:
    with pytest.raises(CatalogError) as info:
        CATALOG.view("Nope")
    assert "Customer" in info.value.problems[0].fix
    assert isinstance(info.value, ValueError)


def test_error_text_names_view_field_and_fix() -> None:
    p = Problem("CustomerStats", "avg_order", "wrong type", "cast it")
    assert str(p) == "view CustomerStats, field avg_order: wrong type. Fix: cast it"
    err = CatalogError([p, Problem("Order", None, "bad", "fix it")])
    assert str(err).splitlines() == [str(p), "view Order: bad. Fix: fix it"]


def test_unknown_source() -> None:
    p = only(catalog(dataclasses.replace(THING, source="nope")), "Thing", None)
    assert "nope" in p.message


def test_empty_key_and_key_not_a_field() -> None:
    assert "empty" in only(catalog(dataclasses.replace(THING, key=())), "Thing", None).message
    found = problems(catalog(dataclasses.replace(THING, key=("thing_id", "colour"))))
    assert [(p.view, p.field) for p in found] == [("Thing", "colour")]


def test_optional_key_column() -> None:
    view = dataclasses.replace(THING, key=("thing_id", "price"))
    assert "Optional" in only(catalog(view), "Thing", "price").message


def test_index_not_a_field() -> None:
    only(catalog(dataclasses.replace(THING, indexes=("owner_id", "weight"))), "Thing", "weight")


def test_dimension_unknown_or_self() -> None:
    found = problems(catalog(dataclasses.replace(THING, dimensions=("Thing", "Ghost", "Owner"))))
    assert [p.view for p in found] == ["Thing", "Thing"]
    assert "itself" in found[0].message and "Ghost" in found[1].message


@strawberry.type
class OwnerStats:
    owner_id: str
    things: int


def owner_stats(source: str = "Thing", **changes) -> View:
    return View("OwnerStats", source, "SELECT owner_id, count(*) AS things FROM Thing "
                "GROUP BY owner_id", ("owner_id",), OwnerStats, ViewKind.TABLE, **changes)


def test_a_table_view_reads_views_and_is_kept_apart_from_views_over_topics() -> None:
    ok = catalog(THING, owner_stats())
    ok.validate()
    stats = ok.view("OwnerStats")
    assert stats.reads == ("Thing",)
    assert ok.source_of(stats).name == "things"  # the source at the end of its chain
    assert [v.name for v in ok.upstream(stats)] == ["Thing"]
    assert [v.name for v in ok.downstream("Thing")] == ["OwnerStats"]
    assert "OwnerStats" not in [v.name for v in ok.views_reading("things")]
    # A table view over a topic, a view over a view that is not a table view.
    assert "is a source" in only(catalog(THING, owner_stats("things")), "OwnerStats", None).fix
    over_view = dataclasses.replace(owner_stats(), kind=ViewKind.AGGREGATE)
    assert "set kind=ViewKind.TABLE" in only(catalog(THING, over_view), "OwnerStats", None).fix


def test_a_table_view_may_not_read_a_stream_aggregate() -> None:
    aggregate = View("Agg", "things", "SELECT owner_id, count(*) AS things FROM things "
                     "GROUP BY owner_id", ("owner_id",), OwnerStats, ViewKind.AGGREGATE)
    agg_type = strawberry.type(type("Agg", (), {"__annotations__": {"owner_id": str,
                                                                    "things": int}}))
    aggregate = dataclasses.replace(aggregate, graphql_type=agg_type)
    found = only(catalog(THING, aggregate, owner_stats("Agg")), "OwnerStats", None)
    assert "cannot follow" in found.message


def test_cycles_of_views_are_refused_with_the_views_named() -> None:
    first = dataclasses.replace(owner_stats(), dimensions=("Ring",))
    ring_type = strawberry.type(type("Ring", (), {"__annotations__": {"owner_id": str,
                                                                      "things": int}}))
    ring = View("Ring", "OwnerStats", "SELECT owner_id, things FROM OwnerStats",
                ("owner_id",), ring_type, ViewKind.TABLE)
    found = only(catalog(THING, first, ring), "OwnerStats", None)
    assert found.message == "views read each other in a cycle: OwnerStats -> Ring -> OwnerStats"


def test_relationship_problems() -> None:
    rels = (
        Relationship("owner", "Ghost", (("owner_id", "owner_id"),)),
        Relationship("size", "Owner", (("owner_id", "owner_id"),)),  # clashes with a field
        Relationship("boss", "Owner", (("boss_id", "owner_id"), ("owner_id", "nope"))),
    )
    found = problems(catalog(dataclasses.replace(THING, relationships=rels)))
    assert all(p.view == "Thing" for p in found)
    by_field = {(p.field, m) for p in found for m in [p.message]}
    assert any(f == "owner" and "Ghost" in m for f, m in by_field)
    assert any(f == "size" and "clashes" in m for f, m in by_field)
    assert any(f == "boss" and "'boss_id'" in m for f, m in by_field)
    assert any(f == "boss" and "'nope'" in m for f, m in by_field)


def test_relationship_needs_key_or_index_on_target() -> None:
    # Owner -> Thing on owner_id works only because Thing indexes owner_id.
    rel = Relationship("things", "Thing", (("owner_id", "owner_id"),), many=True)
    owner = dataclasses.replace(OWNER, relationships=(rel,))
    Catalog.of([THINGS, OWNERS], [owner, THING]).validate()
    unindexed = dataclasses.replace(THING, indexes=())
    found = problems(Catalog.of([THINGS, OWNERS], [owner, unindexed]))
    assert [(p.view, p.field) for p in found] == [("Owner", "things")]
    assert "indexes of view Thing" in found[0].fix


def test_watermark_without_event_time() -> None:
    source = dataclasses.replace(THINGS, watermark="10 seconds")
    p = only(catalog(THING, sources=(source, OWNERS)), "things", "watermark")
    assert p.subject == "source" and str(p).startswith("source things, field watermark:")


def test_source_key_and_event_time_must_be_in_schema() -> None:
    source = dataclasses.replace(THINGS, key="uuid", event_time="owner_id")
    found = problems(catalog(dataclasses.replace(THING, key=("thing_id", "owner_id")),
                             sources=(source, OWNERS)))
    fields = {p.field for p in found if p.subject == "source"}
    assert fields == {"uuid", "owner_id"}  # unknown key; event_time not a TIMESTAMP


def test_upsert_view_must_be_keyed_by_source_key() -> None:
    p = only(catalog(dataclasses.replace(THING, key=("owner_id",))), "Thing", "thing_id")
    assert "add thing_id to key" in p.fix


def test_window_view_needs_watermark() -> None:
    view = dataclasses.replace(THING, kind=ViewKind.WINDOW)
    assert "watermark" in only(catalog(view), "Thing", None).message


def test_invalid_view_name_and_type_name_mismatch() -> None:
    found = problems(catalog(dataclasses.replace(THING, name="my-thing")))
    messages = [p.message for p in found if p.view == "my-thing"]
    assert any("GraphQL type name" in m for m in messages)
    assert any("named 'Thing'" in m for m in messages)


def test_duplicate_names_rejected() -> None:
    with pytest.raises(CatalogError) as info:
        Catalog.of([THINGS, OWNERS], [OWNER, THING, THING])
    assert info.value.problems[0].view == "Thing"
    mismatched = Catalog(sources={"things": THINGS, "owners": OWNERS},
                         views={"Owner": OWNER, "Thing": THING, "Other": THING})
    assert any(p.view == "Thing" and "'Other'" in p.message for p in problems(mismatched))


def test_bad_trigger_and_retention() -> None:
    found = problems(catalog(dataclasses.replace(THING, trigger="fast", retention="1 hour")))
    assert [(p.view, p.field) for p in found] == [("Thing", "trigger")]
    found = problems(catalog(dataclasses.replace(THING, trigger="2 hours")))
    assert [(p.view, p.field) for p in found] == [("Thing", "trigger")]


def test_unsupported_field_type_and_non_strawberry_class() -> None:
    @strawberry.type(name="Thing")
    class Listy:
        thing_id: str
        tags: list[str]

    only(catalog(dataclasses.replace(THING, graphql_type=Listy, indexes=())), "Thing", "tags")

    class Plain:
        thing_id: str

    p = only(catalog(dataclasses.replace(THING, graphql_type=Plain, indexes=())), "Thing", None)
    assert "@strawberry.type" in p.fix


def test_all_problems_reported_together() -> None:
    view = dataclasses.replace(THING, source="nope", indexes=("x",), trigger="soon")
    assert len(problems(catalog(view))) == 3


def test_graphql_fields_names_types_and_nullability() -> None:
    fields = graphql_fields(THING)
    assert fields["created_at"].graphql_name == "createdAt"
    assert fields["price"].nullable and not fields["size"].nullable
    assert expected_spark_columns(THING) == {
        "thing_id": ("string", False), "owner_id": ("string", False),
        "size": ("bigint", False), "price": ("double", True),
        "created_at": ("timestamp", False)}

    @strawberry.type
    class Money:
        day: datetime.date
        total: decimal.Decimal
        ok: bool

    money = dataclasses.replace(THING, graphql_type=Money)
    assert {k: v[0] for k, v in expected_spark_columns(money).items()} == {
        "day": "date", "total": "decimal", "ok": "boolean"}


GOOD_COLUMNS = {"thing_id": "string", "owner_id": "string", "size": "bigint",
                "price": "double", "created_at": "timestamp"}


def test_compare_columns_accepts_matching_output() -> None:
    assert compare_columns(THING, GOOD_COLUMNS) == []
    assert compare_columns(THING, {**GOOD_COLUMNS, "size": "int"}) == []


def test_compare_columns_reports_missing_extra_and_mismatch() -> None:
    actual = {**GOOD_COLUMNS, "price": "decimal(10,2)", "colour": "string"}
    del actual["created_at"]
    found = {p.field: p for p in compare_columns(THING, actual)}
    assert set(found) == {"price", "colour", "created_at"}
    assert all(p.view == "Thing" for p in found.values())
    assert "CAST(... AS DOUBLE) AS price" in found["price"].fix
    assert "missing" in found["created_at"].message
    assert "colour: str" in found["colour"].fix


def test_compare_columns_case_mismatch_suggests_alias() -> None:
    actual = {**GOOD_COLUMNS}
    actual["Size"] = actual.pop("size")
    [p] = compare_columns(THING, actual)
    assert p.field == "size" and "AS size" in p.fix


def test_compare_columns_demo_types() -> None:
    stats = CATALOG.view("CustomerStats")
    actual = {"customer_id": "string", "order_count": "bigint", "total_spent": "double",
              "avg_order": "double", "max_order": "double", "min_order": "double",
              "last_order_at": "timestamp"}
    assert compare_columns(stats, actual) == []
    [p] = compare_columns(stats, {**actual, "avg_order": "decimal(14,4)"})
    assert str(p).startswith("view CustomerStats, field avg_order:")


def test_durations_and_ddl() -> None:
    assert parse_duration_ms("30 seconds") == 30_000
    assert parse_duration_ms("1 minute") == 60_000
    assert parse_duration_ms("500 milliseconds") == 500
    with pytest.raises(ValueError):
        parse_duration_ms("1.5 seconds")
    assert parse_ddl("a STRING, b DECIMAL(10, 2), `c` STRUCT<x: INT, y: INT> NOT NULL") == {
        "a": "string", "b": "decimal(10, 2)", "c": "struct<x: int, y: int>"}


def test_load_catalog_errors() -> None:
    with pytest.raises(CatalogError, match="module:attribute"):
        load_catalog("schema.demo")
    with pytest.raises(CatalogError, match="cannot import"):
        load_catalog("schema.nope:CATALOG")
    with pytest.raises(CatalogError, match="not a Catalog"):
        load_catalog("schema.demo:ORDERS")


def test_the_graph_lists_each_view_after_the_views_it_reads() -> None:
    # The graph computes a view once the views it reads are computed: in this order, every
    # view's inputs were submitted before it.
    from engine.graph import graph_views

    order = [v.name for v in graph_views(CATALOG)]
    assert set(order) == set(CATALOG.views)
    for view in graph_views(CATALOG):
        assert all(order.index(r) < order.index(view.name) for r in view.reads), view.name
    assert CATALOG.view("Order").reads == ("OrderRecord", "Customer")
    assert CATALOG.view("ProductSales").reads == ()  # nothing waits for it, nor it for any


def test_stream_aggregates_kept_from_their_rows_join_the_graph() -> None:
    from schema.stream_aggregates import GROUP, combine_plan

    # The demo's windowed sales: grouping values, and counts and sums that add up.
    assert dict(combine_plan(PRODUCT_SALES.sql, PRODUCT_SALES.key)) == {
        "product_id": GROUP, "window_start": GROUP, "window_end": GROUP,
        "order_count": "sum", "revenue": "sum"}
    assert PRODUCT_SALES.in_graph and all(v.in_graph for v in CATALOG.views.values())
    plain = "SELECT product_id, count(*) AS n, min(ts) AS first, max(amount) AS top " \
            "FROM orders WHERE status = 'placed' GROUP BY product_id"
    assert dict(combine_plan(plain, ("product_id",))) == {
        "product_id": GROUP, "n": "sum", "first": "min", "top": "max"}
    # What a batch's rows cannot be combined into keeps a streaming query of its own.
    for sql in ("SELECT product_id, avg(amount) AS a FROM orders GROUP BY product_id",
                "SELECT product_id, count(DISTINCT customer_id) AS n FROM orders "
                "GROUP BY product_id",
                "SELECT product_id, count(*) AS n FROM orders GROUP BY product_id "
                "HAVING count(*) > 2",
                "SELECT product_id, count(*) * 2 AS n FROM orders GROUP BY product_id",
                "SELECT product_id, CAST(count(*) AS STRING) AS n FROM orders "
                "GROUP BY product_id"):
        assert combine_plan(sql, ("product_id",)) is None, sql
        view = dataclasses.replace(PRODUCT_SALES, sql=sql, key=("product_id",))
        assert not view.in_graph
    # Keyed by something other than grouping values: not combinable either.
    assert combine_plan(plain, ("n",)) is None
