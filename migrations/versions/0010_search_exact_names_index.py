"""A GIN index on `search_document.exact_names`, so that a text search is two index scans, not a table scan.

A text query matches a document whose `search_vector` matches it or whose `exact_names` hold the whole query
(app.search.postgres `_query_sql`). `search_vector` has its GIN index (0003); the exact-name arm, written
`$exact = ANY(exact_names)`, could use none, and an OR with an arm that no index answers makes Postgres read the
whole table for every text search. Written as `exact_names @> ARRAY[$exact]` (array containment, the same test for
arrays without NULLs, which these are) it is answered by this index, and the OR by a BitmapOr of the two.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_search_document_exact_names ON search_document USING gin (exact_names)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_search_document_exact_names")
