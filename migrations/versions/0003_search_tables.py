"""The embedded search backend (`app.search.postgres`): entity search documents, per-aspect contributions, the
relationship/lineage graph and timeseries points.

- `search_aspect_fields`: what each aspect contributes to its entity's document, with the version indexed. A
  deleted aspect keeps its row (`deleted`, empty fields) as the version marker, so an older change arriving later
  cannot resurrect it. The document is rebuilt from these rows.
- `search_document`: one per entity: merged `fields` (filters, hits), `search_vector` (weighted A..D from the
  fields' boosts), `exact_names` (lower-cased name/id values: an exact match outranks any text match), `removed`
  (status.removed: soft delete, hidden from search).
- `search_edge` / `search_edge_version`: the edges each (source, aspect) declares, replaced as a set when a newer
  version of the aspect arrives.
- `timeseries_point`: one row per (aspect, DataHub document id), so a re-sent point overwrites itself. The aspect is
  part of the key because DataHub's id (hash of timestamp, granularity, urn, partition, messageId) is unique only
  within one aspect's index: a profile and a usage point of one urn at one timestamp share it.

URN columns use the "C" collation, as the aspect store does (binary comparison, Python's sort order).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE search_aspect_fields (
            urn          text COLLATE "C" NOT NULL,
            aspect       text COLLATE "C" NOT NULL,
            entity_type  text             NOT NULL,
            version      bigint           NOT NULL,
            deleted      boolean          NOT NULL DEFAULT false,
            fields       jsonb            NOT NULL DEFAULT '{}'::jsonb,
            updated_at   timestamptz      NOT NULL DEFAULT now(),
            CONSTRAINT pk_search_aspect_fields PRIMARY KEY (urn, aspect)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE search_document (
            urn              text COLLATE "C" NOT NULL,
            entity_type      text             NOT NULL,
            fields           jsonb            NOT NULL DEFAULT '{}'::jsonb,
            aspect_versions  jsonb            NOT NULL DEFAULT '{}'::jsonb,
            removed          boolean          NOT NULL DEFAULT false,
            search_vector    tsvector         NOT NULL DEFAULT ''::tsvector,
            exact_names      text[]           NOT NULL DEFAULT '{}',
            updated_at       timestamptz      NOT NULL DEFAULT now(),
            CONSTRAINT pk_search_document PRIMARY KEY (urn)
        )
        """
    )
    op.execute("CREATE INDEX ix_search_document_vector ON search_document USING gin (search_vector)")
    op.execute("CREATE INDEX ix_search_document_fields ON search_document USING gin (fields jsonb_path_ops)")
    op.execute("CREATE INDEX ix_search_document_type_urn ON search_document (entity_type, urn)")
    op.execute(
        """
        CREATE TABLE search_edge (
            source            text COLLATE "C" NOT NULL,
            aspect            text COLLATE "C" NOT NULL,
            relationship      text COLLATE "C" NOT NULL,
            destination       text COLLATE "C" NOT NULL,
            version           bigint           NOT NULL,
            source_type       text,
            destination_type  text,
            is_lineage        boolean          NOT NULL DEFAULT false,
            via               text,
            created_on        bigint,
            created_actor     text,
            updated_on        bigint,
            updated_actor     text,
            properties        jsonb            NOT NULL DEFAULT '{}'::jsonb,
            CONSTRAINT pk_search_edge PRIMARY KEY (source, aspect, relationship, destination)
        )
        """
    )
    op.execute("CREATE INDEX ix_search_edge_destination ON search_edge (destination, relationship)")
    op.execute("CREATE INDEX ix_search_edge_source ON search_edge (source, relationship)")
    op.execute(
        """
        CREATE TABLE search_edge_version (
            source   text COLLATE "C" NOT NULL,
            aspect   text COLLATE "C" NOT NULL,
            version  bigint           NOT NULL,
            CONSTRAINT pk_search_edge_version PRIMARY KEY (source, aspect)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE timeseries_point (
            doc_id           text COLLATE "C" NOT NULL,
            aspect           text COLLATE "C" NOT NULL,
            urn              text COLLATE "C" NOT NULL,
            entity_type      text             NOT NULL,
            timestamp_ms     bigint           NOT NULL,
            fields           jsonb            NOT NULL DEFAULT '{}'::jsonb,
            value            jsonb            NOT NULL,
            system_metadata  jsonb,
            CONSTRAINT pk_timeseries_point PRIMARY KEY (aspect, doc_id)
        )
        """
    )
    op.execute("CREATE INDEX ix_timeseries_point_urn_time ON timeseries_point (urn, aspect, timestamp_ms DESC)")


def downgrade() -> None:
    op.execute("DROP TABLE timeseries_point")
    op.execute("DROP TABLE search_edge_version")
    op.execute("DROP TABLE search_edge")
    op.execute("DROP TABLE search_document")
    op.execute("DROP TABLE search_aspect_fields")
