"""Fragment-spread bombs: the expanded size of a document, counted without expanding it,
and the validation rule that refuses a bomb before the depth and alias limiters walk it."""

from __future__ import annotations

import strawberry
from graphql import parse
from strawberry.extensions import AddValidationRules, MaxAliasesLimiter, QueryDepthLimiter

from gateway.access.expansion import expanded_fields, guarded_rules


def bomb(levels: int, spreads: int) -> str:
    fragments = "".join(
        f"fragment F{i} on C {{ {' '.join(f'...F{i + 1}' for _ in range(spreads))} }} "
        for i in range(levels))
    return "{ c { ...F0 } } " + fragments + f"fragment F{levels} on C {{ name id }}"


@strawberry.type
class C:
    name: str
    id: int

    @strawberry.field
    def friend(self) -> C:
        return C(name="friend", id=2)


@strawberry.type
class Query:
    @strawberry.field
    def c(self) -> C:
        return C(name="c", id=1)


RULES = [guarded_rules([*QueryDepthLimiter(max_depth=4).validation_rules,
                        *MaxAliasesLimiter(max_alias_count=3).validation_rules], 1000)]
SCHEMA = strawberry.Schema(Query, extensions=[lambda: AddValidationRules(RULES)])


def test_expanded_fields_counts_each_spread_again():
    assert expanded_fields(parse("{ c { name friend { id } } }")) == 4
    assert expanded_fields(parse(bomb(2, 3))) == 1 + 9 * 2
    assert expanded_fields(parse(bomb(6, 50))) == 1 + 50 ** 6 * 2
    # A cycle (refused by validation) counts as empty where it closes.
    cycle = "{ c { ...A } } fragment A on C { name ...B } fragment B on C { id ...A }"
    assert expanded_fields(parse(cycle)) == 3


def test_a_bomb_is_refused_at_once_naming_the_limit():
    # 31 billion fields: unguarded, the depth limiter alone would walk them for hours.
    result = SCHEMA.execute_sync(bomb(6, 50))
    assert [e.extensions["code"] for e in result.errors] == ["LIMIT_FIELDS"]
    assert "gateway_max_fields" in result.errors[0].message


def test_the_guarded_limiters_still_apply_below_the_limit():
    assert SCHEMA.execute_sync(bomb(2, 3)).errors is None
    deep = SCHEMA.execute_sync("{ c { friend { friend { friend { friend { id } } } } } }")
    assert "exceeds maximum operation depth" in deep.errors[0].message
    aliases = SCHEMA.execute_sync("{ a: c { id } b: c { id } d: c { id } e: c { id } }")
    assert "aliases found" in aliases.errors[0].message
    cycle = SCHEMA.execute_sync("{ c { ...A } } fragment A on C { ...B } "
                                "fragment B on C { ...A }")
    assert "within itself" in cycle.errors[0].message


def test_several_operations_need_an_operation_name():
    from gateway.access.operation_choice import RequireOperationName

    schema = strawberry.Schema(Query, extensions=[RequireOperationName])
    result = schema.execute_sync("query A { c { id } } query B { c { name } }")
    assert result.data is None
    assert [e.extensions["code"] for e in result.errors] == ["OPERATION_NAME_REQUIRED"]
    named = schema.execute_sync("query A { c { id } } query B { c { name } }",
                                operation_name="B")
    assert named.data == {"c": {"name": "c"}}
    assert schema.execute_sync("query A { c { id } }").data == {"c": {"id": 1}}
