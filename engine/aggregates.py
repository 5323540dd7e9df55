"""Aggregate views maintained from their input's changes, not recomputed from whole groups.

A view over a view that aggregates one input (`SELECT g, count(*), sum(x), avg(x), min(x),
max(x) FROM t WHERE ... GROUP BY g [HAVING ...]`) would otherwise recompute every affected
group from all of its rows each batch (engine.incremental): a customer's totals read all
of the customer's orders, so a batch cost what the view's history holds, not what the batch
changed. Here each group keeps a small partial state (its row count and, per aggregate, the
count, sum, min or max of its argument) in Redis, written in the same fenced transaction as
the view's rows. A batch then runs the view's own aggregate split in two:
1. the *partial* step over the changed input rows only (previous rows on one side, new
   rows on the other): the view's WHERE and each aggregate's argument are evaluated over
   them (in the driver when engine.driver_sql answers them as Spark would, else a Spark
   projection of local rows), and the rows of each group and side are counted, summed,
   and their min and max kept: what left each affected group and what joined it;
2. the states are combined: counts and sums by addition and subtraction, min and max kept
   unless the extreme itself left the group (then, and when a group has no state, the
   group is recomputed from all its rows by the partial query: exact, as before);
3. the *final* query (the view's SELECT list and HAVING over the states, in the driver
   too when it can be) gives the groups' new rows, compared with the stored ones as every
   view over views is.
Sums of floating-point numbers kept this way may differ from a recomputation in their last
bits, as Spark's own sums do between two runs.

Views of any other shape (joins, DISTINCT aggregates, other functions, windows) are not
planned here and keep the recompute of engine.incremental.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlglot
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DecimalType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from sqlglot import exp

from engine.analyzer import analysed
from engine.driver_sql import OutsideSubset, Projection, driver_or_spark, schema_types
from engine.incremental import Change, Key, Row, changed_rows, json_value
from schema.storage import Op, op_hdel, op_hset

SIDE = "__vg_side"  # which side of a change an input row is: REMOVED or ADDED
REMOVED, ADDED = "r", "a"
COUNT = "__vg_n"  # the group's number of rows (after the WHERE): 0 means no group
STATE_VIEW = "__vg_state"


@dataclass(frozen=True)
class Part:
    """One column of a group's state: its name in the partial query and how two states
    combine on it."""

    name: str
    kind: str  # "count" (rows or non-null values), "sum", "min", "max"
    counted_by: str = COUNT  # the count column saying whether a sum, min or max is empty
    argument: str = ""  # the column of `AggregatePlan.rows_sql` holding its argument


@dataclass(frozen=True)
class AggregatePlan:
    table: str  # the one input
    group: tuple[str, ...]  # GROUP BY columns, in the order of the view's key
    columns: frozenset[str]  # the input columns the SQL reads
    partial_sql: str  # per group and side: the state of the rows of that side (its types)
    rows_sql: str  # per input row kept by the WHERE: its group, side and each argument
    final_sql: str  # the view's rows from the groups' states
    parts: tuple[Part, ...]


_SUPPORTED = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def plan_aggregate(sql: str, key: Sequence[str]) -> AggregatePlan | None:
    """The plan of a view whose SQL is one grouped aggregate of one input, keyed by its
    GROUP BY columns; None for any other view."""
    try:
        tree = sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or tree.args.get("distinct"):
        return None
    if any(tree.args.get(a) for a in ("joins", "with", "order", "limit", "offset", "qualify",
                                      "windows", "laterals", "pivots")):
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    group = tree.args.get("group")
    if source is None or not isinstance(source.this, exp.Table) or group is None:
        return None
    if any(tree.find_all(exp.Window, exp.Subquery, exp.Filter, exp.Distinct)):
        return None
    if not all(isinstance(g, exp.Column) for g in group.expressions) or any(
            group.args.get(a) for a in ("rollup", "cube", "grouping_sets")):
        return None
    group_columns = [g.name for g in group.expressions]
    if sorted(group_columns) != sorted(key):
        return None
    calls = list(tree.find_all(exp.AggFunc))
    if not calls or any(not isinstance(c, _SUPPORTED) or c.args.get("expressions")
                        or list(c.find_all(exp.AggFunc))[1:] for c in calls):
        return None
    table = source.this.name
    alias = source.this.alias_or_name
    parts: list[Part] = []
    partial = [*(g.copy() for g in group.expressions), exp.column(SIDE),
               exp.alias_(exp.Count(this=exp.Star()), COUNT)]
    named: dict[tuple[str, str], str] = {}  # (kind, argument) -> its state column
    arguments: dict[str, str] = {}  # argument -> its column in rows_sql
    projected = [*(g.copy() for g in group.expressions), exp.column(SIDE)]

    def state(kind: str, argument: exp.Expression, call: type[exp.AggFunc],
              counted_by: str = COUNT) -> str:
        found = named.get((kind, argument.sql()))
        if found is None:
            found = named[(kind, argument.sql())] = f"__vg_{kind}{len(named)}"
            partial.append(exp.alias_(call(this=argument.copy()), found))
            column = arguments.get(argument.sql())
            if column is None:
                column = arguments[argument.sql()] = f"__vg_arg{len(arguments)}"
                projected.append(exp.alias_(argument.copy(), column))
            parts.append(Part(found, kind, counted_by, column))
        return found

    finals: dict[int, exp.Expression] = {}
    for call in calls:
        argument = call.this
        if isinstance(call, exp.Count) and isinstance(argument, exp.Star):
            finals[id(call)] = exp.column(COUNT)
            continue
        count = state("count", argument, exp.Count)
        if isinstance(call, exp.Count):
            finals[id(call)] = exp.column(count)
        elif isinstance(call, exp.Sum | exp.Avg):
            value: exp.Expression = exp.column(state("sum", argument, exp.Sum, count))
            if isinstance(call, exp.Avg):
                value = exp.Div(this=exp.cast(value, "DOUBLE"), expression=exp.column(count))
            finals[id(call)] = exp.If(this=exp.EQ(this=exp.column(count),
                                                  expression=exp.Literal.number(0)),
                                      true=exp.Null(), false=value)
        else:
            kind = "min" if isinstance(call, exp.Min) else "max"
            finals[id(call)] = exp.column(state(kind, argument, type(call), count))
    columns = frozenset(c.name for c in tree.find_all(exp.Column))
    partial_tree = exp.select(*partial).from_(source.this.copy()).group_by(
        *(g.copy() for g in group.expressions), exp.column(SIDE))
    rows_tree = exp.select(*projected).from_(source.this.copy())
    if tree.args.get("where"):
        partial_tree.set("where", tree.args["where"].copy())
        rows_tree.set("where", tree.args["where"].copy())
    final_tree = tree.copy()
    for call in list(final_tree.find_all(exp.AggFunc)):
        original = calls[[c.sql() for c in calls].index(call.sql())]
        call.replace(finals[id(original)].copy())
    final_tree.set("from_", exp.From(this=exp.to_table(STATE_VIEW).as_(alias, quoted=True)))
    final_tree.set("where", None)
    final_tree.set("group", None)
    having = final_tree.args.get("having")
    final_tree.set("having", None)
    if having is not None:
        final_tree.set("where", exp.Where(this=having.this))
    by_key = {c: i for i, c in enumerate(key)}
    return AggregatePlan(table, tuple(sorted(group_columns, key=by_key.__getitem__)), columns,
                         partial_tree.sql("spark"), rows_tree.sql("spark"),
                         final_tree.sql("spark"), tuple(parts))


State = dict[str, Any]  # COUNT and every part's name -> value


class StateCodec:
    """States as Redis holds them (JSON lists in the parts' order), with their Spark types
    (the partial query's schema), so that read states combine with computed ones."""

    def __init__(self, plan: AggregatePlan, partial_schema: StructType) -> None:
        self.names = [COUNT, *(p.name for p in plan.parts)]
        types = {f.name: f.dataType for f in partial_schema.fields}
        self.times = {n for n in self.names
                      if isinstance(types[n], TimestampType | TimestampNTZType)}
        self.schema = StructType([StructField(g, types[g]) for g in plan.group]
                                 + [StructField(n, types[n]) for n in self.names])

    def encode(self, state: State) -> str:
        return orjson.dumps([state[n] for n in self.names],
                            option=orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z).decode()

    def decode(self, text: bytes | str) -> State:
        values = dict(zip(self.names, orjson.loads(text), strict=True))
        for name in self.times:
            if values[name] is not None:
                values[name] = datetime.datetime.fromisoformat(values[name])
        return values


def supported_types(partial_schema: StructType) -> bool:
    """Sums of decimals (exact in Spark, not as Python floats) stay with the recompute."""
    return not any(isinstance(f.dataType, DecimalType) for f in partial_schema.fields)


def partial_schema(spark: SparkSession, plan: AggregatePlan, input_schema: StructType
                   ) -> StructType:
    """The partial query's output schema."""
    return analysed(spark, plan.partial_sql, {plan.table: _with_side(input_schema)}).schema


def _with_side(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField(SIDE, StringType())])


def relevant(plan: AggregatePlan, changes: Sequence[Change]) -> list[Change]:
    """The changes that touch a column the SQL reads (a customer's tier reaching their
    orders changes none of what their totals read)."""
    def same(before: Row | None, after: Row | None) -> bool:
        return before is not None and after is not None and all(
            before.get(c) == after.get(c)  # most are; else compare their JSON forms
            or json_value(before.get(c)) == json_value(after.get(c)) for c in plan.columns)
    return [(b, a) for b, a in changes if not same(b, a)]


def _combine(part: Part, stored: Any, removed: Any, added: Any) -> Any:
    if part.kind in ("count", "sum"):
        return (stored or 0) + (added or 0) - (removed or 0)
    better = min if part.kind == "min" else max
    present = [v for v in (stored, added) if v is not None]
    return better(present) if present else None


def _extreme_left(part: Part, stored: Any, removed: Any, added: Any) -> bool:
    """Whether the rows that left may have taken the group's min (max) with them, with
    nothing as small (large) joining: then only the group's rows can tell."""
    if part.kind not in ("min", "max") or removed is None or stored is None:
        return False
    if part.kind == "min":
        return removed <= stored and (added is None or added > removed)
    return removed >= stored and (added is None or added < removed)


@dataclass
class AggregateStep:
    """The incremental step of one aggregate view (see the module's docstring)."""

    plan: AggregatePlan
    codec: StateCodec
    input_schema: StructType
    # Evaluate the partial and final queries in the driver when their SQL allows it
    # (engine.driver_sql): each saves a Spark query of 50 to 70 ms a batch on two cores.
    in_driver: bool = True
    recomputed: int = 0  # groups of the last batch recomputed from all their rows
    # of the last batch: steps in ms (`*_ms`), and the groups changed and recomputed
    timings: dict[str, float] = field(default_factory=dict)
    _rows_in_driver: Projection | None = field(init=False, default=None)
    _final_in_driver: Projection | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.in_driver:
            return
        try:
            rows = Projection.compile(self.plan.rows_sql, {
                **schema_types(self.input_schema), SIDE: StringType()})
            final = Projection.compile(self.plan.final_sql, schema_types(self.codec.schema))
        except OutsideSubset:
            return  # Spark answers both
        self._rows_in_driver, self._final_in_driver = rows, final

    @property
    def evaluated_in_driver(self) -> bool:
        """Whether the partial and final queries run in the driver, not as Spark queries."""
        return self._rows_in_driver is not None

    def changes(self, spark: SparkSession, changes: Sequence[Change], key_of: Callable[
                [Key], str], states: Callable[[list[str]], tuple[Mapping[str, State], bool]],
                stored: Callable[[set[Key]], Mapping[Key, Row]],
                group_rows: Callable[[set[Key]], list[Row]]
                ) -> tuple[dict[Key, Change], dict[str, State | None]]:
        """The view's changes {key: (previous, new)} and the states to store (None: the
        group is gone). `states` answers stored states by key text, and whether every
        group has one (else a group without one may have rows: it is recomputed);
        `stored` answers the stored rows, `group_rows` all current input rows of groups."""
        changes = relevant(self.plan, changes)
        sides = [{**row, SIDE: side} for before, after in changes
                 for side, row in ((REMOVED, before), (ADDED, after)) if row is not None]
        self.recomputed = 0
        if not sides:
            return {}, {}
        started = time.perf_counter()
        by_side = self._partial(spark, sides)
        partial_done = time.perf_counter()
        keys = {k for k, _ in by_side}
        old_rows = stored(keys)
        # A key with a null has no stored row nor state: its row is dead-lettered (commit).
        texts = {k: key_of(k) for k in keys if None not in k}
        old_states, complete = states(list(texts.values()))
        empty = self.empty()
        new_states: dict[Key, State] = {}
        recompute: set[Key] = set()
        for key in keys:
            state = old_states.get(texts.get(key, ""))
            if state is None and (key in old_rows or not complete):  # lost, or never kept
                recompute.add(key)
                continue
            state = state or empty
            removed = by_side.get((key, REMOVED), empty)
            added = by_side.get((key, ADDED), empty)
            if any(_extreme_left(p, state[p.name], removed[p.name], added[p.name])
                   for p in self.plan.parts):
                recompute.add(key)
                continue
            combined = {COUNT: state[COUNT] + added[COUNT] - removed[COUNT]}
            for part in self.plan.parts:
                combined[part.name] = _combine(part, state[part.name], removed[part.name],
                                               added[part.name])
            if combined[COUNT] < 0:  # the state disagrees with the rows: recompute
                recompute.add(key)
                continue
            for part in self.plan.parts:
                if part.kind != "count" and combined[part.counted_by] == 0:
                    combined[part.name] = None
            new_states[key] = combined
        self.recomputed = len(recompute)
        if recompute:
            rows = [{**r, SIDE: ADDED} for r in group_rows(recompute)]
            whole = self._partial(spark, rows) if rows else {}
            for key in recompute:
                new_states[key] = whole.get((key, ADDED), empty)
        recomputed = time.perf_counter()
        live = {k: s for k, s in new_states.items() if s[COUNT] > 0}
        new_rows = self.final(spark, live)
        self.timings = {"partial_ms": (partial_done - started) * 1000,
                        "recompute_ms": (recomputed - partial_done) * 1000,
                        "final_ms": (time.perf_counter() - recomputed) * 1000,
                        "groups": len(keys), "recomputed": len(recompute)}
        out = changed_rows(keys, old_rows, new_rows)
        to_store = {texts[k]: (s if s[COUNT] > 0 else None) for k, s in new_states.items()
                    if k in texts}
        return out, to_store

    def _partial(self, spark: SparkSession, rows: list[Row]) -> dict[tuple[Key, str], State]:
        """Each group's and side's state of `rows`: the driver or Spark evaluates the WHERE
        and the arguments (plan.rows_sql, no aggregate, so no job over local rows), the rows
        are counted and their arguments summed and compared here."""
        out: dict[tuple[Key, str], State] = {}
        group = self.plan.group
        # Per row and part, in one loop with no call, as Spark's count, sum, min and max
        # take a value that is not null: a throughput batch folds some 20,000 rows into six
        # parts each.
        parts = [(p.name, p.argument, p.kind) for p in self.plan.parts]
        for row in driver_or_spark(spark, self._rows_in_driver, self.plan.rows_sql, rows,
                                   _with_side(self.input_schema), self.plan.table):
            values = (json_value(row[group[0]]),) if len(group) == 1 else tuple(
                json_value(row[g]) for g in group)
            key = (values, row[SIDE])
            state = out.get(key)
            if state is None:
                state = out[key] = self.empty()
            state[COUNT] += 1
            for name, argument, kind in parts:
                value = row[argument]
                if value is None:
                    continue
                held = state[name]
                if kind == "count":
                    state[name] = held + 1
                elif held is None:
                    state[name] = value
                elif kind == "sum":
                    state[name] = held + value
                elif kind == "min":
                    if value < held:  # as min() does, the first of equals is kept
                        state[name] = value
                elif value > held:  # max
                    state[name] = value
        return out

    def state_ops(self, state_hash: str, states: Mapping[str, State | None]) -> list[Op]:
        """The Redis writes of the groups' new states, by key text (None: the group is
        gone), into the view's state hash."""
        return [op_hdel(state_hash, key) if state is None
                else op_hset(state_hash, key, self.codec.encode(state))
                for key, state in states.items()]

    def empty(self) -> State:
        """The state of no rows."""
        return {COUNT: 0, **{p.name: 0 if p.kind == "count" else None for p in self.plan.parts}}

    def final_schema(self, spark: SparkSession) -> StructType:
        return analysed(spark, self.plan.final_sql, {STATE_VIEW: self.codec.schema}).schema

    def final(self, spark: SparkSession, states: Mapping[Key, State]) -> dict[Key, Row]:
        if not states:
            return {}
        group = self.plan.group
        rows = [{**dict(zip(group, k, strict=True)), **s} for k, s in states.items()]
        out = {}
        for row in driver_or_spark(spark, self._final_in_driver, self.plan.final_sql, rows,
                                   self.codec.schema, STATE_VIEW):
            out[tuple(json_value(row[g]) for g in group)] = row
        return out


