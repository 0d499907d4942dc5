"""The search index's version, so that a process may answer a repeated search from its result cache; and each
document's search vector kept in its row.

- `search_index_version`: one row; its `version` is moved by every write of the search documents, after that write
  commits (app.search.postgres `PostgresBackend.apply` and `clear`). A search result read at a version is answered
  again while the version holds (app.search.postgres `_ResultCache`).
- `search_document.search_vector` stored MAIN: compressed in the row, moved out of it only when nothing else makes the
  row fit. A text query's page ranks every match by its vector; with migration 0018's facet values most documents'
  vectors had moved to the TOAST table, a lookup and a fetch per match: ranking 10,000 matches took 1.7 times as long.
  Existing vectors are written again (a page at a time) to be stored so.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

PAGE = 2000


def upgrade() -> None:
    op.execute("CREATE TABLE search_index_version (version bigint NOT NULL)")
    op.execute("INSERT INTO search_index_version VALUES (0)")
    op.execute("ALTER TABLE search_document ALTER COLUMN search_vector SET STORAGE MAIN")
    bind = op.get_bind()
    after = ""
    while True:
        urns = (
            bind.execute(
                sa.text("SELECT urn FROM search_document WHERE urn > :after ORDER BY urn LIMIT :page"),
                {"after": after, "page": PAGE},
            )
            .scalars()
            .all()
        )
        if not urns:
            return
        # a new value (the same lexemes): an unchanged one would keep its place in the TOAST table
        bind.execute(
            sa.text("UPDATE search_document SET search_vector = search_vector || ''::tsvector WHERE urn = ANY(:urns)"),
            {"urns": list(urns)},
        )
        after = urns[-1]


def downgrade() -> None:
    op.execute("ALTER TABLE search_document ALTER COLUMN search_vector SET STORAGE EXTENDED")
    op.execute("DROP TABLE search_index_version")
