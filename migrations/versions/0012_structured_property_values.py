"""Structured property values: which entities hold a value of a property, without scanning the aspect store.

- `structured_property_urns(metadata)`: the `propertyUrn` of each assignment of a `structuredProperties` value;
  NULL for a row Postgres' jsonb refuses (a NUL escape written before they were refused).
- `ix_metadata_aspect_v2_structured_property_urns`: a GIN index of them over row 0 of `structuredProperties`. A
  definition change that may invalidate stored values (app.write.structured_properties) reads only the entities
  holding a value of its property through it, a page at a time in URN order.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        r"""
        CREATE FUNCTION structured_property_urns(metadata text) RETURNS text[]
        LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURNS NULL ON NULL INPUT AS $$
            SELECT CASE WHEN strpos(metadata, '\u0000') > 0 THEN NULL
                        ELSE ARRAY(SELECT jsonb_array_elements_text(
                                 jsonb_path_query_array(metadata::jsonb, 'lax $.properties[*].propertyUrn'))) END
        $$
        """
    )
    op.execute(
        "CREATE INDEX ix_metadata_aspect_v2_structured_property_urns ON metadata_aspect_v2 "
        "USING gin (structured_property_urns(metadata)) WHERE aspect = 'structuredProperties' AND version = 0"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_metadata_aspect_v2_structured_property_urns")
    op.execute("DROP FUNCTION structured_property_urns(text)")
