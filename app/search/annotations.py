"""The annotations of a runtime aspect's fields that the indexer reads (app.search.documents): Searchable,
Relationship, TimeseriesField, checked on the registry a runtime model set makes before it is stored
(app.modelset.service hands `annotation_refusals` to app.registry.compatibility.check_models): each an object, its
properties of their types, a Relationship named; the search document fields it makes are names and not the
documents' own (a Searchable field named `removed` would hide entities from search)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from app.limits import clip
from app.registry import EntityRegistry
from app.registry.compatibility import (
    BOOLEAN,
    MAX_FIELD_NAME_CHARS,
    NAME,
    NAME_PATTERN,
    STRING,
    Refusal,
    bad_name,
    invalid,
    is_object,
    is_str,
    is_strings,
    too_deep_refusal,
)
from app.registry.registry import AspectSpec
from app.registry.runtime import RuntimeModelSet
from app.registry.schema import AliasedUnion, Array, Map, Record, Union
from app.search.documents import type_at_path  # what the indexer resolves an annotation's path to
from app.search.elastic_mappings import ASPECT_FIELDS_FIELD
from app.search.model import REMOVED_FIELD, TOMBSTONE_FIELD, URN_FIELD, VERSIONS_FIELD
from app.search.structured_properties import STRUCTURED_PROPERTIES_ASPECT

# Fields a schema may have, counted as the indexer walks them (app.registry.registry's field annotations: a named
# record used twice is walked twice, so a few records used twice at each of 30 levels are a billion fields). DataHub's
# largest aspect (assertionInfo) has 70.
MAX_FIELD_PATHS = 10_000


def is_boost(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1_000_000


def is_weights(value: Any) -> bool:
    return isinstance(value, dict) and all(is_boost(v) for v in value.values())


# DataHub's SearchableAnnotation.FieldType
FIELD_TYPES = (
    "KEYWORD",
    "TEXT",
    "TEXT_PARTIAL",
    "BROWSE_PATH",
    "URN",
    "URN_PARTIAL",
    "BOOLEAN",
    "COUNT",
    "DATETIME",
    "OBJECT",
    "BROWSE_PATH_V2",
    "WORD_GRAM",
    "DOUBLE",
    "MAP_ARRAY",
)
_FIELD_NAME = (is_str, f"a search document field name: {NAME_PATTERN}, at most {MAX_FIELD_NAME_CHARS} characters")
# The properties the indexer, the search backends or GraphQL read, by annotation: (accepts, what it accepts). Others
# (DataHub adds some) are not read, and not checked.
ANNOTATION_PROPERTIES: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "Searchable": {
        "fieldName": _FIELD_NAME,
        "hasValuesFieldName": _FIELD_NAME,
        "numValuesFieldName": _FIELD_NAME,
        "fieldType": (lambda v: v in FIELD_TYPES, f"one of {', '.join(FIELD_TYPES)}"),
        "queryByDefault": BOOLEAN,
        "enableAutocomplete": BOOLEAN,
        "addToFilters": BOOLEAN,
        "addHasValuesToFilters": BOOLEAN,
        "includeSystemModifiedAt": BOOLEAN,
        "includeQueryEmptyAggregation": BOOLEAN,
        "sanitizeRichText": BOOLEAN,
        "boostScore": (is_boost, "a number from 0 to 1000000"),
        "filterNameOverride": STRING,
        "systemModifiedAtFieldName": STRING,
        "fieldNameAliases": (is_strings, "a list of strings"),
        "weightsPerFieldValue": (is_weights, "an object of numbers from 0 to 1000000"),
        "v3": (is_object, "an object"),
    },
    "Relationship": {
        "name": (
            lambda v: isinstance(v, str) and len(v) <= MAX_FIELD_NAME_CHARS and bool(NAME.fullmatch(v)),
            f"a relationship name: {NAME_PATTERN}, at most {MAX_FIELD_NAME_CHARS} characters",
        ),
        "entityTypes": (is_strings, "a list of strings"),
        "isLineage": BOOLEAN,
        "isUpstream": BOOLEAN,
        **{
            key: (is_str, "a path in the aspect (a string)")
            for key in ("createdOn", "createdActor", "updatedOn", "updatedActor", "properties", "via")
        },
    },
    "TimeseriesField": {},
}
REQUIRED_PROPERTIES = {"Relationship": ("name",)}

# Fields of the search documents' own (app.search.model, app.search.elastic_mappings): the URN, the soft-delete flag
# every search reads to leave an entity out, the versions indexed, the hard-delete tombstone, each aspect's fields,
# the structured properties' object. A runtime aspect's Searchable field of one of these names would hide entities
# from search, or make their index updates fail.
RESERVED_DOCUMENT_FIELDS = frozenset(
    {URN_FIELD, REMOVED_FIELD, VERSIONS_FIELD, TOMBSTONE_FIELD, ASPECT_FIELDS_FIELD, STRUCTURED_PROPERTIES_ASPECT}
)
# Fields of a timeseries point's own (app.search.documents._ts_common, elastic_mappings.timeseries_mapping): a
# TimeseriesField of one of these names would overwrite them (`runId` is not one: DataHub's own aspects declare it).
RESERVED_POINT_FIELDS = frozenset(
    {
        "urn",
        "timestampMillis",
        "eventGranularity",
        "partitionSpec",
        "messageId",
        "isExploded",
        "event",
        "systemMetadata",
    }
)


# ----------------------------------------------------------------------------------------------------------------
class _TooDeep(Exception):
    def __init__(self, path: str) -> None:
        self.path = path


class _TooMany(Exception):
    pass


def _fields(root: Record, max_depth: int, max_fields: int) -> Iterator[tuple[Any, str, str]]:
    """(field, its PathSpec `/a/*/b`, its path in the schema `$.fields.a.type.items.fields.b`) of every field the
    indexer walks (app.registry.registry._walk_annotations: a record inside itself is not walked again), without
    recursion. Raises _TooDeep past `max_depth` nested types (a chain of named types can nest deeper than the
    document does), _TooMany past `max_fields` fields."""
    on_path: set[int] = set()
    work: list[tuple[Any, ...]] = [("type", root, "", "$", 1)]
    count = 0
    while work:
        item = work.pop()
        if item[0] == "leave":
            on_path.discard(item[1])
            continue
        if item[0] == "field":
            count += 1
            if count > max_fields:
                raise _TooMany()
            yield item[1], item[2], item[3]
            continue
        _, t, spec, path, depth = item
        if isinstance(t, (Record, Array, Map, Union, AliasedUnion)) and depth > max_depth:
            raise _TooDeep(path)
        if isinstance(t, Record):
            if id(t) in on_path:
                continue
            on_path.add(id(t))
            work.append(("leave", id(t)))
            for f in reversed(t.fields):
                field_path = f"{path}.fields.{f.name}"
                work.append(("type", f.type, f"{spec}/{f.name}", f"{field_path}.type", depth + 1))
                work.append(("field", f, f"{spec}/{f.name}", field_path))
        elif isinstance(t, Array):
            work.append(("type", t.items, f"{spec}/*", f"{path}.items", depth + 1))
        elif isinstance(t, Map):
            work.append(("type", t.values, f"{spec}/*", f"{path}.values", depth + 1))
        elif isinstance(t, (Union, AliasedUnion)):
            for key, member in reversed(t.members):
                work.append(("type", member, f"{spec}/{key}", f"{path}[{key}]", depth + 1))


def _targets(kind: str, value: Any, path: str) -> Iterator[tuple[str | None, Any, str]]:
    """(sub-path or None, annotation, its path) of an annotation written on a field, or of each path override of
    one (`{"Searchable": {"/*/tag": {...}}}`, as app.registry.registry reads them)."""
    if isinstance(value, dict) and value and all(isinstance(k, str) and k.startswith("/") for k in value):
        for sub, annotation in value.items():
            yield sub, annotation, f'{path}.{kind}["{clip(sub, 100)}"]'
    else:
        yield None, value, f"{path}.{kind}"


class FieldAnnotations:
    """The annotations of each runtime aspect's fields that the indexer reads (app.search.documents): Searchable,
    Relationship, TimeseriesField. Each is an object, its properties of their types (ANNOTATION_PROPERTIES), a
    Relationship named; the search document fields it makes (its `fieldName`, else the field's name;
    `hasValuesFieldName`, `numValuesFieldName`) are names (NAME_PATTERN) and not the documents' own
    (RESERVED_DOCUMENT_FIELDS: `ReservedSearchField`), nor a timeseries point's (RESERVED_POINT_FIELDS)."""

    invalid = "InvalidAnnotation"
    reserved = "ReservedSearchField"

    def check(self, spec: AspectSpec, max_depth: int) -> list[Refusal]:
        refusals: list[Refusal] = []
        root = spec.type
        try:
            for f, pathspec, path in _fields(root, max_depth, MAX_FIELD_PATHS):
                for kind in ANNOTATION_PROPERTIES:
                    if kind in f.annotations:
                        for sub, annotation, where in _targets(kind, f.annotations[kind], path):
                            segments = tuple(s for s in (pathspec + (sub or "")).split("/") if s)
                            refusals.extend(self._check(spec, kind, annotation, where, segments))
        except _TooDeep as deep:
            return [too_deep_refusal("SchemaTooDeep", spec.name, deep.path, max_depth)]
        except _TooMany:
            return [
                Refusal(
                    "SchemaTooLarge",
                    f"the schema has more than {MAX_FIELD_PATHS} field paths (named types "
                    "used in several places are walked in each)",
                    spec.name,
                    "$",
                    expected=f"at most {MAX_FIELD_PATHS} field paths",
                )
            ]
        return refusals

    def _check(
        self, spec: AspectSpec, kind: str, annotation: Any, path: str, segments: tuple[str, ...]
    ) -> Iterator[Refusal]:
        if not isinstance(annotation, dict):
            yield invalid(self.invalid, spec.name, path, annotation, "an object")
            return
        bad = False
        for key, (accepts, expected) in ANNOTATION_PROPERTIES[kind].items():
            if key in annotation and not accepts(annotation[key]):
                bad = True
                yield invalid(self.invalid, spec.name, f"{path}.{key}", annotation[key], expected)
        for key in REQUIRED_PROPERTIES.get(kind, ()):
            if key not in annotation:
                bad = True
                yield invalid(self.invalid, spec.name, f"{path}.{key}", None, ANNOTATION_PROPERTIES[kind][key][1])
        if bad or any(s.startswith("$") for s in segments) or (annotation and set(annotation) <= {"v3"}):
            return  # the indexer leaves out `$key` paths and annotations of search-v3 hints only
        schema_field = type_at_path(spec.type, segments)[1] or (segments[-1] if segments else None)
        if kind == "Searchable" and annotation.get("fieldType") != "MAP_ARRAY":  # MAP_ARRAY: no document field
            for key in ("fieldName", "hasValuesFieldName", "numValuesFieldName"):
                if annotation.get(key):
                    yield from self._field_name(
                        spec, annotation[key], f"{path}.{key}", RESERVED_DOCUMENT_FIELDS, "the search documents' own"
                    )
                elif key == "fieldName" and schema_field:  # the field's own name is the document field's
                    yield from self._field_name(
                        spec, schema_field, path, RESERVED_DOCUMENT_FIELDS, "the search documents' own"
                    )
        elif kind == "TimeseriesField" and spec.is_timeseries and "*" not in segments and schema_field:
            yield from self._field_name(spec, schema_field, path, RESERVED_POINT_FIELDS, "a timeseries point's own")

    def _field_name(
        self, spec: AspectSpec, name: str, path: str, reserved: frozenset[str], whose: str
    ) -> Iterator[Refusal]:
        if name in reserved:
            yield Refusal(
                self.reserved,
                f"{name!r} is a field of {whose} ({', '.join(sorted(reserved))}): a value "
                "of it would stand for the document's",
                spec.name,
                clip(path),
                expected=f"a field name other than {', '.join(sorted(reserved))}",
                found=name,
            )
            return
        refusal = bad_name(
            name, "search document field name", MAX_FIELD_NAME_CHARS, clip(path), spec.name, self.invalid
        )
        if refusal is not None:
            yield refusal


FIELD_ANNOTATIONS = FieldAnnotations()


def annotation_refusals(built: EntityRegistry, proposed: RuntimeModelSet, max_depth: int) -> list[Refusal]:
    """The refusals of the fields' annotations of each aspect of `proposed`, as `built` compiles them."""
    return [refusal for name in proposed.aspects for refusal in FIELD_ANNOTATIONS.check(built.aspects[name], max_depth)]
