"""Structured properties checked as DataHub checks them, inside the write transaction.

A structured property is a `structuredProperty` entity whose `propertyDefinition` (valueType, cardinality,
allowedValues, entityTypes, typeQualifier, immutable) governs the values entities carry in their
`structuredProperties` aspect. Three places enforce it, all in the shared write pipeline:

- `StructuredPropertyValues` (DataHub's StructuredPropertiesValidator), a pre-commit rule on every write of
  `structuredProperties` (UPSERT, CREATE, UPDATE, the result of a PATCH, DELETE for immutable values): each
  assignment against its definition as the transaction sees it; an asynchronous write's values are checked against
  the stored definitions before it is queued too (`refusals_before_queueing`), for the caller's 400;
- `PropertyDefinitionChange` (DataHub's PropertyDefinitionValidator), a pre-commit rule on `propertyDefinition`:
  the parts that cannot change, allowedValues only widening, unless the definition's `version` goes up;
- `StoredValueCheck`: a definition change that could invalidate values already stored (anything narrowing, a
  version-bumped breaking change included, which DataHub lets through) is checked against them after the
  transaction's own rows are written, before it commits (`stored_value_violations`).

The definitions are read in the transaction: `definition_keys` names the `propertyDefinition` and `status` rows a
write needs, which the write's lock step reads `FOR SHARE` (app.write.decision). A value write and a definition
change of the same property therefore serialise on the definition row: the definition's writer holds it `FOR
UPDATE` while it checks the stored values, and a value writer waiting on it reads the new definition.

`soft_deleted` decides which properties are soft-deleted (their definition entity has `status.removed`) for every
read: `hide_soft_deleted` (DataHub's StructuredPropertiesSoftDelete read hook) leaves their values out of what entity
reads return, `refuse_deleted_property_filters` refuses a search filtering on one (DataHub's validateFilter).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import orjson

from app.urns import InvalidUrnError, entity_type_of, parse_urn
from app.write.proposal import ChangeType, Proposal
from app.write.repository import AspectRepository, StoredAspect
from app.write.rules import ANY, PendingChange, PreCommitRule, Verdict, VerdictKind

STRUCTURED_PROPERTIES = "structuredProperties"
PROPERTY_DEFINITION = "propertyDefinition"
STATUS = "status"
PROPERTY_ENTITY = "structuredProperty"
PROPERTY_URN_PREFIX = f"urn:li:{PROPERTY_ENTITY}:"
ENTITY_TYPE_URN_PREFIX = "urn:li:entityType:"
ALLOWED_TYPES = "allowedTypes"

STRING_TYPES = frozenset({"string", "rich_text", "date", "urn"})  # stored as {"string": ...}
VALUE_TYPES = STRING_TYPES | {"number"}
MIN_DATE, MAX_DATE = date(1000, 1, 1), date(9999, 12, 31)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# What Java's Double.parseDouble accepts, which DataHub uses on a number given as a string (hex floats left out)
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fFdD]?)")
_VERSION = re.compile(r"[0-9]{14}")

STORED_CHECK_PAGE = 500  # rows read per statement when a definition change is checked against stored values
MAX_REPORTED_VIOLATIONS = 5

Key = tuple[str, str]


def type_id(urn: str) -> str:
    """DataHub's getValueTypeId: `urn:li:dataType:datahub.string` → `string`, `urn:li:entityType:datahub.dataset` →
    `dataset` (lower-cased)."""
    type_part = urn.split(":", 3)[-1]
    if type_part.startswith("datahub."):
        type_part = type_part.split(".")[1]
    return type_part.lower()


def shown_value(value: Mapping[str, Any]) -> str:
    return orjson.dumps(value).decode()


@dataclass(frozen=True, slots=True)
class Definition:
    """A `propertyDefinition` value, as the checks read it."""

    urn: str
    value_type: str  # `string`, `rich_text`, `date`, `number`, `urn`, or what DataHub would not know
    cardinality: str
    allowed_values: tuple[dict[str, Any], ...] | None  # each a PrimitivePropertyValue ({"string": ..} | {"double": ..})
    entity_types: frozenset[str]  # type ids, lower-cased
    allowed_types: frozenset[str] | None  # `urn` values: the entity types they may be of (typeQualifier)
    immutable: bool

    @classmethod
    def of(cls, urn: str, value: Mapping[str, Any]) -> Definition:
        allowed = value.get("allowedValues")
        qualifier = value.get("typeQualifier") or {}
        allowed_types = qualifier.get(ALLOWED_TYPES)
        return cls(
            urn=urn,
            value_type=type_id(value.get("valueType") or ""),
            cardinality=value.get("cardinality") or "SINGLE",
            allowed_values=tuple(a["value"] for a in allowed) if allowed is not None else None,
            entity_types=frozenset(type_id(t) for t in value.get("entityTypes") or ()),
            allowed_types=frozenset(type_id(t) for t in allowed_types) if allowed_types is not None else None,
            immutable=bool(value.get("immutable")),
        )

    def problems(self, entity_type: str, values: Sequence[Mapping[str, Any]], path: str) -> Iterator[tuple[str, str]]:
        """What is wrong with `values` assigned to an entity of `entity_type`: (path of the field, message) pairs in
        DataHub's words; `path` is the assignment's."""
        if entity_type.lower() not in self.entity_types:
            allowed = ", ".join(sorted(self.entity_types)) or "none"
            yield (
                path,
                f"Property: {self.urn} cannot be applied to entity type {entity_type} (its definition allows: {allowed})",
            )
        if self.cardinality == "SINGLE" and len(values) > 1:
            shown = "[" + ", ".join(shown_value(v) for v in values) + "]"
            yield (
                f"{path}.values",
                f"Property: {self.urn} has cardinality 1, but multiple values were assigned: {shown}",
            )
        for i, value in enumerate(values):
            message = self.type_problem(value) or self.allowed_value_problem(value)
            if message is not None:
                yield f"{path}.values[{i}]", message

    def type_problem(self, value: Mapping[str, Any]) -> str | None:
        prefix = f"Property: {self.urn}, value: {shown_value(value)}"
        text = value.get("string")
        if self.value_type in STRING_TYPES:
            if text is None:
                return f"{prefix} should be a string"
            if self.value_type == "date" and not _is_date(text):
                return f"{prefix} should be a date with format YYYY-MM-DD"
            if self.value_type == "urn":
                try:
                    value_entity_type = parse_urn(text).entity_type
                except InvalidUrnError:
                    return f"{prefix} should be an urn"
                if self.allowed_types is not None and value_entity_type.lower() not in self.allowed_types:
                    return f"{prefix} is not of any supported urn types: {', '.join(sorted(self.allowed_types))}"
            return None
        if self.value_type == "number":
            if value.get("double") is None and (text is None or not _JAVA_DOUBLE.fullmatch(text.strip())):
                return f"{prefix} should be a number"
            return None
        return f"Validation support for type {self.value_type} is not yet implemented."

    def allowed_value_problem(self, value: Mapping[str, Any]) -> str | None:
        if self.allowed_values is None or value in self.allowed_values:
            return None
        allowed = ", ".join(shown_value(v) for v in self.allowed_values)
        return f"Property: {self.urn}, value: {shown_value(value)} should be one of [{allowed}]"

    def may_invalidate(self, stored_under: Definition) -> bool:
        """Whether a value valid under `stored_under` may be invalid under this definition (it is narrower)."""
        return (
            self.value_type != stored_under.value_type
            or (self.cardinality == "SINGLE" and stored_under.cardinality != "SINGLE")
            or not stored_under.entity_types <= self.entity_types
            or _narrower(self.allowed_values, stored_under.allowed_values)
            or _narrower(self.allowed_types, stored_under.allowed_types)
        )


def _narrower(new: Iterable[Any] | None, old: Iterable[Any] | None) -> bool:
    """A restriction (None: anything) that admits less than before."""
    if new is None:
        return False
    return old is None or any(o not in list(new) for o in old)


def _is_date(text: str) -> bool:
    if len(text) != 10 or not _DATE.fullmatch(text):
        return False
    try:
        return MIN_DATE <= date.fromisoformat(text) <= MAX_DATE
    except ValueError:
        return False


# --- what a write reads ----------------------------------------------------------------------------------------------
def _property_urns_in(document: Any) -> Iterator[str]:
    """The structured property URNs a patch document names, in its paths (JSON pointers) or its values."""
    if isinstance(document, str):
        for segment in document.split("/"):
            segment = segment.replace("~1", "/").replace("~0", "~")
            if segment.startswith(PROPERTY_URN_PREFIX):
                yield segment
    elif isinstance(document, dict):
        for item in document.values():
            yield from _property_urns_in(item)
    elif isinstance(document, (list, tuple)):
        for item in document:
            yield from _property_urns_in(item)


def assigned_urns(value: Mapping[str, Any] | None) -> list[str]:
    return [a["propertyUrn"] for a in (value or {}).get("properties", ())]


def definition_keys(proposals: Iterable[Proposal], rows: Mapping[Key, StoredAspect | None]) -> set[Key]:
    """The definition rows (`propertyDefinition` and `status` of each property) that `proposals` are checked
    against: the properties their values or patches name, and those of the values they replace (`rows`: the
    locked rows, for an immutable property's removal)."""
    urns: set[str] = set()
    for p in proposals:
        if p.aspect_name == STRUCTURED_PROPERTIES:
            urns.update(assigned_urns(p.value))
            if p.patch is not None:
                urns.update(_property_urns_in([op for op in p.patch.operations]))
            previous = rows.get((p.urn, p.aspect_name))
            if previous is not None:
                urns.update(assigned_urns(previous.value))
        elif p.aspect_name == PROPERTY_DEFINITION:
            urns.add(p.urn)
    return {
        (urn, aspect) for urn in urns if urn.startswith(PROPERTY_URN_PREFIX) for aspect in (PROPERTY_DEFINITION, STATUS)
    }


def _is_removed(rows: Mapping[Key, StoredAspect | None], property_urn: str) -> bool:
    status = rows.get((property_urn, STATUS))
    return status is not None and bool(status.value.get("removed"))


def _definition(rows: Mapping[Key, StoredAspect | None], property_urn: str) -> Definition | None:
    row = rows.get((property_urn, PROPERTY_DEFINITION))
    return Definition.of(property_urn, row.value) if row is not None else None


# --- the rules -------------------------------------------------------------------------------------------------------
class StructuredPropertyValues(PreCommitRule):
    """Each assignment of a `structuredProperties` write against its definition (DataHub's
    StructuredPropertiesValidator, plus the entity types the definition names); the first problem is the verdict,
    at the field it is about."""

    name = "StructuredPropertiesValidator"
    change_types = frozenset(
        {
            ChangeType.UPSERT,
            ChangeType.CREATE,
            ChangeType.CREATE_ENTITY,
            ChangeType.UPDATE,
            ChangeType.PATCH,
            ChangeType.DELETE,
        }
    )
    entity_aspects = ((ANY, STRUCTURED_PROPERTIES),)

    def check(self, change: PendingChange) -> Verdict | None:
        p = change.proposal
        assignments = (p.value or {}).get("properties", ()) if p.change_type is not ChangeType.DELETE else ()
        # A PATCH answers for what it adds (DataHub checks a patch's `add` operations only): the assignments it
        # leaves as they were are not checked again, so removing one value is never refused for another's sake
        # (a soft-deleted property's, or one whose definition is being deleted: app.write.structured_property_deletes).
        kept = (
            {a["propertyUrn"]: a.get("values") for a in change.previous.value.get("properties", ())}
            if p.change_type is ChangeType.PATCH and change.previous is not None
            else {}
        )
        seen: set[str] = set()
        for i, assignment in enumerate(assignments):
            urn, path = assignment["propertyUrn"], f"$.aspect.value.properties[{i}]"
            if urn in seen:
                return self._refuse(f"Property: {urn} has multiple entries", f"{path}.propertyUrn")
            seen.add(urn)
            if urn in kept and kept[urn] == assignment.get("values"):
                continue
            if not urn.startswith(PROPERTY_URN_PREFIX):
                return self._refuse(
                    f"Unexpected entity type. Expected: {PROPERTY_ENTITY} Found: {_entity_type(urn)}",
                    f"{path}.propertyUrn",
                )
            if _is_removed(change.rows, urn):
                return self._refuse(
                    f"Cannot apply a soft deleted Structured Property value: {urn}", f"{path}.propertyUrn"
                )
            definition = _definition(change.rows, urn)
            if definition is None:
                return self._refuse(
                    f"Unexpected null value found for {urn} Structured Property Definition.", f"{path}.propertyUrn"
                )
            for where, message in definition.problems(p.entity_type, assignment.get("values", ()), path):
                return self._refuse(message, where)
        return self._immutable_problem(change)

    def _immutable_problem(self, change: PendingChange) -> Verdict | None:
        """An immutable property's value, once set, is neither changed nor removed."""
        if change.previous is None:
            return None
        new = {a["propertyUrn"]: a for a in (change.proposal.value or {}).get("properties", ())}
        for old in change.previous.value.get("properties", ()):
            urn = old["propertyUrn"]
            definition = _definition(change.rows, urn)
            if definition is None or not definition.immutable:
                continue
            if urn not in new:
                return self._refuse(f"Cannot delete an immutable property {urn}", "$.aspect.value.properties")
            if new[urn].get("values") != old.get("values"):
                index = list(new).index(urn)
                return self._refuse(
                    f"Cannot mutate an immutable property: {urn}", f"$.aspect.value.properties[{index}].values"
                )
        return None

    def _refuse(self, message: str, path: str) -> Verdict:
        return self.verdict(VerdictKind.VALIDATION, message, path)


def _entity_type(urn: str) -> str:
    try:
        return entity_type_of(urn)
    except InvalidUrnError:
        return urn


def _is_version_bump(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """DataHub's allowBreakingWithVersion: a breaking change is allowed when `version` goes up."""
    old_version, new_version = old.get("version"), new.get("version")
    if new_version is None:
        return False
    return old_version is None or new_version.lower() > old_version.lower()


class PropertyDefinitionChange(PreCommitRule):
    """A `propertyDefinition` write (DataHub's PropertyDefinitionValidator): not on a soft-deleted property, a
    well-formed version and names, and against the previous definition: the value type, the qualified name and a
    MULTIPLE cardinality stay, and allowedValues only widen, unless `version` goes up (the qualified name stays
    whatever the version). Whether stored values still hold is checked once the transaction's rows are written
    (`StoredValueCheck`)."""

    name = "PropertyDefinitionValidator"
    change_types = frozenset(
        {ChangeType.UPSERT, ChangeType.CREATE, ChangeType.CREATE_ENTITY, ChangeType.UPDATE, ChangeType.PATCH}
    )
    entity_aspects = ((PROPERTY_ENTITY, PROPERTY_DEFINITION),)

    def check(self, change: PendingChange) -> Verdict | None:
        p = change.proposal
        new = p.value or {}
        if _is_removed(change.rows, p.urn):
            return self._refuse("Cannot mutate a soft deleted Structured Property Definition")
        version = new.get("version")
        if version is not None:
            if "." in version:
                return self._refuse(
                    f"Invalid version `{version}` cannot contain the `.` character.", "$.aspect.value.version"
                )
            if not _VERSION.fullmatch(version):
                return self._refuse(
                    f"Invalid version specified. Must match {_VERSION.pattern}", "$.aspect.value.version"
                )
        if " " in p.urn.removeprefix(PROPERTY_URN_PREFIX):
            return self._refuse("Urn ID cannot have spaces", "$.entityUrn")
        if " " in new.get("qualifiedName", ""):
            return self._refuse("Qualified names cannot have spaces", "$.aspect.value.qualifiedName")
        if new.get("valueType") is not None and type_id(new["valueType"]) not in VALUE_TYPES:
            return self._refuse(
                f"Validation support for type {new['valueType']} is not yet implemented.", "$.aspect.value.valueType"
            )
        allowed_types = (new.get("typeQualifier") or {}).get(ALLOWED_TYPES)
        if allowed_types is not None and any(not t.startswith(ENTITY_TYPE_URN_PREFIX) for t in allowed_types):
            return self._refuse(
                f"Provided allowedType that is not an entityType entity. List of allowedTypes: {allowed_types}",
                "$.aspect.value.typeQualifier.allowedTypes",
            )
        if change.previous is None:
            return None
        return self._change_problem(change.previous.value, new)

    def _change_problem(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> Verdict | None:
        breaking_allowed = _is_version_bump(old, new)
        if new.get("qualifiedName") != old.get("qualifiedName"):
            return self._refuse(
                "Cannot change the fully qualified name of a Structured Property", "$.aspect.value.qualifiedName"
            )
        if breaking_allowed:
            return None
        if new.get("valueType") != old.get("valueType"):
            return self._refuse(
                "Value type cannot be changed as this is a backwards incompatible change", "$.aspect.value.valueType"
            )
        if new.get("cardinality") == "SINGLE" and old.get("cardinality") == "MULTIPLE":
            return self._refuse(
                "Property definition cardinality cannot be changed from MULTI to SINGLE", "$.aspect.value.cardinality"
            )
        new_allowed, old_allowed = new.get("allowedValues"), old.get("allowedValues")
        if new_allowed is not None:
            kept = [a["value"] for a in new_allowed]
            if old_allowed is None or any(a["value"] not in kept for a in old_allowed):
                return self._refuse(
                    "Cannot restrict values that were previously allowed", "$.aspect.value.allowedValues"
                )
        return None

    def _refuse(self, message: str, path: str = "$.aspect.value") -> Verdict:
        return self.verdict(VerdictKind.VALIDATION, message, path)


async def refusals_before_queueing(
    repo: AspectRepository, proposals: Sequence[Proposal]
) -> list[tuple[Proposal, Verdict]]:
    """The verdicts of `StructuredPropertyValues` on the `structuredProperties` values of an asynchronous write, against
    the definitions and values stored now (read outside any transaction): DataHub's answer at proposal time, before
    the write is queued. The consumer's transaction checks them again against what it locks. Left to it: a PATCH
    (its value is known only once applied), a value of a property the batch itself defines or (un)deletes, and a
    later write of an entity's values in the batch (each is checked against the rows the batch left before it)."""
    rule = StructuredPropertyValues()
    defined_here = {p.urn for p in proposals if p.entity_type == PROPERTY_ENTITY}
    checked: list[Proposal] = []
    seen: set[Key] = set()
    for p in proposals:
        key = (p.urn, p.aspect_name)
        if (
            p.aspect_name == STRUCTURED_PROPERTIES
            and key not in seen
            and p.patch is None
            and rule.governs(p)
            and defined_here.isdisjoint(assigned_urns(p.value))
        ):
            checked.append(p)
        seen.add(key)
    if not checked:
        return []
    rows: dict[Key, StoredAspect | None] = dict(await repo.latest((p.urn, p.aspect_name) for p in checked))
    rows.update(await repo.latest(definition_keys(checked, rows)))
    refused = []
    for p in checked:
        verdict = rule.check(PendingChange(p, rows.get((p.urn, p.aspect_name)), True, rows))
        if verdict is not None:
            refused.append((p, verdict))
    return refused


# --- a definition change against the stored values -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoredValueCheck:
    """A definition change that may invalidate values already stored: checked once the transaction's rows are
    written. `index` is its proposal's, for the refusal's issue."""

    index: int
    definition: Definition


def stored_value_check(p: Proposal, previous: StoredAspect | None) -> StoredValueCheck | None:
    """The check a written definition needs: None when it only widens what its previous version allowed. A
    definition written where there was none is checked too: values may outlive a deleted definition."""
    if p.aspect_name != PROPERTY_DEFINITION or p.value is None:
        return None
    definition = Definition.of(p.urn, p.value)
    if previous is not None and not definition.may_invalidate(Definition.of(p.urn, previous.value)):
        return None
    return StoredValueCheck(p.index, definition)


# The entities holding a value of a property: row 0 of `structuredProperties`, found through the GIN index on the
# property URNs of each such row (migration 0012), in URN order from $2, a page at a time (the stored-value check;
# `holders`, which the removal of a deleted property's values pages through).
_HOLDERS = """
    SELECT urn, metadata FROM metadata_aspect_v2
    WHERE aspect = 'structuredProperties' AND version = 0
      AND structured_property_urns(metadata) @> ARRAY[$1::text]
      AND urn > $2
    ORDER BY urn
    LIMIT $3
"""


async def holders(repo: AspectRepository, property_urn: str, after: str, limit: int) -> list[str]:
    """The next `limit` entities after `after` (URN order) whose latest `structuredProperties` holds a value of
    `property_urn`."""
    conn = await repo._conn()
    return [r["urn"] for r in await conn.fetch(_HOLDERS, property_urn, after, limit)]


async def stored_value_violations(repo: AspectRepository, check: StoredValueCheck) -> list[str]:
    """The stored values `check.definition` would make invalid (at most MAX_REPORTED_VIOLATIONS), each as `<entity
    urn> <field>: <reason>`. Reads only the entities that hold a value of the property, through the index, a page
    of STORED_CHECK_PAGE rows at a time, and stops at the first page with a violation."""
    conn = await repo._conn()
    found: list[str] = []
    after = ""
    while not found:
        records = await conn.fetch(_HOLDERS, check.definition.urn, after, STORED_CHECK_PAGE)
        for urn, metadata in records:
            for i, assignment in enumerate(orjson.loads(metadata).get("properties", ())):
                if assignment.get("propertyUrn") != check.definition.urn:
                    continue
                problems = check.definition.problems(
                    entity_type_of(urn), assignment.get("values", ()), f"properties[{i}]"
                )
                found.extend(f"{urn} {where}: {message}" for where, message in problems)
        if len(records) < STORED_CHECK_PAGE:
            break
        after = records[-1]["urn"]
    return found[:MAX_REPORTED_VIOLATIONS]


# --- reads -----------------------------------------------------------------------------------------------------------
async def soft_deleted(repo: AspectRepository, property_urns: Iterable[str]) -> set[str]:
    """The properties among `property_urns` whose definition entity is soft-deleted (`status.removed`): what every
    read decides by (entity reads, searches). One query."""
    urns = set(property_urns)
    if not urns:
        return set()
    statuses = await repo.latest((urn, STATUS) for urn in urns)
    return {urn for (urn, _), status in statuses.items() if status.value.get("removed")}


async def hide_soft_deleted(repo: AspectRepository, rows: Iterable[StoredAspect]) -> dict[int, StoredAspect]:
    """DataHub's StructuredPropertiesSoftDelete read hook: for each `structuredProperties` row among `rows` holding
    a value of a property whose definition entity is soft-deleted, a copy without those values, by the position of
    the row in `rows`."""
    held = [(i, row) for i, row in enumerate(rows) if row.aspect == STRUCTURED_PROPERTIES]
    removed = await soft_deleted(repo, (urn for _, row in held for urn in assigned_urns(row.value)))
    if not removed:
        return {}
    hidden: dict[int, StoredAspect] = {}
    for i, row in held:
        kept = [a for a in row.value.get("properties", ()) if a["propertyUrn"] not in removed]
        if len(kept) != len(row.value.get("properties", ())):
            value = {**row.value, "properties": kept}
            hidden[i] = dataclasses.replace(row, metadata=orjson.dumps(value).decode(), _value=value)
    return hidden
