"""The executor's own reading of leaf fields (app.graphql.service.AnswerBoundExecutor.execute_fields) answers as
graphql-core's path does: each case run through both, graphql-core's plain Executor the reference."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from graphql import Executor, build_schema, execute, parse

from app.graphql.limits import LEAF_BYTES, AnswerBudget
from app.graphql.service import AnswerBoundExecutor

SCHEMA = build_schema(
    """
    enum Kind { TABLE VIEW }
    type Field { path: String! type: Kind description: String width: Int ratio: Float nullable: Boolean }
    type Entity { urn: String! name: String count: Int! kind: Kind! fields: [Field!]! later: String }
    type Query { entity: Entity }
    """
)

FIELD = {"path": "a", "type": "TABLE", "description": None, "width": 3, "ratio": 0.5, "nullable": True}


@dataclass
class Context:
    answer: AnswerBudget


def run(executor_class: type[Executor], source: Any, query: str, limit: int = 10**9) -> tuple[Any, Any, Context]:
    context = Context(AnswerBudget(limit))

    async def root(*_: Any) -> Any:  # an awaited root, as the service's resolvers are
        return source

    SCHEMA.query_type.fields["entity"].resolve = root  # type: ignore[union-attr]

    async def go() -> Any:
        result = execute(SCHEMA, parse(query), context_value=context, executor_class=executor_class)
        return await result if asyncio.iscoroutine(result) else result

    result = asyncio.run(go())
    errors = [(e.message, e.path) for e in result.errors or []]
    return result.data, errors, context


def same_as_graphql_core(source: Any, query: str) -> tuple[Any, Any]:
    data, errors, _ = run(AnswerBoundExecutor, source, query)
    assert (data, errors) == run(Executor, source, query)[:2]
    return data, errors


QUERY = "{ entity { urn n: name count kind fields { path type description width ratio nullable } later } }"


def test_plain_values_from_a_dict_and_from_attributes() -> None:
    @dataclass
    class Row:
        urn: str
        name: str | None
        count: int
        kind: str
        fields: list[Any]
        later: str | None = None

    as_dict = {"urn": "u", "name": "x", "count": 2, "kind": "VIEW", "fields": [FIELD, {**FIELD, "path": "b"}]}
    data, errors = same_as_graphql_core(as_dict, QUERY)
    assert errors == []
    assert data["entity"]["n"] == "x" and data["entity"]["kind"] == "VIEW"
    assert data["entity"]["fields"][1] == {**FIELD, "path": "b"}
    assert same_as_graphql_core(Row("u", None, 2, "TABLE", [FIELD]), QUERY)[1] == []


def test_a_null_where_the_field_may_not_be_null_is_graphql_cores_error() -> None:
    data, errors = same_as_graphql_core({"urn": "u", "count": None, "kind": "TABLE", "fields": []}, QUERY)
    assert data == {"entity": None}
    assert errors == [("Cannot return null for non-nullable field Entity.count.", ["entity", "count"])]


def test_a_value_the_scalar_cannot_represent_is_graphql_cores_error() -> None:
    source = {"urn": "u", "count": 2**40, "kind": "TABLE", "fields": []}
    data, errors = same_as_graphql_core(source, QUERY)
    assert data == {"entity": None}  # count is non-null: the entity is null
    assert [path for _, path in errors] == [["entity", "count"]]
    data, errors = same_as_graphql_core({**source, "count": 1, "fields": [{**FIELD, "width": 2**40}]}, QUERY)
    assert data["entity"]["fields"][0]["width"] is None  # width may be null: only it is
    assert [path for _, path in errors] == [["entity", "fields", 0, "width"]]
    assert "non 32-bit signed integer" in errors[0][0]


def test_an_enum_value_not_of_the_enum_is_graphql_cores_error() -> None:
    source = {"urn": "u", "count": 1, "kind": "TABLE", "fields": [{**FIELD, "type": "SHEET"}]}
    data, errors = same_as_graphql_core(source, QUERY)
    assert data["entity"]["fields"][0]["type"] is None
    assert errors and errors[0][1] == ["entity", "fields", 0, "type"]


class Entity:
    """An entity as attributes, its required fields set (the tests' subclasses add the others)."""

    urn = "u"
    count = 1
    kind = "TABLE"
    fields: list[Any] = []


def test_callables_and_awaitables_are_resolved_as_the_default_resolver_does() -> None:
    class Row(Entity):
        def name(self, info: Any) -> str:  # a method: the default resolver calls it with the info
            return f"named by {info.field_name}"

        async def later(self, info: Any) -> str:
            return "awaited"

    data, errors = same_as_graphql_core(Row(), QUERY)
    assert errors == []
    assert data["entity"]["n"] == "named by name" and data["entity"]["later"] == "awaited"
    as_dict = {"urn": "u", "count": 1, "kind": "TABLE", "fields": [], "name": lambda info: "from a dict's callable"}
    assert same_as_graphql_core(as_dict, QUERY)[0]["entity"]["n"] == "from a dict's callable"


def test_an_attribute_that_raises_is_a_field_error() -> None:
    class Row(Entity):
        @property
        def name(self) -> str:
            raise ValueError("no name today")

    data, errors = same_as_graphql_core(Row(), QUERY)
    assert data["entity"]["n"] is None and data["entity"]["urn"] == "u"
    assert errors == [("no name today", ["entity", "n"])]


def test_other_values_take_graphql_cores_coercion() -> None:
    class Text(str):
        pass

    source = {"urn": Text("u"), "name": 12, "count": True, "kind": "TABLE", "fields": [{**FIELD, "ratio": 2}]}
    data, errors = same_as_graphql_core(source, QUERY)
    assert errors == []
    assert data["entity"]["urn"] == "u" and data["entity"]["n"] == "12" and data["entity"]["count"] == 1


class WithoutLeaves(AnswerBoundExecutor):
    """Every field through graphql-core's path, charged there (the executor before it read leaves itself)."""

    def _leaves(self, parent_type: Any, grouped_field_set: Any) -> tuple[None, ...]:
        return (None,) * len(grouped_field_set)


def test_the_answer_budget_counts_every_leaf_and_names_where_it_was_crossed() -> None:
    source = {"urn": "u", "name": "x" * 50, "count": 1, "kind": "TABLE", "fields": [FIELD, FIELD]}
    _, errors, context = run(AnswerBoundExecutor, source, QUERY)
    leaves = 4 + 2 * 5  # urn, name, count, kind, and each field's non-null leaves (description is null)
    assert context.answer.used == leaves * LEAF_BYTES + len("u") + 50 + len("TABLE") + 2 * len("aTABLE")
    assert context.answer.used == run(WithoutLeaves, source, QUERY)[2].answer.used
    assert errors == []
    for limit, crossed in ((2 * LEAF_BYTES + 51, "entity.count"), (7 * LEAF_BYTES + 60, "entity.fields.0.width")):
        for executor_class in (AnswerBoundExecutor, WithoutLeaves):
            data, errors, context = run(executor_class, source, QUERY, limit=limit)
            assert context.answer.exceeded and context.answer.path == crossed, executor_class
            assert errors == []  # not a field error: the service refuses the request whole


@pytest.mark.parametrize("query", ["{ entity { urn __typename } }", "{ entity { ... on Entity { urn count } } }"])
def test_meta_fields_and_fragments(query: str) -> None:
    data, errors = same_as_graphql_core({"urn": "u", "count": 1, "kind": "TABLE", "fields": []}, query)
    assert errors == [] and data["entity"]["urn"] == "u"
