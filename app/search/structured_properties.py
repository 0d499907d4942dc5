"""Structured property values in the search documents, named as DataHub names them (no I/O of its own: the Spark
indexer builds documents with it too).

An entity's `structuredProperties` aspect contributes one document field per property it holds a value of:
`structuredProperties.<id>`, the id being the property URN's (`urn:li:structuredProperty:<id>`, DataHub's
qualified name) with each `.` replaced by `_` (DataHub's StructuredPropertyUtils.toElasticsearchFieldName for a
definition without `version`): the field's name never depends on a definition, which the indexer does not read.
Its values are the assignment's, a `double` as a number, a `string` as a string (DataHub's document holds a number
for every value of a `number` property; here a number given as a string stays one).

A filter names the property as DataHub's UI and GraphQL do, `structuredProperties.<qualified name>` (a `.keyword`
or `.delimited` suffix dropped): `document_field` is the field it filters on. Whether the property's definition
is soft-deleted is decided when the search is asked (`refuse_deleted_property_filters`, which asks the request's
`PropertyDefinitions`), so a soft delete or an undelete changes what is found at once, with no document rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from app.search.filters import InvalidFilter, Placed

STRUCTURED_PROPERTIES_ASPECT = "structuredProperties"
FIELD_PREFIX = "structuredProperties."  # DataHub's STRUCTURED_PROPERTY_MAPPING_FIELD_PREFIX
PROPERTY_URN_PREFIX = "urn:li:structuredProperty:"
_SUBFIELD_SUFFIXES = (".keyword", ".delimited")


class PropertyDefinitions(Protocol):
    """Which structured properties are soft-deleted: app.write.reader.EntityReader, the request's read of the aspect
    store (a handler passes its reader, never a repository)."""

    async def deleted_properties(self, property_urns: Iterable[str]) -> set[str]: ...


def is_property_field(name: str) -> bool:
    return name.startswith(FIELD_PREFIX) and len(name) > len(FIELD_PREFIX)


def qualified_name_of(filter_field: str) -> str:
    """DataHub's fieldOrFacetToFQN: `structuredProperties.io.acryl.tier.keyword` → `io.acryl.tier`."""
    name = filter_field[len(FIELD_PREFIX) :]
    for suffix in _SUBFIELD_SUFFIXES:
        name = name.replace(suffix, "")
    return name


def property_urn_of(filter_field: str) -> str:
    """The property a `structuredProperties.<qualified name>` filter field names (DataHub's toURNFromFQN)."""
    return PROPERTY_URN_PREFIX + qualified_name_of(filter_field)


def document_field(name: str) -> str:
    """The document field a filter or sort field is answered on: a structured property's own field, any other
    name as it is."""
    if not is_property_field(name):
        return name
    return FIELD_PREFIX + qualified_name_of(name).replace(".", "_")


def field_of_property(property_urn: str) -> str:
    return FIELD_PREFIX + property_urn.removeprefix(PROPERTY_URN_PREFIX).replace(".", "_")


def property_urns_filtered(fields: Iterable[str]) -> set[str]:
    """The structured properties that filter fields name."""
    return {property_urn_of(name) for name in fields if is_property_field(name)}


def document_fields(value: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The document fields of a `structuredProperties` value: each property's values (a property listed twice,
    which the write path refuses, has the values of both)."""
    fields: dict[str, list[Any]] = {}
    for assignment in value.get("properties") or ():
        urn = assignment.get("propertyUrn")
        if not isinstance(urn, str) or not urn.startswith(PROPERTY_URN_PREFIX):
            continue
        held = fields.setdefault(field_of_property(urn), [])
        for item in assignment.get("values") or ():
            scalar = item.get("double", item.get("string")) if isinstance(item, Mapping) else None
            if scalar is not None and scalar != "" and scalar not in held:
                held.append(scalar)
    return fields


async def refuse_deleted_property_facets(definitions: PropertyDefinitions, facets: Sequence[str]) -> None:
    """DataHub's validateStructuredPropertyFQN on a requested facet: one naming a soft-deleted property is refused
    (InvalidFilter at its index in `facets`)."""
    named = {i: property_urn_of(name) for i, name in enumerate(facets) if is_property_field(name)}
    removed = await definitions.deleted_properties(named.values())
    for i, urn in named.items():
        if urn in removed:
            raise InvalidFilter(f"Cannot aggregate on deleted Structured Property {urn}", (i,), found=facets[i])


async def refuse_deleted_property_filters(definitions: PropertyDefinitions, placed: Iterable[Placed]) -> None:
    """DataHub's StructuredPropertyUtils.validateFilter: a search filtering on a property whose definition is
    soft-deleted is refused (InvalidFilter at the criterion's field), so its values are never found; decided when
    the search is asked, a soft delete or an undelete holds for the next search."""
    placed = [p for p in placed if is_property_field(p.criterion.field)]
    removed = await definitions.deleted_properties(property_urn_of(p.criterion.field) for p in placed)
    for p in placed:
        urn = property_urn_of(p.criterion.field)
        if urn in removed:
            raise InvalidFilter(
                f"Cannot filter on deleted Structured Property {urn}", (*p.loc, "field"), found=p.criterion.field
            )
