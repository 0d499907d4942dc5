"""Personal tokens at /settings/tokens (app.web.tokens): a signed-in person lists, creates (seeing the token once)
and revokes their own tokens through the token service; each rule alone and where it must not fire — a writer or an
admin creates, a reader does not; a token's actor is the session's, its role at most the session's, its expiry no
later than the session's own token's; only one's own tokens are revoked, and revoking the session's own ends it; every
form needs the session's CSRF token."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import jwt

from app.auth.model import Role
from app.web.sessions import SESSION_COOKIE
from tests.helpers import mint_token
from tests.web.browsing import ALICE, csrf_of, sign_in

BOB = "urn:li:corpuser:bob"
SECRET = re.compile(r'id="new-token"[^>]* value="([^"]+)"')


async def sign_in_with(app, token: str) -> httpx.AsyncClient:
    browser = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger")
    form = await browser.get("/login")
    answer = await browser.post("/login", data={"token": token, "csrf_token": csrf_of(form.text)})
    assert answer.status_code == 303, answer.text
    return browser


async def create(browser: httpx.AsyncClient, **form: str) -> httpx.Response:
    page = await browser.get("/settings/tokens")
    return await browser.post("/settings/tokens", data={"csrf_token": csrf_of(page.text), **form})


async def whoami(app, token: str) -> dict:
    anonymous = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger")
    answer = await anonymous.get("/openapi/v1/auth/me", headers={"Authorization": f"Bearer {token}"})
    return answer.json() if answer.status_code == 200 else {"status": answer.status_code}


async def test_the_page_lists_ones_own_active_tokens_and_marks_the_sessions(app, client):
    browser = await sign_in(app, role="writer")
    await mint_token(app, "reader", BOB)  # another person's: not listed
    revoked = (await client.post("/openapi/v1/auth/tokens", json={"actor": ALICE, "role": "reader"})).json()
    await client.delete(f"/openapi/v1/auth/tokens/{revoked['id']}")
    page = await browser.get("/settings/tokens")
    assert page.status_code == 200
    ids = re.findall(r'name="id" value="([^"]+)"', page.text)
    mine = await app.state.auth.tokens(ALICE)
    assert ids == [t.id for t in mine] and len(ids) == 1  # the session's own; not the revoked one, not Bob's
    assert "this session" in page.text and "Revoking it signs you out" in page.text
    assert 'aria-current="page">Tokens' in page.text


async def test_a_writer_creates_a_token_and_sees_it_once(app, db):
    browser = await sign_in(app, role="writer")
    answer = await create(browser, name="laptop ingestion", role="writer", lifetime="1d")
    assert answer.status_code == 201
    token = SECRET.search(answer.text).group(1)
    assert await whoami(app, token) == {"actor": ALICE, "role": "writer", "tokenId": token_id(token), "via": "token"}
    row = await db.fetchrow("SELECT created_by, description, expires_at FROM auth_token WHERE id = $1", token_id(token))
    assert row["created_by"] == ALICE and row["description"] == "laptop ingestion"
    assert timedelta(hours=23) < row["expires_at"] - datetime.now(UTC) <= timedelta(days=1)
    again = await browser.get("/settings/tokens")
    assert token not in again.text and "laptop ingestion" in again.text  # listed, never shown again
    assert answer.headers["cache-control"] == "no-store"


def token_id(token: str) -> str:
    return jwt.decode(token, options={"verify_signature": False})["jti"]


async def test_a_token_has_at_most_the_sessions_role(app, db):
    writer = await sign_in(app, role="writer")
    page = await writer.get("/settings/tokens")
    assert re.findall(r'<option value="(reader|writer|admin)"', page.text) == ["writer", "reader"]
    above = await create(writer, name="escalate", role="admin", lifetime="1d")
    assert above.status_code == 403 and "at most your own role, writer" in above.text
    assert await db.fetchval("SELECT count(*) FROM auth_token WHERE description = 'escalate'") == 0
    below = await create(writer, name="read only", role="reader", lifetime="1h")
    assert below.status_code == 201
    assert (await whoami(app, SECRET.search(below.text).group(1)))["role"] == "reader"
    admin = await sign_in(app, role="admin")
    assert (await create(admin, name="ops", role="admin", lifetime="1h")).status_code == 201


async def test_a_token_expires_no_later_than_the_one_the_session_was_opened_with(app, db):
    browser = await sign_in_with(app, await mint_token(app, "writer", ALICE, ttl="2d"))
    page = await browser.get("/settings/tokens")
    offered = re.findall(r'<option value="([^"]+)"[^>]*>([^<]*)</option>', page.text)
    values = [value for value, _ in offered if value not in ("reader", "writer", "admin")]
    assert values == ["1h", "1d", "signin"]  # not 30 days, 90 days, a year or never
    for lifetime in ("30d", "never", "365d", "3d"):
        refused = await create(browser, name="too long", role="writer", lifetime=lifetime)
        assert refused.status_code == 400 and "none ends after the token you signed in with" in refused.text
    assert await db.fetchval("SELECT count(*) FROM auth_token WHERE description = 'too long'") == 0
    made = await create(browser, name="as long as mine", role="writer", lifetime="signin")
    assert made.status_code == 201
    mine, new = await db.fetch("SELECT expires_at FROM auth_token WHERE actor = $1 ORDER BY created_at, id", ALICE)
    assert timedelta(0) <= mine["expires_at"] - new["expires_at"] < timedelta(minutes=2)


async def test_never_is_offered_only_from_a_token_that_never_expires(app):
    lasting = await sign_in_with(app, await mint_token(app, "writer", ALICE, ttl="never"))
    page = await lasting.get("/settings/tokens")
    assert '<option value="never">' in page.text and 'value="signin"' not in page.text
    made = await create(lasting, name="forever", role="writer", lifetime="never")
    assert made.status_code == 201 and "expires never" in made.text
    bounded = await sign_in(app, role="writer", actor=BOB)  # a token of the default 90 days
    assert '<option value="never">' not in (await bounded.get("/settings/tokens")).text


async def test_a_reader_lists_and_revokes_but_creates_none(app, db):
    reader = await sign_in(app, role="reader")
    page = await reader.get("/settings/tokens")
    assert page.status_code == 200 and 'action="/settings/tokens"' not in page.text
    assert "Readers cannot create tokens" in page.text
    forged = await reader.post(
        "/settings/tokens", data={"csrf_token": csrf_of(page.text), "name": "x", "role": "reader", "lifetime": "1h"}
    )
    assert forged.status_code == 403 and "WRITE" in forged.text
    assert await db.fetchval("SELECT count(*) FROM auth_token WHERE actor = $1", ALICE) == 1
    other = (await app.state.auth.create_token(ALICE, Role.READER, created_by=ALICE))[1]
    revoked = await reader.post("/settings/tokens/revoke", data={"csrf_token": csrf_of(page.text), "id": other.id})
    assert revoked.status_code == 303 and revoked.headers["location"] == "/settings/tokens"
    assert await db.fetchval("SELECT revoked_at IS NOT NULL FROM auth_token WHERE id = $1", other.id)
    assert (await reader.get("/settings/tokens")).status_code == 200  # the session goes on


async def test_revoking_the_sessions_own_token_ends_the_session(app, db):
    browser = await sign_in(app, role="writer")
    page = await browser.get("/settings/tokens")
    own = re.search(r'name="id" value="([^"]+)"', page.text).group(1)
    cookie = browser.cookies[SESSION_COOKIE]
    answer = await browser.post("/settings/tokens/revoke", data={"csrf_token": csrf_of(page.text), "id": own})
    assert answer.status_code == 303 and answer.headers["location"] == "/login"
    assert SESSION_COOKIE not in browser.cookies
    browser.cookies.set(SESSION_COOKIE, cookie)  # replayed: the session is gone with its token
    assert (await browser.get("/settings/tokens")).status_code == 303
    assert await db.fetchval("SELECT count(*) FROM web_session") == 0


async def test_another_persons_token_is_not_revoked(app, db):
    bobs = (await app.state.auth.create_token(BOB, Role.WRITER, created_by=BOB))[1]
    browser = await sign_in(app, role="admin")  # even an admin's page is its own: others' tokens go by the API
    page = await browser.get("/settings/tokens")
    for token_id_ in (bobs.id, "0" * 32, ""):
        answer = await browser.post("/settings/tokens/revoke", data={"csrf_token": csrf_of(page.text), "id": token_id_})
        assert answer.status_code == 404 and "no token with this id" in answer.text
    assert await db.fetchval("SELECT revoked_at FROM auth_token WHERE id = $1", bobs.id) is None


async def test_the_token_forms_need_the_sessions_csrf_token(app, db):
    browser = await sign_in(app, role="writer")
    page = await browser.get("/settings/tokens")
    own = re.search(r'name="id" value="([^"]+)"', page.text).group(1)
    for data in ({}, {"csrf_token": "forged"}):
        made = await browser.post("/settings/tokens", data={**data, "name": "x", "role": "writer", "lifetime": "1h"})
        assert made.status_code == 403
        revoked = await browser.post("/settings/tokens/revoke", data={**data, "id": own})
        assert revoked.status_code == 403
    assert await db.fetchval("SELECT count(*) FROM auth_token WHERE actor = $1 AND revoked_at IS NULL", ALICE) == 1


async def test_a_token_needs_a_name(app, db):
    browser = await sign_in(app, role="writer")
    for name in ("", "   ", "x" * 101):
        answer = await create(browser, name=name, role="writer", lifetime="1h")
        assert answer.status_code == 400 and "a name of 1 to 100 characters" in answer.text
    assert await db.fetchval("SELECT count(*) FROM auth_token WHERE actor = $1", ALICE) == 1


async def test_a_long_lived_sign_in_token_bounds_a_new_one_too(app, db):
    """Three years is more minutes than a lifetime's six digits: the bound is written in hours, never later."""
    browser = await sign_in_with(app, await mint_token(app, "writer", ALICE, ttl="1095d"))
    made = await create(browser, name="long", role="writer", lifetime="signin")
    assert made.status_code == 201
    mine, new = await db.fetch("SELECT expires_at FROM auth_token WHERE actor = $1 ORDER BY created_at, id", ALICE)
    assert timedelta(0) <= mine["expires_at"] - new["expires_at"] <= timedelta(hours=1)
