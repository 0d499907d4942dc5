"""The pure parts of the lineage walk (app.search.lineage) and of column-level lineage edges
(app.search.documents.field_lineage_edges): each rule alone, and where it must not fire."""

from __future__ import annotations

from app.search.documents import field_lineage_edges
from app.search.lineage import by_parent, schema_field_parent, steps
from app.search.model import Edge, edge_set_aspect

A, B, C = (f"urn:li:dataset:(urn:li:dataPlatform:hive,{n},PROD)" for n in "abc")
JOB = "urn:li:dataJob:(urn:li:dataFlow:(airflow,dag,PROD),task)"
QUERY = "urn:li:query:q"


def f(dataset: str, path: str) -> str:
    return f"urn:li:schemaField:({dataset},{path})"


def down(source: str, destination: str, via: str | None = None, relationship: str = "DownstreamOf") -> Edge:
    """`source` DownstreamOf `destination` (or another relationship of that direction)."""
    return Edge(source, destination, relationship, source.split(":")[2], destination.split(":")[2], via=via)


def test_schema_field_parent_is_everything_before_the_last_top_level_comma():
    assert schema_field_parent(f(A, "customer_email")) == A
    assert schema_field_parent(f(A, "[version=2.0].[type=struct].address.city")) == A
    assert schema_field_parent(A) is None
    assert schema_field_parent("urn:li:schemaField:(no_comma)") is None


def test_steps_each_entity_once_at_its_fewest_hops_with_a_path():
    walked = steps(A, "UPSTREAM", [(down(A, B), 1), (down(B, C), 2), (down(A, C), 1)])
    assert [(s.urn, s.degree, [u for u, _ in s.path]) for s in walked] == [(B, 1, [A, B]), (C, 1, [A, C])]


def test_steps_follow_produces_the_other_way_round():
    produces = Edge(JOB, B, "Produces", "dataJob", "dataset")
    consumes = Edge(JOB, A, "Consumes", "dataJob", "dataset")
    up = steps(B, "UPSTREAM", [(produces, 1), (consumes, 2)])
    assert [(s.urn, s.degree, s.edge.relationship) for s in up] == [(JOB, 1, "Produces"), (A, 2, "Consumes")]
    down_from_a = steps(A, "DOWNSTREAM", [(consumes, 1), (produces, 2)])
    assert [s.urn for s in down_from_a] == [JOB, B]


def test_steps_put_a_via_before_the_entity_it_leads_to():
    (step,) = steps(f(B, "x"), "UPSTREAM", [(down(f(B, "x"), f(A, "x"), via=QUERY), 1)])
    assert [u for u, _ in step.path] == [f(B, "x"), QUERY, f(A, "x")]
    # a via that is an end of the edge (a job's own edge) is not repeated
    (own,) = steps(JOB, "UPSTREAM", [(Edge(JOB, A, "Consumes", "dataJob", "dataset", via=JOB), 1)])
    assert [u for u, _ in own.path] == [JOB, A]


def test_steps_choose_the_path_by_the_edges_not_the_backends_order():
    edges = [(down(A, B), 1), (down(A, C), 1), (down(C, "urn:li:dataset:d"), 2), (down(B, "urn:li:dataset:d"), 2)]
    first = steps(A, "UPSTREAM", edges)
    second = steps(A, "UPSTREAM", list(reversed(edges)))
    assert [s.path for s in first] == [s.path for s in second]


def test_steps_ignore_edges_from_nowhere_the_walk_reached():
    assert steps(A, "UPSTREAM", [(down(B, C), 1)]) == []


def test_by_parent_groups_fields_into_their_dataset_with_a_path_each():
    walked = steps(
        f(C, "x"),
        "UPSTREAM",
        [(down(f(C, "x"), f(B, "x")), 1), (down(f(C, "x"), f(B, "y")), 1), (down(f(B, "x"), f(A, "x")), 2)],
    )
    grouped = by_parent(f(C, "x"), walked)
    assert [(g.urn, g.entity_type, g.degree, [p[-1][0] for p in g.paths]) for g in grouped] == [
        (B, "dataset", 1, [f(B, "x"), f(B, "y")]),
        (A, "dataset", 2, [f(A, "x")]),
    ]
    # entities that are not fields are their own group; the start is never a result
    assert [g.urn for g in by_parent(A, steps(A, "UPSTREAM", [(down(A, B), 1)]))] == [B]


def test_field_edges_from_fine_grained_lineage():
    value = {
        "upstreams": [{"dataset": A, "type": "TRANSFORMED"}],
        "fineGrainedLineages": [
            {"upstreams": [f(A, "x"), f(A, "y")], "downstreams": [f(B, "z")], "query": QUERY},
            {"upstreams": [], "downstreams": [f(B, "w")]},  # nothing upstream: no edge (and the rest still count)
            {"upstreams": [A], "downstreams": [f(B, "v")]},  # a dataset upstream: DataHub walks fields to fields only
            {"upstreams": [f(A, "x")], "downstreams": [f(B, "u")]},
        ],
    }
    edges = field_lineage_edges("upstreamLineage", B, "dataset", value)
    assert [(e.source, e.destination, e.relationship, e.via, e.is_lineage) for e in edges] == [
        (f(B, "z"), f(A, "x"), "DownstreamOf", QUERY, True),
        (f(B, "z"), f(A, "y"), "DownstreamOf", QUERY, True),
        (f(B, "u"), f(A, "x"), "DownstreamOf", None, True),
    ]
    # a job's: through the job
    (job_edge,) = field_lineage_edges(
        "dataJobInputOutput",
        JOB,
        "dataJob",
        {"fineGrainedLineages": [{"upstreams": [f(A, "x")], "downstreams": [f(B, "x")]}]},
    )
    assert job_edge.via == JOB
    # a chart's input fields: its own field DownstreamOf the one it reads
    (chart_edge,) = field_lineage_edges(
        "inputFields",
        "urn:li:chart:(looker,c)",
        "chart",
        {"fields": [{"schemaFieldUrn": f(A, "x"), "schemaField": {"fieldPath": "x", "nativeDataType": "s"}}]},
    )
    assert (chart_edge.source, chart_edge.destination) == (f("urn:li:chart:(looker,c)", "x"), f(A, "x"))
    # no other aspect declares any; no fine-grained entries, no edges
    assert field_lineage_edges("datasetProperties", B, "dataset", value) == ()
    assert field_lineage_edges("upstreamLineage", B, "dataset", {"upstreams": []}) == ()


def test_an_owned_edge_is_keyed_by_its_owner():
    own = down(B, A)
    owned = down(f(B, "x"), f(A, "x"))
    assert edge_set_aspect(B, "upstreamLineage", own) == "upstreamLineage"
    assert edge_set_aspect(B, "upstreamLineage", owned) == f"upstreamLineage\x1f{B}"
