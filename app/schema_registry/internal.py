"""The schema registry metaledger serves itself (DataHub's "INTERNAL" type, and more): DataHub's schemas under
their fixed ids (app.schema_registry.datahub, never stored), and the schemas producers register, stored in Postgres.

Stored schemas are content-addressed: a schema's normal form (app.schema_registry.normal_form) and its SHA-256
fingerprint; registering a schema that is already known, under any subject, gives its id again. New ids start at
1000 (above DataHub's), from a database sequence, so they are stable across restarts and shared by every process
on the database. Each subject has versions 1, 2, ...; a DataHub subject's first versions are DataHub's.

A registration is checked against the subject's compatibility level (BACKWARD unless configured per subject or
globally) under a transaction-level advisory lock on the subject, so concurrent registrations to one subject get
consecutive versions and each is checked against the one before. Ids and stored texts never change: they are cached
in memory, so decoding a message costs no query once its writer schema was fetched.

Tables (migrations/versions/0006_schema_registry.py): `schema_registry_schema` (id, fingerprint, schema),
`schema_registry_subject_version` (subject, version, schema_id), `schema_registry_config` (subject or '' for the
global level, compatibility).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.schema_registry import compatibility
from app.schema_registry.datahub import DataHubSchemas, normal, record_of
from app.schema_registry.errors import (
    IncompatibleSchema,
    InvalidSubject,
    RegistryUnavailable,
    SchemaNotInSubject,
    SubjectNotFound,
    UnknownSchema,
    VersionNotFound,
)
from app.schema_registry.normal_form import NormalSchema, normalize
from app.settings import Settings

SUBJECT_LOCK_CLASS = 0x4D4C0020  # pg_advisory_xact_lock(class, hashtext(subject)); see app.changelog.outbox
MAX_SUBJECT_LENGTH = 500
GLOBAL = ""  # the config row of the global compatibility level


@dataclass(frozen=True)
class RegisteredVersion:
    subject: str
    version: int
    id: int
    schema: str

    def to_json(self) -> dict[str, object]:
        return {"subject": self.subject, "version": self.version, "id": self.id, "schema": self.schema}


def check_subject(subject: str) -> str:
    if not subject or len(subject) > MAX_SUBJECT_LENGTH or not subject.isprintable():
        raise InvalidSubject(
            f"Invalid subject {subject[:100]!r}: a subject is 1 to {MAX_SUBJECT_LENGTH} printable characters"
        )
    return subject


class InternalRegistry:
    """Satisfies SchemaRegistryClient (schema_by_id, register) and serves everything the HTTP routes need."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self._engine = engine
        self.datahub = DataHubSchemas(settings)
        self._texts: dict[int, str] = {}  # stored schemas by id (immutable)
        self._normals: dict[int, NormalSchema] = {}
        self._registered: dict[tuple[str, str], int] = {}  # (subject, fingerprint) → id, once registered

    async def aclose(self) -> None:
        return None

    # --- the SchemaRegistryClient protocol ---------------------------------------------------------------------

    async def schema_by_id(self, schema_id: int) -> str:
        """The schema text of an id; UnknownSchema when there is none."""
        known = self.datahub.text(schema_id) if self.datahub.is_datahub_id(schema_id) else self._texts.get(schema_id)
        if known is not None:
            return known
        if not -(2**31) <= schema_id < 2**31:
            raise UnknownSchema("Schema not found")
        async with self._connection() as conn:
            stored = (
                await conn.execute(text("SELECT schema FROM schema_registry_schema WHERE id = :id"), {"id": schema_id})
            ).scalar()
        if stored is None:
            raise UnknownSchema(f"Schema {schema_id} not found")
        self._texts[schema_id] = stored
        return stored

    async def register(self, subject: str, schema: str) -> int:
        """Register `schema` under `subject` (a new version unless the subject has it already) and return its id.
        InvalidSchema (422) for a schema that is not valid Avro, IncompatibleSchema (409) with the reasons."""
        check_subject(subject)
        new = normalize(schema)
        known = self._registered.get((subject, new.fingerprint))
        if known is not None:
            return known
        own = self.datahub.subjects.get(subject)
        if own is not None and normal(own.record).fingerprint == new.fingerprint:
            self._registered[(subject, new.fingerprint)] = own.current_id
            return own.current_id
        async with self._transaction() as conn:
            await conn.execute(
                text("SELECT pg_advisory_xact_lock(:class, hashtext(:subject))"),
                {"class": SUBJECT_LOCK_CLASS, "subject": subject},
            )
            schema_id = await self._known_id(conn, new, subject)
            rows = await self._stored_versions(conn, subject)
            if schema_id is not None and (
                any(row_id == schema_id for _, row_id in rows) or (own is not None and schema_id in own.version_ids)
            ):
                self._registered[(subject, new.fingerprint)] = schema_id
                return schema_id
            level = await self._level(conn, subject)
            if level != "NONE":
                previous = await self._previous(conn, subject, rows, transitive=level.endswith("_TRANSITIVE"))
                reasons = compatibility.incompatibilities(new, previous, level)
                if reasons:
                    raise IncompatibleSchema(
                        f'Schema being registered is incompatible with an earlier schema for subject "{subject}" '
                        f"(compatibility {level}): " + "; ".join(reasons)
                    )
            if schema_id is None:
                schema_id = (
                    await conn.execute(
                        text(
                            "INSERT INTO schema_registry_schema (fingerprint, schema) VALUES (:fp, :schema) "
                            "ON CONFLICT (fingerprint) DO UPDATE SET fingerprint = EXCLUDED.fingerprint RETURNING id"
                        ),
                        {"fp": new.fingerprint, "schema": new.text},
                    )
                ).scalar_one()
            base = len(own.version_ids) if own is not None else 0
            version = max([base, *(number for number, _ in rows)]) + 1
            await conn.execute(
                text(
                    "INSERT INTO schema_registry_subject_version (subject, version, schema_id) "
                    "VALUES (:subject, :version, :id)"
                ),
                {"subject": subject, "version": version, "id": schema_id},
            )
        if not self.datahub.is_datahub_id(schema_id):
            self._texts.setdefault(schema_id, new.text)
        self._registered[(subject, new.fingerprint)] = schema_id
        return schema_id

    # --- what the HTTP routes read -------------------------------------------------------------------------------

    async def subjects(self) -> list[str]:
        async with self._connection() as conn:
            stored = (
                await conn.execute(text("SELECT DISTINCT subject FROM schema_registry_subject_version"))
            ).scalars()
            return sorted({*self.datahub.subjects, *stored})

    async def versions(self, subject: str) -> list[int]:
        async with self._connection() as conn:
            rows = await self._stored_versions(conn, subject)
        own = self.datahub.subjects.get(subject)
        numbers = [*range(1, len(own.version_ids) + 1)] if own is not None else []
        numbers += [number for number, _ in rows]
        if not numbers:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        return numbers

    async def version(self, subject: str, version: int | Literal["latest"]) -> RegisteredVersion:
        """A subject's version (`latest`: its last one)."""
        async with self._connection() as conn:
            rows = await self._stored_versions(conn, subject)
        own = self.datahub.subjects.get(subject)
        every = [*((n, i) for n, i in enumerate(own.version_ids, start=1))] if own is not None else []
        every += rows
        if not every:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        if version == "latest":
            number, schema_id = every[-1]
        else:
            found = [(n, i) for n, i in every if n == version]
            if not found:
                raise VersionNotFound(f"Version {version} not found.")
            number, schema_id = found[0]
        return RegisteredVersion(subject, number, schema_id, await self.schema_by_id(schema_id))

    async def lookup(self, subject: str, schema: str) -> RegisteredVersion:
        """The version of `subject` that holds `schema` (Confluent's `POST /subjects/{subject}`)."""
        new = normalize(schema)
        own = self.datahub.subjects.get(subject)
        candidates = list(enumerate(own.version_ids, start=1)) if own is not None else []
        async with self._connection() as conn:
            candidates += await self._stored_versions(conn, subject)
            if not candidates:
                raise SubjectNotFound(f"Subject '{subject}' not found.")
            schema_id = await self._known_id(conn, new, subject)
        for number, candidate in candidates:
            if candidate == schema_id:
                return RegisteredVersion(subject, number, candidate, await self.schema_by_id(candidate))
        raise SchemaNotInSubject("Schema not found")

    async def versions_of_id(self, schema_id: int) -> list[tuple[str, int]]:
        """Every (subject, version) holding the schema `schema_id`; UnknownSchema when there is no such id."""
        await self.schema_by_id(schema_id)
        found = self.datahub.versions_of_id(schema_id)
        async with self._connection() as conn:
            rows = await conn.execute(
                text(
                    "SELECT subject, version FROM schema_registry_subject_version WHERE schema_id = :id "
                    "ORDER BY subject, version"
                ),
                {"id": schema_id},
            )
            found += [(row.subject, row.version) for row in rows]
        return found

    async def compatibility_level(self, subject: str | None = None) -> str:
        """The level in force for `subject` (its own, else the global one), or the global level."""
        async with self._connection() as conn:
            return await self._level(conn, subject)

    async def set_compatibility_level(self, level: str, subject: str | None = None) -> str:
        level = compatibility.check_level(level)
        if subject is not None:
            check_subject(subject)
        async with self._transaction() as conn:
            await conn.execute(
                text(
                    "INSERT INTO schema_registry_config (subject, compatibility) VALUES (:subject, :level) "
                    "ON CONFLICT (subject) DO UPDATE SET compatibility = EXCLUDED.compatibility"
                ),
                {"subject": GLOBAL if subject is None else subject, "level": level},
            )
        return level

    async def delete_compatibility_level(self, subject: str) -> str:
        """Forget the subject's own level; returns the level it had (the global one when it had none)."""
        async with self._transaction() as conn:
            before = await self._level(conn, subject)
            await conn.execute(text("DELETE FROM schema_registry_config WHERE subject = :s"), {"s": subject})
        return before

    async def test_compatibility(self, subject: str, version: int | Literal["latest"] | None, schema: str) -> list[str]:
        """Why `schema` could not be registered as the next version of `subject` (against `version`, or against
        what the subject's level checks when None); empty when it could."""
        new = normalize(schema)
        async with self._connection() as conn:
            level = await self._level(conn, subject)
            rows = await self._stored_versions(conn, subject)
            if version is None:
                previous = await self._previous(conn, subject, rows, transitive=level.endswith("_TRANSITIVE"))
            else:
                chosen = await self.version(subject, version)
                previous = [await self._normal(chosen.id)]
        if version is not None:
            level = level.removesuffix("_TRANSITIVE")
        return compatibility.incompatibilities(new, previous, level)

    # --- internals -------------------------------------------------------------------------------------------------

    async def _known_id(self, conn: AsyncConnection, new: NormalSchema, subject: str) -> int | None:
        """The id this schema already has: DataHub's (for its own schemas), else a stored registration's."""
        schema_id = self.datahub.id_of(new, subject)
        if schema_id is None:
            schema_id = (
                await conn.execute(
                    text("SELECT id FROM schema_registry_schema WHERE fingerprint = :fp"), {"fp": new.fingerprint}
                )
            ).scalar()
        return schema_id

    async def _stored_versions(self, conn: AsyncConnection, subject: str) -> list[tuple[int, int]]:
        rows = await conn.execute(
            text(
                "SELECT version, schema_id FROM schema_registry_subject_version WHERE subject = :subject ORDER BY version"
            ),
            {"subject": subject},
        )
        return [(row.version, row.schema_id) for row in rows]

    async def _level(self, conn: AsyncConnection, subject: str | None) -> str:
        keys = [GLOBAL] if subject is None else [subject, GLOBAL]
        rows = {
            row.subject: row.compatibility
            for row in await conn.execute(
                text("SELECT subject, compatibility FROM schema_registry_config WHERE subject = ANY(:keys)"),
                {"keys": keys},
            )
        }
        for key in keys:
            if key in rows:
                return rows[key]
        return compatibility.DEFAULT_LEVEL

    async def _previous(
        self, conn: AsyncConnection, subject: str, rows: list[tuple[int, int]], *, transitive: bool
    ) -> list[NormalSchema]:
        """The subject's schemas, oldest first (only the latest unless transitive)."""
        own = self.datahub.subjects.get(subject)
        ids = ([own.current_id] if own is not None else []) + [schema_id for _, schema_id in rows]
        if not transitive:
            ids = ids[-1:]
        return [await self._normal(schema_id) for schema_id in ids]

    async def _normal(self, schema_id: int) -> NormalSchema:
        found = self._normals.get(schema_id)
        if found is None:
            if self.datahub.is_datahub_id(schema_id):
                found = normal(record_of(schema_id))
            else:
                found = normalize(await self.schema_by_id(schema_id))
            self._normals[schema_id] = found
        return found

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self._engine.connect() as conn:
                yield conn
        except (OSError, OperationalError, InterfaceError) as error:  # (TimeoutError is an OSError)
            raise RegistryUnavailable(f"the registry's database is unavailable: {error}") from None

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self._engine.begin() as conn:
                yield conn
        except (OSError, OperationalError, InterfaceError) as error:  # (TimeoutError is an OSError)
            raise RegistryUnavailable(f"the registry's database is unavailable: {error}") from None
        except DBAPIError as error:
            if "deadlock" in str(error) or "could not serialize" in str(error):
                raise RegistryUnavailable(f"retry: {error}") from None
            raise
