"""Example change processors (metaledger's app.write.processors contract).

- IgnoreDisallowedWords: the RFC's own example: an update that brings in a disallowed string (config `words`) that the
  previous value did not have is ignored (dropped, not an error).
- ProdDatasetsNeedAnOwner: a validator: a PROD dataset's properties are refused until the dataset has an owner
  (config `owners_aspect`, default ownership; here checked on the proposed value's customProperties.owner for brevity).
- LowercaseTags: a mutator: tag URNs lower-cased.
- DeprecatedDatasetsGetATag: an `after` side effect: a dataset marked deprecated gets the tag urn:li:tag:deprecated.
"""

from __future__ import annotations

from app.write.processors import (
    Accept,
    Change,
    ChangeProcessor,
    EmittedProposal,
    Ignore,
    Mutate,
    Phase,
    Reject,
    Scope,
)


class IgnoreDisallowedWords(ChangeProcessor):
    name = "ignore-disallowed-words"
    scope = Scope(aspects=("datasetProperties", "editableDatasetProperties"), change_types=("UPSERT", "PATCH"))

    def process(self, change: Change):
        words = [w.lower() for w in self.config.get("words", ["confidential"])]
        now, before = str(change.proposed).lower(), str(change.previous or "").lower()
        for word in words:
            if word in now and word not in before:
                return Ignore(f"the update brings in the disallowed word {word!r}")
        return Accept()


class ProdDatasetsNeedAnOwner(ChangeProcessor):
    name = "prod-datasets-need-an-owner"
    scope = Scope(entity_types=("dataset",), aspects=("datasetProperties",))

    def process(self, change: Change):
        if not change.urn.endswith(",PROD)"):
            return Accept()
        owner = ((change.proposed or {}).get("customProperties") or {}).get("owner")
        return Accept() if owner else Reject("datasets in PROD need an owner (customProperties.owner)")


class LowercaseTags(ChangeProcessor):
    name = "lowercase-tags"
    scope = Scope(aspects=("globalTags",))

    def process(self, change: Change):
        tags = (change.proposed or {}).get("tags") or []
        lowered = [{**t, "tag": t["tag"].lower()} for t in tags]
        return Accept() if lowered == tags else Mutate({**change.proposed, "tags": lowered})


class DeprecatedDatasetsGetATag(ChangeProcessor):
    name = "deprecated-datasets-get-a-tag"
    phase = Phase.AFTER
    scope = Scope(entity_types=("dataset",), aspects=("deprecation",))

    def process(self, change: Change):
        if not (change.proposed or {}).get("deprecated"):
            return Accept()
        return Accept(emit=[EmittedProposal(change.urn, "dataset", "globalTags",
                                            {"tags": [{"tag": "urn:li:tag:deprecated"}]}, "UPSERT")])
