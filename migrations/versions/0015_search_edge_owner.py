"""Column-level lineage: edges between schema fields, owned by the entity whose aspect declares them.

A dataset's `upstreamLineage.fineGrainedLineages` (a job's `dataJobInputOutput`, a chart's `inputFields`) declares
`DownstreamOf` edges from one schema field to another (app.search.documents.field_lineage_edges): their source is a
schema field, not the entity whose edge set holds them. `search_edge.owner` names that entity (DataHub's
lifecycleOwner; NULL: the source itself), so that the owner's next set replaces them and its removal deletes them;
their `aspect` also names the owner (app.search.model.edge_set_aspect), so two owners of one field edge each keep
theirs. `ix_search_edge_owner` finds an owner's edges; it holds the owned edges only.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute('ALTER TABLE search_edge ADD COLUMN owner text COLLATE "C"')
    op.execute("CREATE INDEX ix_search_edge_owner ON search_edge (owner) WHERE owner IS NOT NULL")


def downgrade() -> None:
    op.execute("DELETE FROM search_edge WHERE owner IS NOT NULL")
    op.execute("DROP INDEX ix_search_edge_owner")
    op.execute("ALTER TABLE search_edge DROP COLUMN owner")
