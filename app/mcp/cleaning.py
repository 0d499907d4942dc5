"""How DataHub's MCP server shapes GraphQL answers for an agent (mcp-server-datahub 0.8.0's graphql_helpers and
_token_estimator, Apache-2.0), ported so that `/mcp` answers what DataHub's tools answer: the cleaning of GraphQL
artifacts, description truncation, schema fields reduced to what SQL needs (tags and terms as names, the editable
metadata merged in as `edited*`), their priority order, and the token budgets that trim fields and lineage results.

The constants are DataHub's defaults (its server reads them from environment variables; metaledger keeps them fixed,
so that both servers cut at the same place)."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
DESCRIPTION_LENGTH_HARD_LIMIT = 5000
FIELD_DESCRIPTION_LENGTH_HARD_LIMIT = 120  # per schema field: a response can carry hundreds
QUERY_LENGTH_HARD_LIMIT = 5000
DOCUMENT_CONTENT_CHAR_LIMIT = 8000
TOOL_RESPONSE_TOKEN_LIMIT = 80_000
ENTITY_SCHEMA_TOKEN_BUDGET = 16_000  # ~5 entities per answer: 80K / 5
FIELD_STRUCTURED_PROPERTY_CHAR_LIMIT = 1000
FIELD_STRUCTURED_PROPERTY_MAX_VALUES = 25

_BASE64_IMAGE = re.compile(r"data:image/[^;]+;base64,[A-Za-z0-9+/=]+")
_BASE64_IMAGE_EMBED = re.compile(r"!\[[^\]]*\]\(data:image/[^)]+\)")
_HTML_TAG = re.compile(r"<[^<>]{0,100}>")  # bounded: no backtracking on a '<' without its '>'
_DATA_EMBED = re.compile(r"!\[([^\]]*)\]\(data:[^)]+\)")


def estimate_tokens(value: Any, depth: int = 0) -> int:
    """DataHub's TokenCountEstimator.estimate_dict_tokens: characters as JSON would spend them, times 1.3 / 4."""
    return int(1.3 * _chars(value, depth) / 4)


def _chars(item: Any, depth: int) -> int:
    if depth > 100:
        return 0
    if item is None:
        return 4
    if isinstance(item, bool):
        return 5
    if isinstance(item, str):
        return len(item) + 6 + int(len(item) * 0.1)
    if isinstance(item, (int, float)):
        return 6
    if isinstance(item, list):
        return sum(_chars(e, depth + 1) for e in item) + len(item)
    if isinstance(item, dict):
        return sum(len(str(k)) + 9 + _chars(v, depth + 1) for k, v in item.items()) + len(item)
    return 10


def clean_gql_response(response: Any) -> Any:
    """No `__typename`, nulls, empty lists or (after cleaning) empty objects; base64 images out of descriptions."""
    if isinstance(response, dict):
        cleaned: dict[str, Any] = {}
        for key, value in response.items():
            if key == "__typename" or value is None or value == []:
                continue
            value = clean_gql_response(value)
            if key == "description" and isinstance(value, str) and "base64" in value:
                value = _BASE64_IMAGE_EMBED.sub("[image removed]", _BASE64_IMAGE.sub("[image removed]", value))
            if value is not None and value != {}:
                cleaned[key] = value
        return cleaned
    if isinstance(response, list):
        return [clean_gql_response(item) for item in response]
    return response


def truncate_with_ellipsis(text: str, max_length: int, suffix: str = "...") -> str:
    if not text or len(text) <= max_length:
        return text
    if max_length <= len(suffix):
        return text[: max(max_length, 0)]
    return text[: max_length - len(suffix)] + suffix


def _sanitize_and_truncate(text: str, max_length: int) -> str:
    if not text:
        return text
    text = html.unescape(_HTML_TAG.sub("", text)).strip()
    text = _DATA_EMBED.sub(r"\1", text).strip()
    return truncate_with_ellipsis(text, max_length)


def truncate_descriptions(data: Any, max_length: int = DESCRIPTION_LENGTH_HARD_LIMIT) -> None:
    """Every `description` string, at any depth, without HTML tags or data embeds and at most `max_length` long (in
    place)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "description" and isinstance(value, str):
                data[key] = _sanitize_and_truncate(value, max_length)
            elif isinstance(value, (dict, list)):
                truncate_descriptions(value, max_length)
    elif isinstance(data, list):
        for item in data:
            truncate_descriptions(item, max_length)


def truncate_query(query: str) -> str:
    return truncate_with_ellipsis(query, QUERY_LENGTH_HARD_LIMIT, suffix="... [truncated]")


def select_results_within_budget(
    results: Iterable[T], fetch_entity: Callable[[T], Any], max_results: int, token_budget: int | None = None
) -> Iterator[T]:
    """The results, at most `max_results`, while their entities fit the token budget (90% of the tool's answer limit
    by default); the first always."""
    budget = token_budget if token_budget is not None else int(TOOL_RESPONSE_TOKEN_LIMIT * 0.9)
    total = 0
    for index, result in enumerate(results):
        if index >= max_results:
            break
        tokens = estimate_tokens(fetch_entity(result))
        if total + tokens > budget and index > 0:
            break
        total += tokens
        yield result


def sort_fields_by_priority(fields: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Keys first (part of the key, then partitioning), then described fields, then tagged or termed ones, then by
    path: what a cut by the budget keeps."""

    def score(field: dict[str, Any]) -> tuple[int, int, int, str]:
        key = 2 if field.get("isPartOfKey") else 1 if field.get("isPartitioningKey") else 0
        tagged = 1 if field.get("tags") or field.get("glossaryTerms") else 0
        return (-key, -(1 if field.get("description") else 0), -tagged, field.get("fieldPath", ""))

    return iter(sorted(fields, key=score))


def extract_structured_properties(schema_field_entity: dict[str, Any], truncate: bool = True) -> dict[str, Any]:
    """A schema field entity's structured properties as {qualified name: value} (one value unwrapped)."""
    extracted: dict[str, Any] = {}
    for prop in (schema_field_entity.get("structuredProperties") or {}).get("properties") or []:
        structured_property = prop.get("structuredProperty") or {}
        name = (structured_property.get("definition") or {}).get("qualifiedName") or structured_property.get("urn")
        if not name:
            continue
        values: list[Any] = []
        for value in prop.get("values") or []:
            if not value:
                continue
            if (string_value := value.get("stringValue")) is not None:
                values.append(
                    truncate_with_ellipsis(string_value, FIELD_STRUCTURED_PROPERTY_CHAR_LIMIT)
                    if truncate
                    else string_value
                )
            elif (number_value := value.get("numberValue")) is not None:
                values.append(number_value)
        if not values:  # a URN value is echoed in both: valueEntities only when `values` said nothing
            values = [v["urn"] for v in prop.get("valueEntities") or [] if v and v.get("urn")]
        if not values:
            continue
        if truncate:
            values = values[:FIELD_STRUCTURED_PROPERTY_MAX_VALUES]
        extracted[name] = values[0] if len(values) == 1 else values
    return extracted


def _tag_names(tags: Any) -> list[str]:
    return [
        t["tag"]["properties"]["name"]
        for t in (tags or {}).get("tags") or []
        if (t.get("tag") or {}).get("properties") and t["tag"]["properties"].get("name")
    ]


def _term_names(terms: Any) -> list[str]:
    return [
        t["term"]["properties"]["name"]
        for t in (terms or {}).get("terms") or []
        if (t.get("term") or {}).get("properties") and t["term"]["properties"].get("name")
    ]


def _clean_schema_fields(
    fields: Iterable[dict[str, Any]], editable: dict[str, dict[str, Any]], include_structured_properties: bool
) -> Iterator[dict[str, Any]]:
    """Each field as SQL needs it: path, type, native type, description (cut), nullable, label, keys, deprecation,
    tags and terms by name, and what a user edited (`editedDescription`, `editedTags`, `editedGlossaryTerms`) when it
    differs from the ingested value."""
    for f in fields:
        out: dict[str, Any] = {"fieldPath": f["fieldPath"]}
        if field_type := f.get("type"):
            out["type"] = field_type
        if native := f.get("nativeDataType"):
            out["nativeDataType"] = native
        if description := f.get("description"):
            out["description"] = description[:FIELD_DESCRIPTION_LENGTH_HARD_LIMIT]
        if f.get("nullable") is not None:
            out["nullable"] = f["nullable"]
        if label := f.get("label"):
            out["label"] = label
        for flag in ("isPartOfKey", "isPartitioningKey", "recursive"):
            if f.get(flag):
                out[flag] = True
        if entity := f.get("schemaFieldEntity"):
            deprecation = entity.get("deprecation") or {}
            if deprecation.get("deprecated"):
                note = (deprecation.get("note") or "")[:FIELD_DESCRIPTION_LENGTH_HARD_LIMIT]
                out["deprecated"] = {"deprecated": True, "note": note}
            if include_structured_properties and (properties := extract_structured_properties(entity)):
                out["structuredProperties"] = properties
        if (tags := f.get("tags")) and tags.get("tags"):
            out["tags"] = _tag_names(tags)
        if (terms := f.get("glossaryTerms")) and terms.get("terms"):
            out["glossaryTerms"] = _term_names(terms)
        if edited := editable.get(f["fieldPath"]):
            if edited_description := edited.get("description"):
                cut = edited_description[:FIELD_DESCRIPTION_LENGTH_HARD_LIMIT]
                if cut != out.get("description", ""):
                    out["editedDescription"] = cut
            if (edited_tags := _tag_names(edited.get("tags"))) and edited_tags != out.get("tags", []):
                out["editedTags"] = edited_tags
            if (edited_terms := _term_names(edited.get("glossaryTerms"))) and edited_terms != out.get(
                "glossaryTerms", []
            ):
                out["editedGlossaryTerms"] = edited_terms
        yield out


def clean_get_entities_response(
    raw: dict[str, Any],
    *,
    sort_fn: Callable[[list[dict[str, Any]]], Iterator[dict[str, Any]]] | None = None,
    offset: int = 0,
    limit: int | None = None,
    include_structured_properties: bool = False,
) -> dict[str, Any]:
    """DataHub's clean_get_entities_response: the cleaned entity, its schema fields sorted, cleaned and cut (offset,
    limit, ENTITY_SCHEMA_TOKEN_BUDGET: `schemaMetadata.schemaFieldsTruncated` says so), editableSchemaMetadata merged
    into them and dropped, a view's logic and a document's text cut."""
    response: dict[str, Any] = clean_gql_response(raw)
    if response and (schema := response.get("schemaMetadata")):
        if (platform_schema := schema.get("platformSchema")) and not platform_schema.get("schema"):
            del schema["platformSchema"]
        if fields := schema.get("fields"):
            editable: dict[str, dict[str, Any]] = {}
            for info in (response.get("editableSchemaMetadata") or {}).get("editableSchemaFieldInfo") or []:
                if path := info.get("fieldPath"):
                    editable[path] = info
            ordered = (sort_fn or sort_fields_by_priority)(fields)
            selected: list[dict[str, Any]] = []
            tokens = 0
            for index, field in enumerate(_clean_schema_fields(ordered, editable, include_structured_properties)):
                if index < offset:
                    continue
                cost = estimate_tokens(field)
                if tokens + cost > ENTITY_SCHEMA_TOKEN_BUDGET and selected:
                    break
                if limit is not None and len(selected) >= limit:
                    break
                selected.append(field)
                tokens += cost
            if len(selected) < len(fields) - offset:
                schema["schemaFieldsTruncated"] = {
                    "totalFields": len(fields),
                    "includedFields": len(selected),
                    "offset": offset,
                }
            schema["fields"] = selected
    response.pop("editableSchemaMetadata", None)
    if response and (view := response.get("viewProperties")) and view.get("logic"):
        view["logic"] = truncate_query(view["logic"])
    if response and (info := response.get("info")) and (contents := info.get("contents")):
        text = contents.get("text")
        if text and len(text) > DOCUMENT_CONTENT_CHAR_LIMIT:
            cut = DOCUMENT_CONTENT_CHAR_LIMIT
            contents["text"] = (
                text[:cut] + f"\n\n[Content truncated. Use grep_documents(start_offset={cut}) to continue.]"
            )
            contents |= {"_truncated": True, "_originalLengthChars": len(text), "_truncatedAtChar": cut}
    return response
