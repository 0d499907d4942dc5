"""The edits people make on an entity's page: its description, tags, glossary terms, owners and domain, and a
dataset field's description, tags and terms.

Each form is a POST of the signed-in session (PageWriter: a reader's is a 403; FormOfSession: the session's CSRF
token) that runs DataHub's curation mutation (app.graphql.curation: batchAddTags, batchRemoveTags, batchAddTerms,
batchRemoveTerms, batchAddOwners, batchRemoveOwners, batchSetDomain, updateDescription) in-process as the person
(app.web.catalog.graphql), so the write goes through the ingest gateway like any other: policies, processors,
validation, the change log naming the person, tracing. The mutation checks that what a form names exists (an unknown
tag is a 400 page saying so); then the browser is sent back to the page the form was on (303)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import RedirectResponse, Response

from app.api.deps import Session
from app.web.catalog import GraphQLRefused, graphql
from app.web.paths import SCHEMA, entity_url, tabs_of
from app.web.policy import FormOfSession, PageWriter, WebError
from app.web.render import page
from app.web.sessions import WebSession

router = APIRouter(include_in_schema=False)

DATASET_FIELD = "DATASET_FIELD"
MAX_NAME = 500  # a URN's length bound (app.urns)
OWNER_ENTITY_TYPES = {"corpuser": "CORP_USER", "corpGroup": "CORP_GROUP"}


def _mutation(name: str, input_type: str) -> str:
    return f"mutation web_{name}($input: {input_type}!) {{ {name}(input: $input) }}"


@dataclass(frozen=True, slots=True)
class Target:
    """What a form edits: an entity, or one of a dataset's fields; and the tab to go back to."""

    urn: str
    field_path: str | None
    tab: str

    @classmethod
    def of(cls, form: Mapping[str, str], default_tab: str) -> Target:
        urn, field_path = form.get("urn", ""), form.get("field") or None
        entity_type = urn.split(":", 3)[2] if urn.startswith("urn:li:") and urn.count(":") >= 3 else ""
        if entity_url(urn) is None:
            raise WebError(400, "This form names no entity the web view shows.")
        tab = form.get("tab", "")
        tabs = tabs_of(entity_type)
        return cls(urn, field_path, SCHEMA if field_path else tab if tab in tabs else default_tab)

    def resource(self) -> dict[str, Any]:
        """DataHub's ResourceRefInput."""
        if self.field_path is None:
            return {"resourceUrn": self.urn}
        return {"resourceUrn": self.urn, "subResourceType": DATASET_FIELD, "subResource": self.field_path}

    def back(self) -> str:
        """The page the form was on: a field's edit panel stays open on the Schema tab."""
        url = entity_url(self.urn, self.tab) or "/search"
        if self.field_path is None:
            return url
        return f"{url}?{urlencode({'field': self.field_path})}#field-edit"


def _named(form: Mapping[str, str], key: str, what: str) -> str:
    value = form.get(key, "").strip()
    if not value:
        raise WebError(400, f"Name a {what}: its name or URN.")
    if len(value) > MAX_NAME:
        raise WebError(400, f"A {what}'s name or URN has at most {MAX_NAME} characters.")
    return value


def as_urn(name: str, entity_type: str) -> str:
    """A URN as typed, or the URN of `entity_type` a bare name (its id) stands for: `pii` is urn:li:tag:pii."""
    return name if name.startswith("urn:") else f"urn:li:{entity_type}:{name}"


async def _run(
    request: Request,
    session: WebSession,
    db: AsyncSession,
    target: Target,
    mutation: str,
    variables: dict[str, Any],
) -> Response:
    """Run the mutation as the person and send the browser back; a refusal is a page saying why, with a way back."""
    try:
        await graphql(request, db, session.principal, mutation, {"input": variables})
    except GraphQLRefused as refused:
        return refusal(session, refused, target.back())
    return RedirectResponse(target.back(), status_code=303)


def refusal(session: WebSession, refused: GraphQLRefused, back: str) -> Response:
    status = refused.status if 400 <= refused.status < 500 else 503
    return page("message.html", session, status=status, title="Not saved", text=refused.message, link=("Back", back))


# --- descriptions


@router.post("/web/description")
async def edit_description(request: Request, session: PageWriter, form: FormOfSession, db: Session) -> Response:
    target = Target.of(form, "Documentation")
    update = {"description": form.get("description", ""), **target.resource()}
    return await _run(request, session, db, target, _mutation("updateDescription", "DescriptionUpdateInput"), update)


# --- tags and glossary terms: an entity's or a dataset field's


@dataclass(frozen=True, slots=True)
class Labels:
    """Tags or glossary terms: the form's field, their entity type and DataHub's batch mutations."""

    key: str
    what: str
    entity_type: str
    urns_key: str
    add: str
    remove: str


TAGS = Labels(
    "tag",
    "tag",
    "tag",
    "tagUrns",
    _mutation("batchAddTags", "BatchAddTagsInput"),
    _mutation("batchRemoveTags", "BatchRemoveTagsInput"),
)
TERMS = Labels(
    "term",
    "glossary term",
    "glossaryTerm",
    "termUrns",
    _mutation("batchAddTerms", "BatchAddTermsInput"),
    _mutation("batchRemoveTerms", "BatchRemoveTermsInput"),
)


def _operation(form: Mapping[str, str], *allowed: str) -> str:
    op = form.get("op", "")
    if op not in allowed:
        raise WebError(400, f"This form's operation is one of {', '.join(allowed)}.")
    return op


async def _edit_labels(
    request: Request, session: WebSession, form: Mapping[str, str], db: AsyncSession, labels: Labels
) -> Response:
    target = Target.of(form, "Documentation")
    op = _operation(form, "add", "remove")
    urn = as_urn(_named(form, labels.key, labels.what), labels.entity_type)
    variables = {labels.urns_key: [urn], "resources": [target.resource()]}
    return await _run(request, session, db, target, labels.add if op == "add" else labels.remove, variables)


@router.post("/web/tags")
async def edit_tags(request: Request, session: PageWriter, form: FormOfSession, db: Session) -> Response:
    return await _edit_labels(request, session, form, db, TAGS)


@router.post("/web/terms")
async def edit_terms(request: Request, session: PageWriter, form: FormOfSession, db: Session) -> Response:
    return await _edit_labels(request, session, form, db, TERMS)


# --- owners and the domain: an entity's


def _entity_target(form: Mapping[str, str]) -> Target:
    target = Target.of(form, "Documentation")
    if target.field_path is not None:
        raise WebError(400, "A field has no owners or domain of its own: edit the dataset's.")
    return target


@router.post("/web/owners")
async def edit_owners(request: Request, session: PageWriter, form: FormOfSession, db: Session) -> Response:
    target = _entity_target(form)
    op = _operation(form, "add", "remove")
    owner = as_urn(_named(form, "owner", "user or group"), "corpuser")
    kind = owner.split(":", 3)[2] if owner.count(":") >= 3 else ""
    if kind not in OWNER_ENTITY_TYPES:
        raise WebError(400, f"An owner is a user (urn:li:corpuser:…) or a group (urn:li:corpGroup:…), not {owner!r}.")
    ownership_type = form.get("type") or None
    if op == "add":
        if ownership_type is None:
            raise WebError(400, "Choose the ownership type of the owner to add.")
        owners = [{"ownerUrn": owner, "ownerEntityType": OWNER_ENTITY_TYPES[kind], "ownershipTypeUrn": ownership_type}]
        variables: dict[str, Any] = {"owners": owners, "resources": [target.resource()]}
        mutation = _mutation("batchAddOwners", "BatchAddOwnersInput")
    else:
        # of the one ownership type the removed entry had: the same person may own it as another type too
        variables = {"ownerUrns": [owner], "ownershipTypeUrn": ownership_type, "resources": [target.resource()]}
        mutation = _mutation("batchRemoveOwners", "BatchRemoveOwnersInput")
    return await _run(request, session, db, target, mutation, variables)


@router.post("/web/domain")
async def edit_domain(request: Request, session: PageWriter, form: FormOfSession, db: Session) -> Response:
    target = _entity_target(form)
    op = _operation(form, "set", "unset")
    domain = as_urn(_named(form, "domain", "domain"), "domain") if op == "set" else None
    variables = {"domainUrn": domain, "resources": [target.resource()]}
    return await _run(request, session, db, target, _mutation("batchSetDomain", "BatchSetDomainInput"), variables)
