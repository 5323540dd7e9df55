"""The Strawberry types and root fields built from the catalog.

Per view: its object type (the catalog's type plus relationship fields), a lookup by key,
and a list returning a Relay connection with `where`, `orderBy`, `first`/`after`,
`last`/`before` and `asOf`. Relationships resolve through per-request DataLoaders, so a
page of 100 orders with their customers costs one MGET for the customers, not 100.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import strawberry
from strawberry.annotation import StrawberryAnnotation
from strawberry.dataloader import DataLoader

from gateway.access.row_rules import RowScope, allows, rules_of
from gateway.reads.delta_store import AsOf
from gateway.reads.filters import (
    Condition,
    Order,
    QueryError,
    encode_cursor,
    key_lookup,
    make_page,
    matches,
    parse_order,
    parse_where,
)
from gateway.reads.freshness import Freshness
from gateway.reads.lists import list_rows
from gateway.reads.reads import Reads, seen_delta
from gateway.reads.relations import related_rows
from schema.catalog import Catalog, FieldInfo, Relationship, View, graphql_fields
from schema.storage import from_json_value, key_of

# --- Shared types ---------------------------------------------------------------------------


@strawberry.enum(description="Sort direction of a list.")
class SortDirection(enum.Enum):
    ASC = "asc"
    DESC = "desc"


@strawberry.input(one_of=True, description=(
    "A point in a view's history, served from its Delta table: the view version (the "
    "number `extensions.freshness` reports), a Delta table version, or a time."))
class AsOfInput:
    version: int | None = strawberry.UNSET
    delta_version: int | None = strawberry.UNSET
    timestamp: datetime.datetime | None = strawberry.UNSET

    def to_as_of(self) -> AsOf:
        def given(value: Any) -> Any:
            return None if value is strawberry.UNSET else value
        return AsOf(given(self.version), given(self.delta_version), given(self.timestamp))


@strawberry.type(description="Relay page information.")
class PageInfo:
    has_next_page: bool
    has_previous_page: bool
    start_cursor: str | None
    end_cursor: str | None


_SCALAR_NAMES = {str: "String", strawberry.ID: "ID", int: "Int", float: "Float",
                 bool: "Boolean", datetime.datetime: "DateTime", datetime.date: "Date",
                 decimal.Decimal: "Decimal"}


def _filter_input(python_type: Any) -> type:
    """`StringFilter`, `IntFilter`, ...: the operators on one scalar type."""
    name = f"{_SCALAR_NAMES[python_type]}Filter"
    annotations: dict[str, Any] = {"eq": python_type | None, "in_": list[python_type] | None}
    attrs: dict[str, Any] = {"eq": None, "in_": strawberry.field(name="in", default=None)}
    if python_type is not bool:
        for op in ("lt", "lte", "gt", "gte"):
            annotations[op] = python_type | None
            attrs[op] = None
    if python_type in (str, strawberry.ID):
        annotations["prefix"] = str | None
        attrs["prefix"] = None
    attrs["__annotations__"] = annotations
    return strawberry.input(type(name, (), attrs), description=(
        f"Conditions on a {_SCALAR_NAMES[python_type]} field; all given ones must hold."))


# --- Per-request state ---------------------------------------------------------------------


@dataclass
class RequestContext:
    reads: Reads
    catalog: Catalog
    fresh: Freshness = field(default_factory=Freshness)
    loaders: dict[Any, DataLoader] = field(default_factory=dict)
    scope: RowScope | None = None  # the caller's row rules (gateway.access.row_rules); None: admin

    def rows_loader(self, view: View) -> DataLoader:
        loader = self.loaders.get(view.name)
        if loader is None:
            async def load(keys: list[str]) -> list[dict | None]:
                return await self.reads.rows(view, keys, self.fresh)
            loader = self.loaders[view.name] = DataLoader(load_fn=load)
        return loader

    def load_rows(self, view: View) -> Callable[[Sequence[str]], Any]:
        loader = self.rows_loader(view)

        async def load(keys: Sequence[str]) -> list[dict | None]:
            return list(await loader.load_many(list(keys)))
        return load

    def related_loader(self, target: View, field_name: str, first: int | None) -> DataLoader:
        key = (target.name, field_name, first)
        loader = self.loaders.get(key)
        if loader is None:
            async def load(values: list[Any]) -> list[list[dict]]:
                return await related_rows(self.reads, self.fresh, self.load_rows(target),
                                          target, field_name, values, first)
            loader = self.loaders[key] = DataLoader(load_fn=load)
        return loader


def request_context(info: strawberry.Info, reads: Reads, catalog: Catalog) -> RequestContext:
    """The request's context. A subscription message is executed with its websocket
    connection's context instead: then one made for that message (cached on the connection
    while the same message executes), so relationships in it read in batches and with the
    subscriber's row rules."""
    ctx = info.context
    if isinstance(ctx, RequestContext):
        return ctx
    cached = getattr(ctx, "message_context", None)
    if cached is not None and cached[0] is info.root_value:
        return cached[1]
    made = RequestContext(reads, catalog, scope=getattr(ctx, "scope", None))
    ctx.message_context = (info.root_value, made)
    return made


# --- Per-view types --------------------------------------------------------------------------


def lookup_name(view: View) -> str:
    return view.name[0].lower() + view.name[1:]


def list_name(view: View) -> str:
    name = lookup_name(view)
    return name + "List" if name.endswith("s") else name + "s"


@dataclass
class ViewTypes:
    view: View
    fields: dict[str, FieldInfo]
    object: type
    where: type
    order_by: type
    connection: type
    edge: type
    lazy: type | None = field(init=False)

    def __post_init__(self) -> None:
        self.lazy = lazy_row_type(self.object, self.fields)

    def to_object(self, row: dict[str, Any]) -> Any:
        """The view's object of a stored row. Its columns are converted as they are read:
        a change message selecting `op version` reads none, a page selecting two columns
        of ten reads two."""
        if self.lazy is not None:
            return self.lazy(row)
        return self.object(**{name: from_json_value(f.python_type, row.get(name))
                              for name, f in self.fields.items()})


def lazy_row_type(object_type: type, fields: dict[str, FieldInfo]) -> type | None:
    """A subclass of a view's object type (so GraphQL still sees the view's type) whose
    instances hold the stored row and convert a column when it is first read. None when a
    column is also a class attribute (a default): reading it would not reach the row."""
    if any(hasattr(object_type, name) for name in fields):
        return None
    python_types = {name: f.python_type for name, f in fields.items()}

    def __init__(self: Any, row: dict[str, Any]) -> None:
        self.__dict__["_stored_row"] = row

    def __getattr__(self: Any, name: str) -> Any:
        # Only asked for what the instance does not hold yet.
        python_type = python_types.get(name)
        if python_type is None:
            raise AttributeError(name)
        value = self.__dict__[name] = from_json_value(python_type,
                                                      self._stored_row.get(name))
        return value

    return type(object_type.__name__, (object_type,), {
        "__init__": __init__, "__getattr__": __getattr__,
        "__qualname__": object_type.__qualname__, "__module__": object_type.__module__})


def _describe_field(view: View, name: str) -> str:
    if name in view.indexes:
        return "indexed: every operator"
    if name in view.key:
        return "key column: eq and in"
    return "not indexed: filtering on it is refused"


def build_view_types(catalog: Catalog, reads: Reads, settings: Any) -> dict[str, ViewTypes]:
    namespace: dict[str, Any] = {}  # view name -> object type, for relationship annotations
    filters: dict[Any, type] = {}
    out: dict[str, ViewTypes] = {}
    for view in catalog.views.values():
        fields = graphql_fields(view)  # the role's type may hide some (gateway.access.role_schemas)
        original = view.graphql_type.__strawberry_definition__  # type: ignore[attr-defined]
        attrs: dict[str, Any] = {"__annotations__": {}}
        for rel in view.relationships:
            attrs[rel.name] = _relationship_field(catalog, view, rel, namespace, out, settings,
                                                  reads)
        obj = strawberry.type(type(view.name, (view.graphql_type,), attrs), name=view.name,
                              description=original.description)
        # Strawberry swaps a field's annotation namespace for the class's module; point the
        # relationship annotations back at the generated types.
        for f in obj.__strawberry_definition__.fields:  # type: ignore[attr-defined]
            if f.python_name in attrs and f.type_annotation is not None:
                f.type_annotation = StrawberryAnnotation(f.type_annotation.raw_annotation,
                                                         namespace=namespace)
        namespace[view.name] = obj
        for f in fields.values():
            if f.python_type not in filters:
                filters[f.python_type] = _filter_input(f.python_type)
        where = strawberry.input(type(f"{view.name}Where", (), {
            "__annotations__": {n: filters[f.python_type] | None for n, f in fields.items()},
            **{n: strawberry.field(default=None, description=_describe_field(view, n))
               for n in fields},
        }), description=(f"Conditions on {view.name} rows, all of which must hold. Filter on "
                         f"the key or indexed fields "
                         f"({', '.join(fields[n].graphql_name for n in view.indexes) or 'none'})."))
        field_enum = strawberry.enum(
            enum.Enum(f"{view.name}Field", {n.upper(): n for n in fields}),
            description=f"Fields of {view.name}; lists sort by indexed ones.")
        order_by = strawberry.input(type(f"{view.name}OrderBy", (), {
            "__annotations__": {"field": field_enum, "direction": SortDirection},
            "direction": SortDirection.ASC,
        }), description=f"Sort {view.name} rows by an indexed field; ties by key.")
        edge = strawberry.type(type(f"{view.name}Edge", (), {
            "__annotations__": {"node": obj, "cursor": str}}))
        connection = strawberry.type(type(f"{view.name}Connection", (), {
            "__annotations__": {"edges": list[edge], "page_info": PageInfo, "total_count": int},
        }), description=f"A page of {view.name} rows.")
        out[view.name] = ViewTypes(view, fields, obj, where, order_by, connection, edge)
    return out


def _relationship_field(catalog: Catalog, view: View, rel: Relationship,
                        namespace: dict[str, Any], types: dict[str, ViewTypes],
                        settings: Any, reads: Reads) -> Any:
    target = catalog.view(rel.target)
    theirs = [t for _, t in rel.on]
    by_key = set(theirs) == set(target.key)
    driver = next((t for t in theirs if t in target.indexes), None)

    async def rows_of(root: Any, info: strawberry.Info, first: int) -> list[dict]:
        values = {t: getattr(root, mine) for mine, t in rel.on}
        if any(v is None for v in values.values()):
            return []
        ctx = request_context(info, reads, catalog)
        if by_key:
            row = await ctx.rows_loader(target).load(key_of(values, target.key))
            return [row] if allows(ctx.scope, target.name, row) else []
        assert driver is not None  # the catalog checks a relationship can be looked up
        rest = [Condition(t, "eq", v) for t, v in values.items() if t != driver]
        # The index of the driving column finds the rows; other join columns and the
        # caller's row rules on other fields are checked on the rows read. Then every
        # candidate is read before the page is cut, so it holds the first visible rows.
        checked_after = bool(rest) or any(
            c.field != driver for c in rules_of(ctx.scope, target.name))
        loader = ctx.related_loader(target, driver, None if checked_after else first)
        rows = await loader.load(values[driver])
        return [r for r in rows if matches(r, rest, types[target.name].fields)
                and allows(ctx.scope, target.name, r)][:first]

    if rel.many:
        async def resolve_many(root: Any, info: strawberry.Info,
                               first: int | None = None) -> list[Any]:
            size = settings.gateway_default_page_size if first is None else first
            if not 0 <= size <= settings.gateway_max_page_size:
                raise QueryError(f"first must be 0 to {settings.gateway_max_page_size} "
                                 "(gateway_max_page_size)", "LIMIT_PAGE_SIZE",
                                 limit=settings.gateway_max_page_size)
            rows = await rows_of(root, info, size)
            return [types[target.name].to_object(r) for r in rows[:size]]

        return strawberry.field(
            resolver=resolve_many,
            graphql_type=StrawberryAnnotation(f"list[{target.name}]", namespace=namespace),
            description=f"{target.name} rows of this {view.name}, by key.")

    async def resolve_one(root: Any, info: strawberry.Info) -> Any:
        rows = await rows_of(root, info, 1)
        return types[target.name].to_object(rows[0]) if rows else None

    return strawberry.field(
        resolver=resolve_one,
        graphql_type=StrawberryAnnotation(f"{target.name} | None", namespace=namespace),
        description=f"The {target.name} of this {view.name}.")


# --- Root fields ---------------------------------------------------------------------------


def with_signature(fn: Callable, params: list[inspect.Parameter]) -> Callable:
    """Give a `**kwargs` resolver the arguments Strawberry should expose."""
    info = inspect.Parameter("info", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             annotation=strawberry.Info)
    fn.__signature__ = inspect.Signature([info, *params])  # type: ignore[attr-defined]
    fn.__annotations__ = {"info": strawberry.Info, **{p.name: p.annotation for p in params}}
    return fn


def keyword(name: str, annotation: Any,
            default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=default)


def _where_dict(where: Any, fields: dict[str, FieldInfo]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in fields:
        conditions = getattr(where, name, None)
        if conditions is None:
            continue
        ops = {op.rstrip("_"): getattr(conditions, op)
               for op in ("eq", "in_", "lt", "lte", "gt", "gte", "prefix")
               if getattr(conditions, op, None) is not None}
        if ops:
            out[name] = ops
    return out


def root_fields(types: dict[str, ViewTypes], settings: Any) -> dict[str, tuple[Any, Any]]:
    """GraphQL name -> (annotation, strawberry field) for every view's lookup and list."""
    out: dict[str, tuple[Any, Any]] = {}
    for vt in types.values():
        out[lookup_name(vt.view)] = (vt.object | None, _lookup_field(vt))
        out[list_name(vt.view)] = (vt.connection, _list_field(vt, settings))
    return out


def _lookup_field(vt: ViewTypes) -> Any:
    view = vt.view

    async def lookup(info: strawberry.Info, **kwargs: Any) -> Any:
        ctx: RequestContext = info.context
        as_of = kwargs.pop("as_of", None)
        key = key_of(kwargs, view.key)
        if as_of is not None:
            rows, snapshot = await ctx.reads.delta_read(view, keys=[key], as_of=as_of.to_as_of())
            ctx.fresh.note(view.name, seen_delta(snapshot), as_of=True)
            row = rows[0] if rows else None
        else:
            row = await ctx.rows_loader(view).load(key)
        return vt.to_object(row) if allows(ctx.scope, view.name, row) else None

    params = [keyword(c, vt.fields[c].python_type) for c in view.key]
    params.append(keyword("as_of", AsOfInput | None, None))
    return strawberry.field(
        resolver=with_signature(lookup, params), graphql_type=vt.object | None,
        description=f"One {view.name} by its key ({', '.join(view.key)}); null if none.")


def list_query(vt: ViewTypes, where: Any, order_by: Any) -> tuple[list[Condition], Order]:
    """A list's `where` and `orderBy` arguments, checked against the view's indexes."""
    view = vt.view
    conditions = parse_where(view, vt.fields, _where_dict(where, vt.fields))
    order = parse_order(view, vt.fields, order_by.field.value if order_by else None,
                        bool(order_by and order_by.direction is SortDirection.DESC),
                        conditions)
    if order.field not in view.indexes and key_lookup(view, conditions) is None:
        raise QueryError(f"{view.name} has no index: filter on its key with eq or in",
                         "FIELD_NOT_INDEXED", view=view.name)
    return conditions, order


def where_conditions(vt: ViewTypes, where: Any) -> list[Condition]:
    """A `where` argument as conditions (the list's rules: key and indexed fields)."""
    return parse_where(vt.view, vt.fields, _where_dict(where, vt.fields))


@dataclass
class ConnectionPage:
    """A list's page before layout: what both the resolver and compiled plans answer."""

    items: list[tuple[tuple[Any, str], dict[str, Any]]]  # (position: encode_cursor's, row)
    has_next: bool
    has_previous: bool
    total: int


async def connection_page(reads: Reads, fresh: Freshness, load: Callable[[Sequence[str]], Any],
                          vt: ViewTypes, settings: Any, kwargs: dict[str, Any],
                          rules: Sequence[Condition] = ()) -> ConnectionPage:
    """The page a list field's (Strawberry-converted) arguments ask for; `rules` (the
    caller's row rules) join the filter after the order is chosen from it."""
    view = vt.view
    conditions, order = list_query(vt, kwargs.get("where"), kwargs.get("order_by"))
    conditions = [*conditions, *rules]
    first, after, last, before = (kwargs.get(k) for k in ("first", "after", "last", "before"))
    page = make_page(first, after, last, before, order, vt.fields,
                     settings.gateway_default_page_size, settings.gateway_max_page_size)
    as_of = kwargs.get("as_of")
    result = await list_rows(reads, fresh, load, view, conditions, order, page,
                             as_of.to_as_of() if as_of else None)
    has_next = result.more if not page.backward else before is not None
    has_previous = result.more if page.backward else after is not None
    return ConnectionPage(result.items, has_next, has_previous, result.total)


def _list_field(vt: ViewTypes, settings: Any) -> Any:
    view = vt.view

    async def list_(info: strawberry.Info, **kwargs: Any) -> Any:
        return await list_page(vt, settings, info.context, kwargs)

    params = list_params(vt)
    return strawberry.field(
        resolver=with_signature(list_, params), graphql_type=vt.connection,
        description=(f"{view.name} rows as a Relay connection: filter with `where` (key and "
                     f"indexed fields), sort with `orderBy` (indexed fields; default: the "
                     f"first filtered index, else "
                     f"{vt.fields[view.indexes[0]].graphql_name if view.indexes else 'the key'}), "
                     f"page with first/after or last/before."))


async def list_page(vt: ViewTypes, settings: Any, ctx: RequestContext,
                    kwargs: dict[str, Any]) -> Any:
    """One page of a list, laid out (the query's and the live list subscription's)."""
    page = await connection_page(ctx.reads, ctx.fresh, ctx.load_rows(vt.view), vt, settings,
                                 kwargs, rules_of(ctx.scope, vt.view.name))
    edges = [vt.edge(node=vt.to_object(row), cursor=encode_cursor(position))
             for position, row in page.items]
    info_ = PageInfo(has_next_page=page.has_next, has_previous_page=page.has_previous,
                     start_cursor=edges[0].cursor if edges else None,
                     end_cursor=edges[-1].cursor if edges else None)
    return vt.connection(edges=edges, page_info=info_, total_count=page.total)


def list_params(vt: ViewTypes) -> list[inspect.Parameter]:
    """The list field's arguments, in order."""
    return [
        keyword("where", vt.where | None, None),
        keyword("order_by", vt.order_by | None, None),
        keyword("first", int | None, None),
        keyword("after", str | None, None),
        keyword("last", int | None, None),
        keyword("before", str | None, None),
        keyword("as_of", AsOfInput | None, None),
    ]
