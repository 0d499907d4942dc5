"""Entity registry and aspect payload validation (pure Python, no database).

The registry file
-----------------
``entity_registry.yml`` (``Settings.registry_path``) uses DataHub's format (``entities``, ``events``,
``plugins``) plus a ``modelSources`` list naming where aspect schemas come from::

    modelSources:
      - package: acryl-datahub      # the .avsc files inside the installed distribution (datahub/metadata/schemas)
      - path: ./models              # a folder of user .avsc files, relative to the yml
    entities:
      - name: dataset               # known entity: the listed aspects are added to it
        aspects: [myAspect]
      - name: myThing               # new entity: keyAspect required
        keyAspect: myThingKey
        aspects: [status]

Every .avsc record with an ``"Aspect": {"name": ..., "type": "timeseries"?}`` annotation defines an aspect; a
key aspect (``keyForEntity``, ``entityCategory``, ``entityAspects``, ``entityDoc``) defines an entity. Other
.avsc files only provide named types; user files may reference DataHub's named types by full name
(``com.linkedin.common.AuditStamp`` or the ``pegasus2avro`` form). Without ``modelSources`` the package source
is used.

Public API
----------
``load_registry(path, *, trim_unknown_fields=False, strict_urns=True) -> EntityRegistry``
    Raises ``RegistryConfigError`` (with ``.problems``) if the yml or the schemas are inconsistent.
``check_registry(path) -> RegistryCheck(ok: bool, report: str)``
    For ``metaledger registry check``: ``ok, report = check_registry(path)``. The report (also ``str(result)``)
    starts with ``OK: ...`` or ``FAILED (n problems): ...``, then counts, load / compile times (every validator
    is compiled), problems and warnings. Never raises for registry problems.

``EntityRegistry``
    ``entities: dict[str, EntitySpec]``, ``aspects: dict[str, AspectSpec]``,
    ``entity(name) -> EntitySpec`` (case-insensitive; ``UnknownEntityError``),
    ``aspect(entity, aspect) -> AspectSpec`` (``UnknownEntityError`` / ``UnknownAspectError`` /
    ``AspectNotAllowedError``, a subclass of ``UnknownAspectError``), ``aspect_spec(aspect)``,
    ``key_aspect(entity)``, ``validate(entity, aspect, value) -> dict``,
    ``urn_to_key(entity, urn) -> dict``, ``key_to_urn(entity, key) -> str`` (``UrnKeyError``),
    ``counts() -> {"entities", "aspects", "timeseries", "key_aspects", "entity_aspect_pairs"}``,
    ``timeseries_aspects``, ``compile_all() -> seconds``, ``warnings``, ``config`` (the raw yml).
``EntitySpec``
    ``name, key_aspect, aspect_names: frozenset (includes the key aspect), category, doc,
    aspects_in_order, extra`` (other yml keys such as ``searchGroup``).
``AspectSpec``
    ``name, record_name`` (Pegasus full name, ``com.linkedin.common.GlobalTags``), ``is_timeseries, is_key,
    key_for, schema`` (raw .avsc JSON), ``annotation`` (raw ``Aspect`` annotation), ``schema_version``,
    ``field_annotations`` (``FieldAnnotation(path="/fields/*/globalTags/tags/*/tag", field, record,
    annotations={"Searchable": ..., "Relationship": ..., "Urn": ..., ...})``), ``type`` (parsed schema),
    ``validate(value) -> dict`` (normalized copy, or ``AspectValidationError``), ``validator(...)``.

Errors (``app.registry.errors``): all subclass ``RegistryError``. ``UrnKeyError`` for URN/key mismatches;
``KeyValidationError`` (both an ``UrnKeyError`` and an ``AspectValidationError``) when a key value breaks its key
schema. ``AspectValidationError.issues`` is a list of
``FieldIssue(path, message, expected, found)`` with JSON paths such as ``$.fields[3].type.type``; at most 50 are
collected (``truncated`` says so).

Wire form validated (Pegasus JSON)
----------------------------------
* optional fields (Avro ``["null", T]``): the plain value, absent, or JSON null (dropped from the output);
* other unions: ``{"<member key>": value}`` with exactly one key; member keys are full names without
  ``pegasus2avro.`` (``com.linkedin.schema.StringType``), or ``string``/``double``/``array``/... for unnamed
  members. Single-member unions (``ChartInfo.inputs`` items) and optional multi-branch unions are wrapped too;
* unions with aliases (``Cost.cost``): ``{"costCode": "..."}``;
* absent fields with a non-null default get the default; int/long must be JSON integers in range; float/double
  accept integers and come out as floats; maps come out sorted by key; unknown fields are issues unless
  ``trim_unknown_fields``; URN-typed fields (``Urn`` annotation or a ``java.class`` ending in ``Urn``) must be
  valid URNs (``app.urns.validate_urn``) and, for typed URNs (``DatasetUrn``, ``CorpuserUrn``, ...), of that
  entity type.
"""

from app.registry.errors import (
    AspectNotAllowedError,
    AspectValidationError,
    FieldIssue,
    KeyValidationError,
    RegistryConfigError,
    RegistryError,
    UnknownAspectError,
    UnknownEntityError,
    UrnKeyError,
)
from app.registry.registry import (
    AspectSpec,
    EntityRegistry,
    EntitySpec,
    FieldAnnotation,
    RegistryCheck,
    check_registry,
    load_registry,
)

__all__ = [
    "AspectNotAllowedError",
    "AspectSpec",
    "AspectValidationError",
    "EntityRegistry",
    "EntitySpec",
    "FieldAnnotation",
    "FieldIssue",
    "KeyValidationError",
    "RegistryCheck",
    "RegistryConfigError",
    "RegistryError",
    "UnknownAspectError",
    "UnknownEntityError",
    "UrnKeyError",
    "check_registry",
    "load_registry",
]
