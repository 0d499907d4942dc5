"""Example change processors for metaledger (the contract: app.write.processors).

- IgnoreDisallowedWords (before): the RFC's own example. An update of a dataset's properties that brings in a
  disallowed string (config `words`, comma-separated) the previous value did not have is ignored: dropped, not an
  error. A value that already had it may keep it.
- ProdDatasetsNeedAnOwner (before): a validator. A PROD dataset's ownership may not be left without an owner.
- LowercaseTags (before): a mutator. Tag URNs are lower-cased; the result is validated against the schema again.
- DeprecatedDatasetsGetATag (after): a side effect. A dataset marked deprecated gets the tag `urn:li:tag:deprecated`
  (a PATCH, so the dataset's other tags stay), once per change log.
"""

from __future__ import annotations

import orjson

from app.write.processors import (
    Accept,
    ChangeProcessor,
    EmittedProposal,
    Ignore,
    Mutate,
    Phase,
    ProposedChange,
    Reject,
    Scope,
)

DEPRECATED_TAG = "urn:li:tag:deprecated"


class IgnoreDisallowedWords(ChangeProcessor):
    name = "ignore-disallowed-words"
    scope = Scope(
        entity_types=("dataset",),
        aspects=("datasetProperties", "editableDatasetProperties"),
        change_types=("UPSERT", "PATCH", "UPDATE"),
    )

    def __init__(self, config=None) -> None:
        super().__init__(config)
        # configuration is parsed once, when the pipeline is loaded, not per change
        self.words = [w.strip().lower() for w in self.config.get("words", "confidential").split(",") if w.strip()]

    def process(self, change: ProposedChange):
        proposed = orjson.dumps(change.proposed).decode().lower()
        if not any(word in proposed for word in self.words):
            return Accept()
        previous = orjson.dumps(change.previous).decode().lower()
        for word in self.words:
            if word in proposed and word not in previous:
                return Ignore(f"the update brings in the disallowed word {word!r}")
        return Accept()


class ProdDatasetsNeedAnOwner(ChangeProcessor):
    name = "prod-datasets-need-an-owner"
    scope = Scope(entity_types=("dataset",), aspects=("ownership",))

    def process(self, change: ProposedChange):
        if not change.urn.endswith(",PROD)"):
            return Accept()
        if change.change_type == "DELETE" or not (change.proposed or {}).get("owners"):
            return Reject("a dataset in PROD needs an owner: its ownership cannot be left empty")
        return Accept()


class LowercaseTags(ChangeProcessor):
    name = "lowercase-tags"
    scope = Scope(aspects=("globalTags",), change_types=("UPSERT", "CREATE", "PATCH", "UPDATE"))

    def process(self, change: ProposedChange):
        tags = (change.proposed or {}).get("tags") or []
        lowered = [{**t, "tag": t["tag"].lower()} for t in tags]
        return Accept() if lowered == tags else Mutate({**change.proposed, "tags": lowered})


class DeprecatedDatasetsGetATag(ChangeProcessor):
    name = "deprecated-datasets-get-a-tag"
    phase = Phase.AFTER
    scope = Scope(
        entity_types=("dataset",), aspects=("deprecation",), change_types=("UPSERT", "CREATE", "PATCH", "UPDATE")
    )

    def process(self, change: ProposedChange):
        was = bool((change.previous or {}).get("deprecated"))
        if not (change.proposed or {}).get("deprecated") or was:
            return Accept()
        patch = [{"op": "add", "path": f"/tags/{DEPRECATED_TAG}", "value": {"tag": DEPRECATED_TAG}}]
        return Accept(emit=[EmittedProposal(change.urn, "dataset", "globalTags", patch, "PATCH")])
