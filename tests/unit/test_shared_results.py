"""Subscribers asking the same thing of one shared message share one execution."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import strawberry

from gateway.subscriptions.shared_results import SharedResultsExecutor, shared

CALLS: list[str] = []


@strawberry.type
class Message:
    name: str

    @strawberry.field
    def greeting(self, punctuation: str = "!") -> str:
        CALLS.append(self.name)
        return f"hello {self.name}{punctuation}"

    @strawberry.field
    async def later(self) -> str:
        CALLS.append(f"later {self.name}")  # async: its result is awaited by everyone
        return self.name


@dataclass
class Context:
    share_scope: Any = None


def make_schema(events: list[Message]) -> strawberry.Schema:
    @strawberry.type
    class Query:
        ping: str = "pong"

    @strawberry.type
    class Subscription:
        @strawberry.subscription
        async def messages(self, key: str = "") -> AsyncIterator[Message]:
            for event in events:  # `key`: a root argument, as a live value's
                yield event

    return strawberry.Schema(query=Query, subscription=Subscription,
                             execution_context_class=SharedResultsExecutor)


async def collect(schema: strawberry.Schema, query: str, scope: Any = None,
                  variables: dict | None = None) -> list[Any]:
    stream = await schema.subscribe(query, variable_values=variables,
                                    context_value=Context(scope))
    return [result.data async for result in stream]


def run_all(schema: strawberry.Schema, *subscribers: tuple) -> list[list[Any]]:
    async def main() -> list[list[Any]]:
        return list(await asyncio.gather(*(collect(schema, *s) for s in subscribers)))
    return asyncio.run(main())


QUERY = "subscription($p: String!) { messages { greeting(punctuation: $p) } }"


def test_same_document_and_variables_execute_once_per_shared_message():
    CALLS.clear()
    schema = make_schema([shared(Message(name="a")), shared(Message(name="b"))])
    answers = run_all(schema, *[(QUERY, None, {"p": "!"})] * 5)
    assert answers == [[{"messages": {"greeting": "hello a!"}},
                        {"messages": {"greeting": "hello b!"}}]] * 5
    assert CALLS == ["a", "b"]


def test_other_variables_or_scope_execute_apart():
    CALLS.clear()
    schema = make_schema([shared(Message(name="a"))])
    answers = run_all(schema, (QUERY, "role-1", {"p": "!"}), (QUERY, "role-1", {"p": "?"}),
                      (QUERY, "role-2", {"p": "!"}), (QUERY, "role-1", {"p": "!"}))
    assert [a[0]["messages"]["greeting"] for a in answers] == [
        "hello a!", "hello a?", "hello a!", "hello a!"]
    assert CALLS == ["a", "a", "a"]


def test_messages_not_marked_shared_execute_for_each_subscriber():
    CALLS.clear()
    schema = make_schema([Message(name="a")])
    run_all(schema, *[(QUERY, None, {"p": "!"})] * 3)
    assert CALLS == ["a", "a", "a"]


def test_async_fields_are_awaited_once_and_given_to_everyone():
    CALLS.clear()
    schema = make_schema([shared(Message(name="a"))])
    answers = run_all(schema, *[("subscription { messages { later } }",)] * 4)
    assert answers == [[{"messages": {"later": "a"}}]] * 4
    assert CALLS == ["later a"]


KEYED = "subscription($k: String!, $p: String!) { messages(key: $k) { greeting(punctuation: $p) } }"


def test_the_root_fields_arguments_do_not_split_executions():
    # Each tab watching its own key: the root field's arguments choose the stream, not
    # what is executed over a message.
    CALLS.clear()
    schema = make_schema([shared(Message(name="a"))])
    answers = run_all(schema, (KEYED, None, {"k": "1", "p": "!"}),
                      (KEYED, None, {"k": "2", "p": "!"}), (KEYED, None, {"k": "3", "p": "?"}))
    assert [a[0]["messages"]["greeting"] for a in answers] == ["hello a!", "hello a!",
                                                               "hello a?"]
    assert CALLS == ["a", "a"]  # one for "!" (keys 1 and 2), one for "?"


def test_variables_below_the_root_field():
    from graphql import parse

    from gateway.subscriptions.shared_results import variables_below_root

    def below(text: str) -> frozenset[str] | None:
        document = parse(text)
        return variables_below_root(document.definitions[0])

    assert below(KEYED) == {"p"}
    # $k is used below the root too: it counts.
    assert below("subscription($k: String!) { messages(key: $k) { greeting(punctuation: $k) } }"
                 ) == {"k"}
    assert below("subscription($k: String!) { messages(key: $k) { name } }") == frozenset()
    assert below("subscription($k: String!, $x: Boolean!) { messages(key: $k) "
                 "{ name @include(if: $x) } }") == {"x"}
    # A fragment may use any variable: all of them count.
    assert below("subscription($k: String!) { messages(key: $k) { ...F } } "
                 "fragment F on Message { greeting(punctuation: $k) }") is None
    assert below("subscription { ... on Subscription { messages { name } } }") is None
