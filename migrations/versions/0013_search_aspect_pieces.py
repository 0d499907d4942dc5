"""Each aspect's pieces of its entity's search document, so that a write re-derives only what its aspect changed.

- `search_aspect_fields.search_vector`, `.exact_names`, `.text_chars`: the weighted tsvector of the aspect's text,
  the lower-cased text of its exact-name fields, and how many characters of text the vector is built from
  (app.search.postgres `aspect_text`). Written with the aspect's fields; a document is rebuilt by combining its
  aspects' rows, parsing no text but its URN.
- `search_jsonb_merge`, `search_tsvector_concat`, `search_array_concat`: the aggregates that combine them (`||` of
  jsonb, tsvector and text[] in the order given).

Existing rows get their pieces here, from the field specs of the registry the service is configured with
(METALEDGER_REGISTRY_PATH), a page at a time; existing documents are left as they are (they were built from the same
rows) until their next write rebuilds them.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

import orjson
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

PAGE = 2000


def upgrade() -> None:
    op.execute("ALTER TABLE search_aspect_fields ADD COLUMN search_vector tsvector NOT NULL DEFAULT ''::tsvector")
    op.execute("ALTER TABLE search_aspect_fields ADD COLUMN exact_names text[] NOT NULL DEFAULT '{}'")
    op.execute("ALTER TABLE search_aspect_fields ADD COLUMN text_chars integer NOT NULL DEFAULT 0")
    op.execute("CREATE AGGREGATE search_jsonb_merge(jsonb) (SFUNC = jsonb_concat, STYPE = jsonb, INITCOND = '{}')")
    op.execute(
        "CREATE AGGREGATE search_tsvector_concat(tsvector) (SFUNC = tsvector_concat, STYPE = tsvector, INITCOND = '')"
    )
    op.execute("CREATE AGGREGATE search_array_concat(text[]) (SFUNC = array_cat, STYPE = text[], INITCOND = '{}')")
    _derive_pieces()


def _derive_pieces() -> None:
    from app.registry import load_registry
    from app.search import documents
    from app.search.postgres import ASPECT_VECTOR_SQL, aspect_text, field_weights
    from app.settings import Settings

    bind = op.get_bind()
    if not bind.execute(sa.text("SELECT EXISTS (SELECT 1 FROM search_aspect_fields WHERE NOT deleted)")).scalar():
        return
    settings = Settings()
    registry = load_registry(settings.registry_path)
    max_chars = documents.IndexLimits.from_settings(settings).document_chars
    weights: dict[str, dict[str, tuple[str, bool]]] = {}
    update = sa.text(
        f"""
        UPDATE search_aspect_fields s
        SET search_vector = {ASPECT_VECTOR_SQL}, exact_names = ARRAY(SELECT jsonb_array_elements_text(x.exact::jsonb)),
            text_chars = x.text_chars
        FROM unnest(CAST(:urn AS text[]), CAST(:aspect AS text[]), CAST(:a AS text[]), CAST(:b AS text[]),
                    CAST(:c AS text[]), CAST(:d AS text[]), CAST(:exact AS text[]), CAST(:chars AS int[]))
             AS x(urn, aspect, text_a, text_b, text_c, text_d, exact, text_chars)
        WHERE s.urn = x.urn AND s.aspect = x.aspect
        """
    )
    after = ("", "")
    while True:
        rows = bind.execute(
            sa.text(
                "SELECT urn, aspect, entity_type, fields::text AS fields FROM search_aspect_fields "
                "WHERE NOT deleted AND (urn, aspect) > (:urn, :aspect) ORDER BY urn, aspect LIMIT :page"
            ),
            {"urn": after[0], "aspect": after[1], "page": PAGE},
        ).all()
        if not rows:
            return
        params: dict[str, list] = {k: [] for k in ("urn", "aspect", "a", "b", "c", "d", "exact", "chars")}
        for urn, aspect, entity_type, fields in rows:
            if entity_type not in weights:
                try:
                    weights[entity_type] = field_weights(documents.search_fields(registry, entity_type))
                except KeyError:  # an entity type the registry does not know
                    weights[entity_type] = {}
            texts, exact, chars = aspect_text(orjson.loads(fields), weights[entity_type], max_chars)
            params["urn"].append(urn)
            params["aspect"].append(aspect)
            for key, text in zip("abcd", texts):
                params[key].append(text)
            params["exact"].append(orjson.dumps(exact).decode())
            params["chars"].append(chars)
        bind.execute(update, params)
        after = (rows[-1][0], rows[-1][1])


def downgrade() -> None:
    op.execute("DROP AGGREGATE search_array_concat(text[])")
    op.execute("DROP AGGREGATE search_tsvector_concat(tsvector)")
    op.execute("DROP AGGREGATE search_jsonb_merge(jsonb)")
    op.execute("ALTER TABLE search_aspect_fields DROP COLUMN text_chars")
    op.execute("ALTER TABLE search_aspect_fields DROP COLUMN exact_names")
    op.execute("ALTER TABLE search_aspect_fields DROP COLUMN search_vector")
