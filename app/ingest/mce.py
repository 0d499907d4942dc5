"""Legacy MetadataChangeEvents: a snapshot of one entity with a list of aspects, unbundled into proposals.

An MCE (DataHub's `MetadataChangeEvent.pdl`, topic `MetadataChangeEvent_v4`, Rest.li `POST /entities?action=ingest`):

    {"proposedSnapshot": {"com.linkedin.metadata.snapshot.DatasetSnapshot": {
        "urn": "urn:li:dataset:(...)",
        "aspects": [{"com.linkedin.common.Status": {"removed": false}}, ...]}},
     "systemMetadata": {...}?}

Each aspect becomes one UPSERT draft: the aspect's Pegasus record name gives its aspect name through the registry,
the snapshot's URN gives the entity (the snapshot class must be `<entity>Snapshot` of the URN's entity type). The
`com.linkedin.pegasus2avro.` spelling of the Avro-generated classes is accepted everywhere, including in union
member keys inside aspect values. Pure: no I/O; errors are `ValidationFailed` with a JSON path per problem, and
each draft's `location` puts the write pipeline's issues at its aspect in the event.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from app.errors import Issue, Location, ValidationFailed
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.urns import InvalidUrnError, entity_type_of
from app.write.proposal import JSON_CONTENT_TYPE, ChangeType, Draft

SNAPSHOT_NAMESPACE = "com.linkedin.metadata.snapshot."
AVRO_PREFIX = "com.linkedin.pegasus2avro."
PEGASUS_PREFIX = "com.linkedin."

_BY_RECORD: weakref.WeakKeyDictionary[EntityRegistry, dict[str, str]] = weakref.WeakKeyDictionary()


def canonical_class(name: str) -> str:
    """`com.linkedin.pegasus2avro.common.Status` → `com.linkedin.common.Status` (Pegasus names are canonical)."""
    return PEGASUS_PREFIX + name[len(AVRO_PREFIX) :] if name.startswith(AVRO_PREFIX) else name


def aspect_names_by_record(registry: EntityRegistry) -> dict[str, str]:
    """Pegasus record name → aspect name, built once per registry."""
    by_record = _BY_RECORD.get(registry)
    if by_record is None:
        by_record = {spec.record_name: name for name, spec in registry.aspects.items()}
        _BY_RECORD[registry] = by_record
    return by_record


def _canonical_unions(value: Any) -> Any:
    """Rename Avro-spelled union members (`{"com.linkedin.pegasus2avro.schema.StringType": {}}`) to Pegasus names,
    as DataHub's Python client does before sending (`pre_json_transform`). Only single-key objects are touched."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if isinstance(key, str) and key.startswith(AVRO_PREFIX):
                return {canonical_class(key): _canonical_unions(inner)}
        return {k: _canonical_unions(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical_unions(v) for v in value]
    return value


def _key_path(parent: str, key: str) -> str:
    return f'{parent}["{key}"]'


@dataclass(slots=True)
class UnbundledEvent:
    """An MCE's snapshot as drafts, each located at its aspect in the event."""

    urn: str | None
    entity_type: str | None
    snapshot_class: str | None
    drafts: list[Draft] = field(default_factory=list)


def unbundle_snapshot(
    union: Any,
    registry: EntityRegistry,
    *,
    system_metadata: dict[str, Any] | None = None,
    path: str = "$.proposedSnapshot",
    first_index: int = 0,
) -> UnbundledEvent:
    """A snapshot union `{"com.linkedin.metadata.snapshot.<Entity>Snapshot": {"urn", "aspects"}}` → drafts.
    Raises ValidationFailed listing every problem (issue `index` = the aspect's position in the snapshot)."""

    def fail(message: str, where: str, index: int | None = None, **kw: Any) -> ValidationFailed:
        return ValidationFailed(message, [Issue(message, index, path=where, **kw)])

    if not isinstance(union, dict) or len(union) != 1:
        raise fail(
            "a snapshot must be an object with exactly one member: the snapshot class",
            path,
            expected=f'{{"{SNAPSHOT_NAMESPACE}<Entity>Snapshot": {{urn, aspects}}}}',
        )
    ((raw_class, snapshot),) = union.items()
    snapshot_path = _key_path(path, raw_class)
    snapshot_class = canonical_class(raw_class)
    short = snapshot_class[len(SNAPSHOT_NAMESPACE) :] if snapshot_class.startswith(SNAPSHOT_NAMESPACE) else None
    if not short or not short.endswith("Snapshot") or "." in short:
        raise fail(
            f"unknown snapshot class {raw_class!r}: expected {SNAPSHOT_NAMESPACE}<Entity>Snapshot",
            path,
            found=raw_class,
        )
    if not isinstance(snapshot, dict):
        raise fail("a snapshot must be an object {urn, aspects}", snapshot_path)
    unknown = set(snapshot) - {"urn", "aspects"}
    if unknown:
        raise fail(f"unknown snapshot field(s) {sorted(unknown)}", snapshot_path)

    if not registry.has_entity(short[: -len("Snapshot")]):
        raise fail(
            f"unknown snapshot class {raw_class!r}: no entity {short[: -len('Snapshot')]!r} in the registry",
            path,
            found=raw_class,
        )

    urn = snapshot.get("urn")
    if not isinstance(urn, str):
        raise fail("the snapshot has no `urn`", f"{snapshot_path}.urn")
    try:
        entity = registry.entity(entity_type_of(urn))
    except (InvalidUrnError, RegistryError) as error:
        raise fail(f"invalid snapshot urn {urn!r}: {error}", f"{snapshot_path}.urn", found=urn) from None
    expected_class = f"{entity.name}Snapshot"
    if short.lower() != expected_class.lower():
        raise fail(
            f"snapshot class {raw_class!r} does not match the URN's entity type {entity.name!r}",
            path,
            expected=f"{SNAPSHOT_NAMESPACE}{expected_class[0].upper()}{expected_class[1:]} (case-insensitive)",
            found=raw_class,
        )

    aspects = snapshot.get("aspects")
    aspects_path = f"{snapshot_path}.aspects"
    if not isinstance(aspects, list):
        raise fail('the snapshot\'s `aspects` must be an array of {"<aspect class>": {...}}', aspects_path)
    if not aspects:
        raise fail("the snapshot has no aspects", aspects_path)

    by_record = aspect_names_by_record(registry)
    out = UnbundledEvent(urn, entity.name, snapshot_class)
    issues: list[Issue] = []
    for position, member in enumerate(aspects):
        member_path = f"{aspects_path}[{position}]"
        if not isinstance(member, dict) or len(member) != 1:
            issues.append(Issue('an aspect must be {"<Pegasus class>": {...}}', position, urn, path=member_path))
            continue
        ((raw_record, value),) = member.items()
        record = canonical_class(raw_record)
        aspect_name = by_record.get(record)
        if aspect_name is None:
            issues.append(
                Issue(f"unknown aspect class {raw_record!r}", position, urn, path=member_path, found=raw_record)
            )
            continue
        if aspect_name not in entity.aspect_names:
            issues.append(
                Issue(
                    f"aspect {aspect_name!r} ({record}) is not an aspect of entity {entity.name!r}",
                    position,
                    urn,
                    aspect_name,
                    member_path,
                    found=raw_record,
                )
            )
            continue
        aspect_path = _key_path(member_path, raw_record)
        out.drafts.append(
            Draft(
                index=first_index + len(out.drafts),
                entity_type=entity.name,
                aspect_name=aspect_name,
                change_type=ChangeType.UPSERT.value,
                urn=urn,
                value=_canonical_unions(value),
                content_type=JSON_CONTENT_TYPE,
                system_metadata=dict(system_metadata) if system_metadata else None,
                location=Location(
                    position, aspect_path, value=aspect_path, urn=f"{snapshot_path}.urn", fields=aspect_path
                ),
            )
        )
    if issues:
        raise ValidationFailed(
            f"{len(issues)} of the snapshot's {len(aspects)} aspects are invalid; nothing was written", issues
        )
    return out


def _system_metadata(raw: Any, path: str) -> dict[str, Any] | None:
    if raw is None or isinstance(raw, dict):
        return raw
    raise ValidationFailed("systemMetadata must be an object", [Issue("systemMetadata must be an object", path=path)])


def unbundle_mce(mce: Any, registry: EntityRegistry, *, first_index: int = 0) -> UnbundledEvent:
    """A MetadataChangeEvent `{proposedSnapshot, systemMetadata?, auditHeader?}` → drafts."""
    if not isinstance(mce, dict):
        raise ValidationFailed("a MetadataChangeEvent must be a JSON object", [Issue("expected an object", path="$")])
    if mce.get("proposedDelta") is not None:
        raise ValidationFailed(
            "proposedDelta is not supported (DataHub never implemented it)",
            [Issue("proposedDelta is not supported", path="$.proposedDelta")],
        )
    unknown = set(mce) - {"proposedSnapshot", "proposedDelta", "systemMetadata", "auditHeader"}
    if unknown:
        raise ValidationFailed(
            "unknown field", [Issue(f"unknown MetadataChangeEvent field(s) {sorted(unknown)}", path="$")]
        )
    if "proposedSnapshot" not in mce:
        raise ValidationFailed(
            "the event has no proposedSnapshot", [Issue("missing proposedSnapshot", path="$.proposedSnapshot")]
        )
    return unbundle_snapshot(
        mce["proposedSnapshot"],
        registry,
        system_metadata=_system_metadata(mce.get("systemMetadata"), "$.systemMetadata"),
        path="$.proposedSnapshot",
        first_index=first_index,
    )


def unbundle_restli_entity(body: Any, registry: EntityRegistry) -> UnbundledEvent:
    """The body of Rest.li `POST /entities?action=ingest` as DataHub's client sends it:
    `{"entity": {"value": {<Snapshot union>}}, "systemMetadata"?}`."""
    if not isinstance(body, dict):
        raise ValidationFailed(
            "the body must be a JSON object {entity: {value: {...}}}", [Issue("expected an object", path="$")]
        )
    unknown = set(body) - {"entity", "systemMetadata"}
    if unknown:
        raise ValidationFailed("unknown field", [Issue(f"unknown field(s) {sorted(unknown)}", path="$")])
    entity = body.get("entity")
    if not isinstance(entity, dict) or set(entity) != {"value"}:
        raise ValidationFailed(
            'the body must be {"entity": {"value": {"<snapshot class>": {urn, aspects}}}, "systemMetadata"?}',
            [Issue("expected {value: <snapshot>}", path="$.entity")],
        )
    return unbundle_snapshot(
        entity["value"],
        registry,
        system_metadata=_system_metadata(body.get("systemMetadata"), "$.systemMetadata"),
        path="$.entity.value",
    )
