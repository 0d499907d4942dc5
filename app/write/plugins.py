"""User plugins, configured in entity_registry.yml's `plugins:` section in DataHub's format:

    plugins:
      aspectPayloadValidators:        # ProposalRule (before the transaction) or PreCommitRule (inside it) subclasses
        - className: mypackage.rules.NoPiiInDescriptions
          enabled: true
          supportedOperations: [UPSERT, CREATE]
          supportedEntityAspectNames: [{entityName: dataset, aspectName: datasetProperties}]
      mutationHooks:                  # ProposalRule subclasses that change the proposal in place; the result
        - className: mypackage.rules.LowercaseTags   # is validated against the schema again

`className` is a Python dotted path. A later entry with `enabled: false` and the same className disables an
earlier one. Configured operations and entity/aspect pairs override the class's own.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from app.write.processors import Pipeline, PipelineStep
from app.write.proposal import ChangeType
from app.write.rules import PreCommitRule, ProposalRule, RuleChain

PLUGIN_SECTIONS = ("aspectPayloadValidators", "mutationHooks")


class PluginConfigError(ValueError):
    pass


def _instantiate(entry: dict[str, Any], section: str) -> ProposalRule | PreCommitRule:
    class_name = entry.get("className")
    if not isinstance(class_name, str) or "." not in class_name:
        raise PluginConfigError(f"plugins.{section}: className must be a dotted Python path, got {class_name!r}")
    module_name, _, attr = class_name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise PluginConfigError(f"plugins.{section}: cannot load {class_name}: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, (ProposalRule, PreCommitRule))):
        raise PluginConfigError(f"plugins.{section}: {class_name} is not a ProposalRule or PreCommitRule subclass")
    rule = cls()
    if entry.get("supportedOperations"):
        rule.change_types = frozenset(ChangeType(op.upper()) for op in entry["supportedOperations"])
    if entry.get("supportedEntityAspectNames"):
        rule.entity_aspects = tuple((p["entityName"], p["aspectName"]) for p in entry["supportedEntityAspectNames"])
    return rule


def load_rule_chain(registry_path: Path) -> RuleChain:
    config = yaml.safe_load(registry_path.read_text()) if registry_path.exists() else {}
    plugins = (config or {}).get("plugins") or {}
    chain = RuleChain()
    for section in PLUGIN_SECTIONS:
        entries = plugins.get(section) or []
        disabled = {e.get("className") for e in entries if e.get("enabled") is False}
        for entry in entries:
            if entry.get("enabled") is False or entry.get("className") in disabled:
                continue
            rule = _instantiate(entry, section)
            if section == "mutationHooks":
                if not isinstance(rule, ProposalRule):
                    raise PluginConfigError(f"plugins.mutationHooks: {entry['className']} must be a ProposalRule")
                chain.mutators.append(rule)
            elif isinstance(rule, ProposalRule):
                chain.validators.append(rule)
            else:
                chain.pre_commit_rules.append(rule)
    return chain


def load_pipeline(registry_path: Path) -> Pipeline:
    """The initial change-processor pipeline: entity_registry.yml's `changeProcessors:` list of
    `{name, enabled, required, scope, config}` (app.write.processors)."""
    config = yaml.safe_load(registry_path.read_text()) if registry_path.exists() else {}
    steps = (config or {}).get("changeProcessors") or []
    if not isinstance(steps, list):
        raise PluginConfigError("changeProcessors must be a list of {name, enabled, required, scope, config}")
    return Pipeline([PipelineStep.from_json(step) for step in steps])
