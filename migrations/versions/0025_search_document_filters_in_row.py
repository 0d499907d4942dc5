"""search_document's filter columns kept in the row, and its GIN indexes' pending lists kept short.

- `exact_names` and `facet_values` stored MAIN (as `search_vector` since 0021): a document is ~3.4 kB with a 50-field
  schema, over the 2 kB at which Postgres moves a row's largest values to the TOAST table, and these two small arrays
  went there with `fields`. Every text search tests `exact_names` of each document it reads and every facet count
  unnests `facet_values`: a TOAST lookup and fetch each. A search of 2,000 datasets planned as a scan read 6,628 pages
  instead of 617 (6.3 ms, 1.5 ms with them in the row). Existing values are written again to be stored so.
- `gin_pending_list_limit` of 512 kB on the three GIN indexes (the default is 4 MB). With fastupdate a GIN index keeps
  new entries in a pending list every search through it scans, until a vacuum, an autoanalyze or the list's limit
  moves them into the index. The embedded indexer rewrites documents with every change, so the lists stayed near
  the limit: 508 pages (4 MB) scanned by each search through the text index, and the planner, counting them, read
  2,000 documents with a scan rather than the index (0.06 ms once the list was cleaned). At 512 kB a list holds at
  most 64 pages; rewriting 2,000 documents' three indexed columns took 302-371 ms against 256-341 ms at 4 MB (two
  pairs of two). The lists are cleaned once here.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

GIN_INDEXES = ("ix_search_document_vector", "ix_search_document_fields", "ix_search_document_exact_names")
PENDING_LIST_KB = 512


def upgrade() -> None:
    op.execute("ALTER TABLE search_document ALTER COLUMN exact_names SET STORAGE MAIN")
    op.execute("ALTER TABLE search_document ALTER COLUMN facet_values SET STORAGE MAIN")
    # new values (the same elements): an unchanged one would keep its place in the TOAST table
    op.execute(
        "UPDATE search_document SET exact_names = exact_names || '{}'::text[], "
        "facet_values = facet_values || '{}'::text[]"
    )
    for index in GIN_INDEXES:
        op.execute(f"ALTER INDEX {index} SET (gin_pending_list_limit = {PENDING_LIST_KB})")
        op.execute(f"SELECT gin_clean_pending_list('{index}')")


def downgrade() -> None:
    for index in GIN_INDEXES:
        op.execute(f"ALTER INDEX {index} RESET (gin_pending_list_limit)")
    op.execute("ALTER TABLE search_document ALTER COLUMN facet_values SET STORAGE EXTENDED")
    op.execute("ALTER TABLE search_document ALTER COLUMN exact_names SET STORAGE EXTENDED")
