"""Example user plugins for the registry's `plugins:` section (tests/integration/test_plugins.py names them by dotted
path, `tests.plugins.<Class>`)."""

from __future__ import annotations

from app.write.rules import PendingChange, PreCommitRule, ProposalRule, Verdict, VerdictKind


class RejectTodoDescriptions(ProposalRule):
    name = "RejectTodoDescriptions"

    def apply(self, proposal):
        if "TODO" in (proposal.value or {}).get("description", ""):
            return self.verdict(VerdictKind.VALIDATION, "descriptions may not contain TODO")
        return None


class StampReviewer(ProposalRule):
    name = "StampReviewer"

    def apply(self, proposal):
        proposal.value["customProperties"]["reviewed_by"] = "plugin"
        return None


class FrozenDatasets(PreCommitRule):
    name = "FrozenDatasets"

    def check(self, change: PendingChange) -> Verdict | None:
        if change.previous is not None and change.previous.value.get("customProperties", {}).get("frozen") == "true":
            return self.verdict(VerdictKind.PRECONDITION, "the dataset is frozen")
        return None


class BreakTheSchema(ProposalRule):
    name = "BreakTheSchema"

    def apply(self, proposal):
        proposal.value["customProperties"] = "not a map"
        return None
