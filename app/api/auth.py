"""Token and write-scope management over HTTP (admins only), and for any authenticated caller `whoami` and the
explain answer about itself. The same operations as `metaledger token …` and `metaledger policy …`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import ALLOW_MANAGE_POLICIES, ALLOW_MANAGE_TOKENS, ALLOW_READ, Auth, Caller, JsonBody
from app.api.http import Flag, json_response
from app.auth.model import Role, parse_ttl
from app.auth.privileges import KNOWN_PRIVILEGES
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed

Raw = TypeVar("Raw", str, str | None)
T = TypeVar("T")

router = APIRouter(prefix="/openapi/v1/auth", tags=["auth"], responses=ERROR_RESPONSES)
authz_router = APIRouter(prefix="/openapi/v1/authz", tags=["auth"], responses=ERROR_RESPONSES)


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    actor: str = Field(max_length=500, examples=["urn:li:corpuser:alice"])
    role: str = Field(examples=["writer"], description="reader, writer or admin")
    ttl: str | None = Field(None, max_length=20, description='"90d", "12h", "30m", "3600s" or "never"; default 90d')
    description: str | None = Field(None, max_length=1000)


class PolicyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    actor: str = Field(max_length=500, examples=["urn:li:corpuser:tagger"])
    entityTypes: list[str] | None = Field(None, max_length=1000, description="absent: every entity type")
    aspects: list[str] | None = Field(None, max_length=1000, description="absent: every aspect")
    description: str | None = Field(None, max_length=1000)


def _checked(field: str, parse: Callable[[Raw], T], raw: Raw) -> T:
    try:
        return parse(raw)
    except ValueError as error:
        raise ValidationFailed(str(error), [Issue(str(error), path=f"$.{field}", found=str(raw)[:100])]) from None


@router.get("/me", dependencies=[ALLOW_READ], summary="The caller: actor, role, token id")
async def whoami(caller: Caller) -> Any:
    return json_response(caller.to_json())


@router.post("/tokens", dependencies=[ALLOW_MANAGE_TOKENS], status_code=201, summary="Issue a token (shown once)")
async def create_token(
    body: Annotated[TokenRequest, Depends(JsonBody(TokenRequest))], auth: Auth, caller: Caller
) -> Any:
    role = _checked("role", Role.parse, body.role)
    _checked("ttl", parse_ttl, body.ttl)
    issued = await auth.create_token(
        body.actor, role, ttl=body.ttl, description=body.description, created_by=caller.actor
    )
    assert issued is not None
    token, info = issued
    return json_response({"token": token, **info.to_json()}, 201)


@router.get("/tokens", dependencies=[ALLOW_MANAGE_TOKENS], summary="Issued tokens (never the tokens themselves)")
async def list_tokens(
    auth: Auth,
    actor: Annotated[str | None, Query(max_length=500)] = None,
    include_inactive: Annotated[Flag, Query(alias="includeInactive")] = False,
) -> Any:
    return json_response({"tokens": [t.to_json() for t in await auth.tokens(actor, include_inactive)]})


@router.delete("/tokens/{token_id}", dependencies=[ALLOW_MANAGE_TOKENS], summary="Revoke a token")
async def revoke_token(token_id: str, auth: Auth, caller: Caller) -> Any:
    revoked_at = await auth.revoke_token(token_id, caller.actor)
    return json_response({"id": token_id, "revokedAt": int(revoked_at.timestamp() * 1000)})


@router.post("/policies", dependencies=[ALLOW_MANAGE_POLICIES], status_code=201, summary="Narrow an actor's writes")
async def create_policy(
    body: Annotated[PolicyRequest, Depends(JsonBody(PolicyRequest))], auth: Auth, caller: Caller
) -> Any:
    policy = await auth.create_policy(
        body.actor, body.entityTypes, body.aspects, description=body.description, created_by=caller.actor
    )
    return json_response(policy.to_json(), 201)


@router.get("/policies", dependencies=[ALLOW_MANAGE_POLICIES], summary="Write policies")
async def list_policies(auth: Auth) -> Any:
    return json_response({"policies": [p.to_json() for p in await auth.policies()]})


@router.delete("/policies/{policy_id}", dependencies=[ALLOW_MANAGE_POLICIES], summary="Delete a policy")
async def delete_policy(policy_id: str, auth: Auth, caller: Caller) -> Any:
    await auth.delete_policy(policy_id, caller.actor)
    return json_response({"id": policy_id, "deleted": True})


@authz_router.get("/explain", dependencies=[ALLOW_READ], summary="Why an actor may or may not use a privilege")
async def explain(
    auth: Auth,
    caller: Caller,
    privilege: Annotated[str, Query(min_length=1, max_length=100, examples=["EDIT_ENTITY_TAGS"])],
    actor: Annotated[str | None, Query(max_length=500, description="absent: the caller (another: admins only)")] = None,
    resource: Annotated[str | None, Query(max_length=500, description="an URN; absent: a platform privilege")] = None,
) -> Any:
    """The decision every surface makes (app.auth.decision), with what allowed it (a role, a write scope, an access
    policy) or why it was denied; the same reason a 403 carries. Says nothing of whether the resource exists."""
    if privilege not in KNOWN_PRIVILEGES:
        raise ValidationFailed(
            f"unknown privilege {privilege[:100]!r}",
            [Issue("not a privilege metaledger knows", path="$.query.privilege", found=privilege[:100])],
        )
    decision = await auth.explain(caller, actor, privilege, resource)
    return json_response({"actor": actor or caller.actor, "resource": resource, **decision.to_json()})
