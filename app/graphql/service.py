"""Executing a GraphQL request: size and token limits → parse → depth/alias/field limits → graphql-core's validation
→ the cost of the operation with its variables → execution against the schema built once from the `*.graphql` files
(schema-first: the SDL is the contract, resolvers are attached to it; the schema of a registry holding entity types
registered at run time has an object type for each of them, and follows the registry's changes). Every failure is a GraphQL error in the
response body, in DataHub's form (`extensions.code`, `extensions.classification`); nothing a client sends ends in a
500. A query over the cost limit is answered 400 (it is refused whole, before it runs), and so is one whose answer
grows past METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES (refused while it is produced: app.graphql.limits.AnswerBudget).
What the arguments of a root field carry is checked once, before its resolver runs (check_arguments). An overloaded
or unreachable service (a read past its timeout included) is a 503, as on every other route."""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from inspect import isawaitable
from pathlib import Path
from typing import Any, cast
from weakref import WeakKeyDictionary, WeakMethod

from graphql import (
    DocumentNode,
    Executor,
    GraphQLEnumType,
    GraphQLError,
    GraphQLFormattedError,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLResolveInfoHelpers,
    GraphQLScalarType,
    GraphQLSchema,
    IntValueNode,
    OperationType,
    ValueNode,
    build_schema,
    execute,
    get_operation_ast,
    parse,
    validate,
)
from graphql.execution.executor import default_field_resolver
from graphql.pyutils import Path as ResponsePath
from graphql.pyutils import Undefined
from graphql.pyutils.gather_with_cancel import gather_with_cancel
from sqlalchemy.ext.asyncio import AsyncSession

from app.db_faults import DatabaseFault, classify
from app.errors import Issue, MetaledgerError, ValidationFailed
from app.graphql.documents import DOCUMENT_QUERIES
from app.graphql.entities import bind_entities, runtime_entity_sdl, runtime_entity_types
from app.graphql.limits import AnswerBudget, AnswerTooLarge, Limits, check_arguments, check_limits, query_cost
from app.graphql.policies import POLICY_MUTATIONS, POLICY_QUERIES
from app.graphql.resolvers import MUTATION_RESOLVERS, QUERY_RESOLVERS, Context
from app.limits import MAX_LONG, MIN_LONG, clip
from app.registry import EntityRegistry
from app.settings import Settings

log = logging.getLogger("metaledger.graphql")

SCHEMA_PATH = Path(__file__).with_name("schema.graphql")
# DataHub splits its schema by topic (entity.graphql, search.graphql, ...); here `schema.graphql` holds the core and
# each further `*.graphql` beside it a topic, adding to the root types with `extend type Query` / `extend type Mutation`.
SCHEMA_FILES = (SCHEMA_PATH, *sorted(p for p in SCHEMA_PATH.parent.glob("*.graphql") if p != SCHEMA_PATH))
# DataHub's DataHubGraphQLErrorCode names, by status
ERROR_TYPES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "UNAUTHORIZED",
    404: "NOT_FOUND",
    409: "CONFLICT",
    412: "BAD_REQUEST",
    413: "BAD_REQUEST",
    429: "SERVICE_UNAVAILABLE",
    503: "SERVICE_UNAVAILABLE",
}


def _long(value: Any) -> int:
    """DataHub's Long: a 64-bit integer (an Int may not hold it; a string or a float is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_LONG <= value <= MAX_LONG:
        raise GraphQLError(f"Long cannot represent {clip(repr(value), 60)}: a 64-bit integer is expected")
    return value


def _long_literal(node: ValueNode, _variables: Any = None) -> int:
    if not isinstance(node, IntValueNode):
        raise GraphQLError("Long cannot represent a non-integer value", node)
    return _long(int(node.value))


def _arguments_checked(resolver: Any) -> Callable[..., Any]:
    """A root field's resolver, run once its arguments pass check_arguments."""

    @functools.wraps(resolver)
    def resolve(root: Any, info: Any, **arguments: Any) -> Any:
        check_arguments(arguments)
        return resolver(root, info, **arguments)

    return resolve


def build(runtime_sdl: str = "", runtime_types: Mapping[str, str] | None = None) -> GraphQLSchema:
    """The schema of `SCHEMA_FILES`, with the object types of entity types registered at run time
    (`runtime_sdl`, of `runtime_types`: entity name -> object type) when a registry holds some."""
    schema = build_schema("\n".join(path.read_text() for path in SCHEMA_FILES) + runtime_sdl)
    long_type = schema.type_map["Long"]
    # graphql-core 3.3 coerces through coerce_*; parse_*/serialize are the 3.2 names it still offers
    for name in ("serialize", "parse_value", "coerce_output_value", "coerce_input_value"):
        setattr(long_type, name, _long)
    # graphql-core's stubs declare the 3.3 names only; 3.2's parse_literal is still read for literals in queries
    long_type.parse_literal = _long_literal  # type: ignore[attr-defined]
    bind_entities(schema, runtime_types or {})
    # the documents and policies topics (documents.graphql, policies.graphql)
    query_resolvers = {**QUERY_RESOLVERS, **DOCUMENT_QUERIES, **POLICY_QUERIES}
    mutation_resolvers = {**MUTATION_RESOLVERS, **POLICY_MUTATIONS}
    for root, resolvers in ((schema.query_type, query_resolvers), (schema.mutation_type, mutation_resolvers)):
        assert root is not None
        for name, resolver in resolvers.items():
            root.fields[name].resolve = _arguments_checked(resolver)
    return schema


@dataclass(frozen=True, slots=True)
class ServedSchema:
    schema: GraphQLSchema
    runtime_types: Mapping[str, str] = field(default_factory=dict)  # entity registered at run time -> object type


BASE = ServedSchema(build())  # the base models': every registry without entity types registered at run time
_SERVED: WeakKeyDictionary[EntityRegistry, ServedSchema] = WeakKeyDictionary()


def served_schema(registry: EntityRegistry) -> ServedSchema:
    """The schema of `registry` as it is now: built at the first request that asks, then again whenever the registry
    takes up a runtime model set (`registry.on_change`, in each process) that changes its entity types."""
    served = _SERVED.get(registry)
    if served is None:
        registry.on_change(_follow)
        served = _SERVED[registry] = _schema_of(registry, BASE)
    return served


def _follow(registry: EntityRegistry) -> None:
    _SERVED[registry] = _schema_of(registry, _SERVED.get(registry, BASE))


def _schema_of(registry: EntityRegistry, previous: ServedSchema) -> ServedSchema:
    types = runtime_entity_types(registry, BASE.schema.type_map)
    if types == previous.runtime_types:  # runtime aspects only: every entity type's `aspects` reads them as they are
        return previous
    if not types:
        return BASE
    try:
        return ServedSchema(build(runtime_entity_sdl(registry, types), types), types)
    except Exception:  # a stored set the models API did not check (app.modelset.service.graphql_refusals)
        log.exception(
            "the GraphQL schema of the runtime model set does not build; the last schema that built is served",
            extra={"runtime_version": registry.runtime_version, "entity_types": sorted(types)},
        )
        return previous


@dataclass(frozen=True, slots=True)
class GraphQLRequest:
    query: str
    variables: dict[str, Any] | None
    operation_name: str | None


def read_request(body: Any) -> GraphQLRequest:
    """The POST body `{"query", "variables"?, "operationName"?}`; anything else is a 400 (as DataHub answers it)."""
    if not isinstance(body, dict):
        raise ValidationFailed(
            'the body must be a JSON object {"query", "variables"?, "operationName"?}',
            [Issue("expected an object", path="$")],
        )
    query, variables, operation = body.get("query"), body.get("variables"), body.get("operationName")
    if not isinstance(query, str) or not query.strip():
        raise ValidationFailed("`query` must be a non-empty string", [Issue("missing query", path="$.query")])
    if variables is not None and not isinstance(variables, dict):
        raise ValidationFailed("`variables` must be an object", [Issue("expected an object", path="$.variables")])
    if operation is not None and not isinstance(operation, str):
        raise ValidationFailed("`operationName` must be a string", [Issue("expected a string", path="$.operationName")])
    return GraphQLRequest(query, variables, operation)


def _refused(message: str, classification: str = "ValidationError") -> dict[str, Any]:
    return {
        "errors": [
            {"message": message, "extensions": {"code": 400, "type": "BAD_REQUEST", "classification": classification}}
        ]
    }


def _format(error: GraphQLError) -> GraphQLFormattedError:
    formatted = error.formatted
    original = error.original_error
    if isinstance(original, MetaledgerError):
        code = original.status_code
        formatted["message"] = original.message
        formatted["extensions"] = {
            "code": code,
            "type": ERROR_TYPES.get(code, "BAD_REQUEST"),
            "classification": "DataFetchingException",
            **({"issues": [i.to_json() for i in original.issues]} if original.issues else {}),
        }
    elif original is not None and not isinstance(original, GraphQLError):
        # A resolver's own failure: logged whole, answered without internals (DataHub's wording)
        log.error("graphql resolver failed", exc_info=original, extra={"path": formatted.get("path")})
        formatted["message"] = "An unknown error occurred."
        formatted["extensions"] = {"code": 500, "type": "SERVER_ERROR", "classification": "DataFetchingException"}
    else:  # graphql-core's own: input coercion, non-null violations
        formatted["extensions"] = {"code": 400, "type": "BAD_REQUEST", "classification": "ValidationError"}
    return formatted


def _retryable(error: BaseException | None) -> bool:
    """An overloaded or unreachable service (no free database connection, the database or the search backend
    unreachable, a read cancelled by METALEDGER_READ_TIMEOUT_S, a read budget that found nothing: 504): answered as
    every route answers it (503/504 with Retry-After, by the app's handlers), which DataHub's client retries, rather
    than as a GraphQL error it would not."""
    if isinstance(error, MetaledgerError):
        return error.status_code in (429, 503, 504)
    return error is not None and classify(error) is DatabaseFault.UNAVAILABLE


def _errors(errors: list[GraphQLError], classification: str) -> dict[str, Any]:
    return {
        "errors": [
            {**e.formatted, "extensions": {"code": 400, "type": "BAD_REQUEST", "classification": classification}}
            for e in errors
        ]
    }


# What a checked document was checked for: its text, the operation run, the limits and the schema
DocumentKey = tuple[str, str | None, Limits, int, GraphQLSchema]


class ValidatedDocuments:
    """Documents that passed parsing, the limits and validation, by query text, operation and limits, the most
    recently used kept. Clients send the same few queries again and again with other variables, and checking a
    document costs more than running a small one: 2.7 ms for a one-page search, 39 ms for `datahub search`'s bundled
    query. A document is immutable once parsed, so one serves every request that sends its text (and operation: the
    limits measure the operation a request runs)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._documents: OrderedDict[DocumentKey, DocumentNode] = OrderedDict()

    def get(self, key: DocumentKey) -> DocumentNode | None:
        document = self._documents.get(key)
        if document is not None:
            self._documents.move_to_end(key)
        return document

    def put(self, key: DocumentKey, document: DocumentNode) -> None:
        self._documents[key] = document
        if len(self._documents) > self._size:
            self._documents.popitem(last=False)


VALIDATED = ValidatedDocuments(256)


def _checked(
    query: str, settings: Settings, schema: GraphQLSchema, operation_name: str | None = None
) -> DocumentNode | dict[str, Any]:
    """The document of `query`, valid in `schema`, its operation `operation_name` (or its only one) within the
    limits, or the response refusing it."""
    if len(query) > settings.graphql_max_query_chars:
        return _refused(f"the query is {len(query)} characters; the limit is {settings.graphql_max_query_chars}")
    limits = Limits(settings.graphql_max_depth, settings.graphql_max_aliases, settings.graphql_max_fields)
    key: DocumentKey = (query, operation_name, limits, settings.graphql_max_tokens, schema)
    document = VALIDATED.get(key)
    if document is not None:
        return document
    try:
        document = parse(query, max_tokens=settings.graphql_max_tokens)
    except GraphQLError as error:
        return _errors([error], "InvalidSyntax")
    except RecursionError:
        return _refused("the query is nested too deeply to parse", "InvalidSyntax")
    try:
        refused = check_limits(document, limits, schema, operation_name)
        if refused:
            return _errors(refused, "ValidationError")
        invalid = validate(schema, document)
    except RecursionError:
        return _refused("the query is nested too deeply")
    if invalid:
        return _errors(invalid, "ValidationError")
    VALIDATED.put(key, document)
    return document


def _too_costly(
    document: DocumentNode, request: GraphQLRequest, settings: Settings, schema: GraphQLSchema
) -> dict[str, Any] | None:
    """The response refusing the request's operation when it costs more than METALEDGER_GRAPHQL_MAX_COST (what its
    fragments select counted for the dearest object type a value may be, in `schema`)."""
    try:
        measured = query_cost(document, request.operation_name, request.variables, settings.graphql_max_count, schema)
    except RecursionError:  # walked as check_limits walks it, which refuses it first, give or take a stack frame
        return _refused("the query is nested too deeply")
    if measured is None or measured[0] <= settings.graphql_max_cost:
        return None
    cost, operation = measured
    name = f"operation {operation.name.value!r}" if operation.name else "the operation"
    return _refused(
        f"{name} costs {cost} (each field counted once per result it is resolved for: a search's "
        f"`searchResults` selection once per result of its page, facets as an aggregation); the limit "
        f"is {settings.graphql_max_cost} (METALEDGER_GRAPHQL_MAX_COST)"
    )


_PLAIN = frozenset((str, int, float, bool))  # the values a leaf's coercion takes as they are (no resolver to call)
_NOT_PLAIN = object()


def _attribute(source: Any, name: str) -> Any:
    value = getattr(source, name, None)
    return _NOT_PLAIN if callable(value) else value  # a method: the default resolver calls it (graphql-core's path)


@dataclass(frozen=True, slots=True)
class _Leaf:
    field_name: str
    type: GraphQLScalarType | GraphQLEnumType
    non_null: bool


async def _gathered(results: dict[str, Any], awaitable_fields: list[str]) -> dict[str, Any]:
    """`results` with its awaitable fields' values, as graphql-core's execute_fields gathers them."""
    if len(awaitable_fields) == 1:
        results[awaitable_fields[0]] = await results[awaitable_fields[0]]
    else:
        awaited = await gather_with_cancel(*(results[name] for name in awaitable_fields))
        results.update(zip(awaitable_fields, awaited, strict=True))
    return results


class AnswerBoundExecutor(Executor):
    """graphql-core's executor, counting the answer's bytes in the request's AnswerBudget (`context.answer`) as each
    leaf value is produced (the aspects read for it are counted where they are read: app.graphql.resolvers.Context).
    What takes the request past the budget is refused (AnswerTooLarge, which is no field error: `run` refuses the
    request whole), and from then on no field is resolved: the fields asked for afterwards are null at once, no
    resolver runs, no aspect is read. The resolvers already running finish, so the request's session is idle when
    `run` answers; the operation is not unwound (a partial answer is dropped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # graphql-core's helpers hold two bound methods of the executor, a cycle (executor → helpers → method →
        # executor) that kept every request's executor, and all it reached, alive until a garbage collection: with weak
        # references the request's objects go when it ends. The executor lives as long as its execution does.
        gather, track = WeakMethod(self.gather_async_work), WeakMethod(self.track_async_work)
        self.async_helpers = GraphQLResolveInfoHelpers(
            gather=lambda values: gather()(values),  # type: ignore[misc]
            track=lambda values: track()(values),  # type: ignore[misc]
        )

        # The leaf fields of each selection set (`_leaves`), by the identity of graphql-core's grouped field set,
        # which it keeps (memoized) for the execution: one selection of a list's objects is planned once.
        self._plans: dict[int, tuple[Any, tuple[_Leaf | None, ...]]] = {}

    def execute_field(
        self, parent_type: Any, source: Any, field_details_list: Any, path: Any, position_context: Any
    ) -> Any:
        if self.context_value.answer.exceeded:
            return None
        return super().execute_field(parent_type, source, field_details_list, path, position_context)

    def execute_fields(
        self, parent_type: Any, source_value: Any, path: Any, grouped_field_set: Any, position_context: Any
    ) -> Any:
        """graphql-core's, with its leaf fields read here: a scalar or enum field that the default resolver reads
        from a dict or an attribute, holding a str, int, float, bool (or null, where the field may be null), is
        the value coerced and charged, as graphql-core's own path does, without a resolve info, a response path
        or the completion's type dispatch (most of an entity query's fields are such leaves: a 50-field schema is
        hundreds). Any other value, field or failure takes graphql-core's own path, which answers as it always
        does."""
        planned = self._plans.get(id(grouped_field_set))
        if planned is None or planned[0] is not grouped_field_set:
            planned = (grouped_field_set, self._leaves(parent_type, grouped_field_set))
            self._plans[id(grouped_field_set)] = planned
        leaves = planned[1]
        if not any(leaves):
            return super().execute_fields(parent_type, source_value, path, grouped_field_set, position_context)
        answer: AnswerBudget = self.context_value.answer
        read = source_value.get if isinstance(source_value, Mapping) else functools.partial(_attribute, source_value)
        results: dict[str, Any] = {}
        awaitable_fields: list[str] = []
        try:
            for leaf, (response_name, field_details_list) in zip(leaves, grouped_field_set.items(), strict=True):
                if leaf is not None and not answer.exceeded:
                    try:
                        value = read(leaf.field_name)
                    except Exception:  # a property that raises: a field error, as graphql-core's path reports it
                        value = _NOT_PLAIN
                    if value is None:
                        if not leaf.non_null:
                            results[response_name] = None
                            continue
                    elif type(value) in _PLAIN:
                        try:
                            results[response_name] = self.complete_leaf_value(leaf.type, value)
                            continue
                        except AnswerTooLarge as error:
                            field_path = ResponsePath(path, response_name, parent_type.name)
                            self.handle_field_error(error, leaf.type, field_details_list, field_path)
                            results[response_name] = None
                            continue
                        except Exception:  # noqa: S110 - graphql-core's own path below reports it
                            pass
                field_path = ResponsePath(path, response_name, parent_type.name)
                result = self.execute_field(parent_type, source_value, field_details_list, field_path, position_context)
                if result is not Undefined:
                    results[response_name] = result
                    if self.is_awaitable(result):
                        awaitable_fields.append(response_name)
        except Exception:
            if awaitable_fields:
                self.settle_in_background([results[name] for name in awaitable_fields])
            raise
        if not awaitable_fields:
            return results
        return _gathered(results, awaitable_fields)

    def _leaves(self, parent_type: GraphQLObjectType, grouped_field_set: Any) -> tuple[_Leaf | None, ...]:
        """For each field of a selection set, in its order: a `_Leaf` when the fast path may read it, else None."""
        if self.field_resolver is not default_field_resolver or self.middleware_manager is not None:
            return (None,) * len(grouped_field_set)
        leaves: list[_Leaf | None] = []
        for field_details_list in grouped_field_set.values():
            node = field_details_list[0].node
            field_def = self.schema.get_field(parent_type, node.name.value)
            leaf = None
            if field_def is not None and field_def.resolve is None and not field_def.args and not node.arguments:
                return_type, non_null = field_def.type, False
                if isinstance(return_type, GraphQLNonNull):
                    return_type, non_null = return_type.of_type, True
                if isinstance(return_type, (GraphQLScalarType, GraphQLEnumType)):
                    leaf = _Leaf(node.name.value, return_type, non_null)
            leaves.append(leaf)
        return tuple(leaves)

    # graphql-core declares it a static method taking GraphQLLeafType; this override needs the executor's state
    def complete_leaf_value(self, return_type: Any, result: Any) -> Any:  # type: ignore[override]
        completed = Executor.complete_leaf_value(return_type, result)
        self.context_value.answer.charge(completed)
        return completed

    def handle_field_error(self, raw_error: Exception, return_type: Any, field_details_list: Any, path: Any) -> None:
        if isinstance(raw_error, AnswerTooLarge):
            answer: AnswerBudget = self.context_value.answer
            if answer.path is None:
                answer.path = ".".join(str(key) for key in path.as_list())
            return  # not an error of the field's: nothing propagates, the answer is dropped whole
        super().handle_field_error(raw_error, return_type, field_details_list, path)


def _too_large(answer: AnswerBudget, operation_name: str | None) -> dict[str, Any]:
    name = f"operation {operation_name!r}" if operation_name else "the operation"
    return _refused(
        f"the answer of {name} grew past {answer.limit} bytes at `{answer.path}` (the aspects read for "
        f"it and its values, counted as they came; nothing more was resolved); the limit is "
        f"{answer.limit} bytes (METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES): ask for fewer results, aliases or "
        f"fields"
    )


async def run(request: GraphQLRequest, context: Context, settings: Settings) -> tuple[dict[str, Any], int]:
    """The GraphQL response body (`data` and/or `errors`) and its HTTP status: 200, or 400 for an operation over the
    cost limit (refused before it runs, as a request too large is) or whose answer grows past
    METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES (refused as it is produced)."""
    served = served_schema(context.registry)
    context.runtime_types = served.runtime_types
    document = _checked(request.query, settings, served.schema, request.operation_name)
    if isinstance(document, dict):
        return document, 200
    refused = _too_costly(document, request, settings, served.schema)
    if refused is not None:
        return refused, 400
    context.answer = AnswerBudget(settings.graphql_max_response_bytes)
    operation = get_operation_ast(document, request.operation_name)
    if context.read_session is not None and operation is not None and operation.operation is OperationType.QUERY:
        # A query reads a replica's (or the primary's) pooled connection; a mutation writes with the primary's session.
        # A query's resolvers only read, through the repositories, which take either (app.db.PooledConnection).
        context.session = cast(AsyncSession, await context.read_session())
    result = execute(
        served.schema,
        document,
        variable_values=request.variables,
        operation_name=request.operation_name,
        context_value=context,
        executor_class=AnswerBoundExecutor,
    )
    if isawaitable(result):  # synchronous when no async resolver ran (introspection, variable errors)
        result = await result
    if context.answer.exceeded:
        log.warning(
            "graphql answer refused: over METALEDGER_GRAPHQL_MAX_RESPONSE_BYTES",
            extra={"limit": context.answer.limit, "path": context.answer.path},
        )
        return _too_large(context.answer, request.operation_name), 400
    for error in result.errors or ():
        if _retryable(error.original_error):
            # original_error is typed Exception | None; _retryable returned True, so it is an exception
            raise error.original_error  # type: ignore[misc]
    body: dict[str, Any] = {"data": result.data}
    if result.errors:
        body["errors"] = [_format(e) for e in result.errors]
        if result.data is None and all(e.path is None for e in result.errors):
            del body["data"]  # a request error (variables, operation name): no execution started
    return body, 200
