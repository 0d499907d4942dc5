"""Deleting a structured property's definition removes its values from every entity (DataHub's
PropertyDefinitionDeleteSideEffect).

What starts it: a DELETE change log of a property's `propertyDefinition` or of its key aspect (a hard delete of the
`structuredProperty` entity logs both), whatever the entry that deleted it (v3 DELETE, Rest.li delete, an MCP on
the topic, `datahub delete --hard`): they all end in the same change log. A soft delete (`status.removed`) is no
DELETE: its values stay, hidden on read while it lasts (app.write.structured_properties).

Where it runs: after commit, as a reader of the change feed of its own (STRUCTURED_PROPERTY_DELETES), as DataHub
runs it after commit from the change log (a postMCPSideEffect). Not in the delete's transaction: a property held by
100k entities would make the delete one transaction writing 100k versions under their locks.

How: the holders (the entities whose latest `structuredProperties` holds a value of the property, found through the
index of migration 0012, app.write.structured_properties.holders) are read a page of REMOVAL_PAGE at a time, and each
gets a PATCH removing `/properties/<property urn>` through the write path (the after phase's: rules and before
processors, a new version and a change log each, the cause in systemMetadata.properties). A PATCH applies to the
row as it is locked, so a value another writer committed meanwhile is kept.

Exactly once: a page is written in the transaction that holds the reader's position, and the position passes the
DELETE change log only in the transaction of the page that finds no holder left. A holder is found until its value
is removed, so a page replayed after a crash, or by a second process, finds only the holders still left. A removal
the write path refuses (a before processor's rejection) is logged and stepped over (the page goes on from the last
holder it read; a restarted process tries those once more).

A property defined again before its values are all removed keeps the values still held: the new definition was
checked against them when it was written (app.write.structured_properties.StoredValueCheck); the reader moves on.
"""

from __future__ import annotations

import asyncpg
import jsonpointer
from sqlalchemy.ext.asyncio import AsyncSession

from app.changelog.cursor import STRUCTURED_PROPERTY_DELETES, FeedCursor
from app.db import session_connection
from app.urns import entity_type_of
from app.write.after_processors import AfterProcessorWorker, _Emission
from app.write.processors import EmittedProposal, ProposedChange
from app.write.proposal import ChangeType
from app.write.repository import AspectRepository
from app.write.structured_properties import (
    PROPERTY_DEFINITION,
    PROPERTY_ENTITY,
    PROPERTY_URN_PREFIX,
    STRUCTURED_PROPERTIES,
    holders,
)

SIDE_EFFECT = "PropertyDefinitionDeleteSideEffect"  # the processor named as the cause of each removal
PROPERTY_KEY = "structuredPropertyKey"
REMOVAL_PAGE = 500


def removal(entity_urn: str, property_urn: str) -> EmittedProposal:
    """The PATCH removing `property_urn`'s values from `entity_urn` (DataHub's, keyed by `propertyUrn`)."""
    path = f"/properties/{jsonpointer.escape(property_urn)}"
    return EmittedProposal(
        entity_urn,
        entity_type_of(entity_urn),
        STRUCTURED_PROPERTIES,
        {"arrayPrimaryKeys": {"properties": ["propertyUrn"]}, "patch": [{"op": "remove", "path": path}]},
        ChangeType.PATCH.value,
    )


class PropertyValueRemoval(AfterProcessorWorker):
    """The reader: the after phase's loop and writes (AfterProcessorWorker), its own position and step."""

    reader = STRUCTURED_PROPERTY_DELETES

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._resume: tuple[int, str] | None = None  # (feed offset of the DELETE in hand, the last holder read)

    async def step(self) -> int:
        """One transaction: the change logs up to the next definition DELETE passed over, then one page of its
        holders' removals; the position passes the DELETE with its last page. Returns the change logs passed, or
        the batch size while a DELETE still has holders (its next page is due at once)."""
        async with self.sessionmaker() as session:
            conn = await session_connection(session)
            cursor = FeedCursor(conn, self.reader)
            async with conn.transaction(isolation="read_committed"):
                position, end, deletes = await cursor.deletes_locked(
                    self.batch,
                    self.settings.topic_mcl_versioned,
                    (PROPERTY_DEFINITION, PROPERTY_KEY),
                    PROPERTY_URN_PREFIX,
                )
                for row in deletes:
                    if not await self._remove_page(session, row):
                        await cursor.advance(row["feed_offset"] - 1)  # feed offsets are dense: the rows before it
                        return self.batch
                if end > position:
                    await cursor.advance(end)
        return end - position

    async def _remove_page(self, session: AsyncSession, row: asyncpg.Record) -> bool:
        """Remove the values of the next page of the property's holders; True when none is left."""
        property_urn, offset = row["urn"], row["feed_offset"]
        repo = AspectRepository(session)
        if await repo.latest([(property_urn, PROPERTY_DEFINITION)]):
            return True  # defined again
        after = self._resume[1] if self._resume is not None and self._resume[0] == offset else ""
        page = await holders(repo, property_urn, after, REMOVAL_PAGE)
        if page:
            cause = ProposedChange(
                property_urn, PROPERTY_ENTITY, row["aspect"], ChangeType.DELETE.value, None, version=row["version"]
            )
            await self._commit(session, [_Emission(cause, SIDE_EFFECT, removal(urn, property_urn)) for urn in page])
            self.processed += 1
        if len(page) < REMOVAL_PAGE:
            self._resume = None
            return True
        self._resume = (offset, page[-1])
        return False
