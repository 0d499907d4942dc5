"""Writes of runtime models (aspects and entities of the runtime model set, app.modelset) inside a write
transaction: written under a share lock of the stored set's row, so that an apply sees them or they see the set it
stored (`refuse_writes_past_the_models`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from app.errors import Issue, ServiceUnavailable, ValidationFailed
from app.registry import AspectValidationError, EntityRegistry, RegistryError
from app.registry.runtime import MODELS_ASPECT
from app.write.decision import ItemResult, ItemStatus
from app.write.repository import AspectRepository
from app.write.rules import MODELS_URN


async def refuse_writes_past_the_models(
    repo: AspectRepository, registry: EntityRegistry, items: Iterable[ItemResult]
) -> None:
    """Inside a write transaction, after its verdicts: the values it writes of runtime models (an aspect or entity
    that is not a base one, or no longer in the registry) are written under a share lock of the stored set's row, so
    an apply (which locks it for update through its checks against stored data and its commit) sees them, or they
    see the set it stored. This process's registry must hold the set stored (one that has not taken a newer set up
    yet: a 503, retried once its watcher has) and the values must pass it (a value checked against the set before
    it changed: refused naming it). A registry that never took a set up (generation 0) holds the base models only,
    as it did when the write was checked: the write holds no value of a runtime model, nothing to look up."""
    if not registry.generation:
        return
    runtime = [item for item in _written(items) if _of_runtime_models(registry, item)]
    if not runtime:
        return
    locked = (await repo.latest([(MODELS_URN, MODELS_ASPECT)], for_share=True)).get((MODELS_URN, MODELS_ASPECT))
    stored = locked.version if locked is not None else 0
    if stored != registry.runtime_version:
        raise ServiceUnavailable(
            f"the runtime model set changed (version {stored} is stored, this process holds version "
            f"{registry.runtime_version}); nothing was written, retry"
        )
    issues = []
    for item in runtime:
        try:
            registry.aspect(item.entity_type, item.aspect).validate(item.value)
        except RegistryError as error:
            issues.append(Issue(f"{error} (the runtime model set changed)", item.index, item.urn, item.aspect))
        except AspectValidationError as error:
            issues.extend(
                Issue(f"{i.message} (the runtime model set changed)", item.index, item.urn, item.aspect, i.path)
                for i in error.issues
            )
    if issues:
        raise ValidationFailed(
            f"{len(issues)} values do not pass the runtime model set stored since they were "
            "checked; nothing was written",
            issues,
        )


_WRITTEN = frozenset({ItemStatus.CREATED, ItemStatus.UPDATED, ItemStatus.APPENDED})


def _written(items: Iterable[ItemResult]) -> Iterator[ItemResult]:
    for item in items:
        if item.status in _WRITTEN:
            yield item
        yield from _written(item.emitted or ())


def _of_runtime_models(registry: EntityRegistry, item: ItemResult) -> bool:
    entity = registry.entities.get(item.entity_type)
    return (
        entity is None
        or registry.is_runtime(entity.key_aspect)
        or item.aspect not in registry.aspects
        or registry.is_runtime(item.aspect)
    )
