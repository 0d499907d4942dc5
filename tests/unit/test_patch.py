"""DataHub PATCH semantics (app/write/patch.py).

Expected values are worked out by hand from DataHub's Java (entity-registry/.../aspect/patch/template/*,
TemplateUtil.populateTopLevelKeys, ArrayMergingTemplate, GenericPatchTemplate, PatchItemImpl.applyPatch) for the
payloads that the Python client's patch builders (metadata-ingestion/src/datahub/specific/*) emit.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from app.write.patch import (
    SYSTEM_ACTOR,
    TEMPLATED_ASPECTS,
    UNIT_SEPARATOR,
    PatchDocument,
    PatchError,
    apply_patch,
    parse_patch,
    template_default,
)

NOW = 1_700_000_000_000
SEP = UNIT_SEPARATOR
STAMP = {"actor": SYSTEM_ACTOR, "time": NOW}

TAG_KEYS = {"tags": [f"attribution{SEP}source", "tag"]}  # HasTagsPatch.add_tag
TAG_REMOVE_KEYS = {"tags": ["tag", f"attribution{SEP}source"]}  # remove_tag without attribution_source
TERM_KEYS = {"terms": ["urn", f"attribution{SEP}source"]}
OWNER_KEYS = {"owners": ["owner", "type", "typeUrn", f"attribution{SEP}source"]}

DS_A = "urn:li:dataset:(urn:li:dataPlatform:hive,db.a,PROD)"
DS_B = "urn:li:dataset:(urn:li:dataPlatform:hive,db.b,PROD)"
DS_S3 = "urn:li:dataset:(urn:li:dataPlatform:s3,bucket/dir/file.csv,PROD)"
DS_S3_ESC = "urn:li:dataset:(urn:li:dataPlatform:s3,bucket~1dir~1file.csv,PROD)"
JDOE = "urn:li:corpuser:jdoe"
ALICE = "urn:li:corpuser:alice"


def patch(aspect, current, doc, **kw):
    kw.setdefault("now_ms", NOW)
    return apply_patch(aspect, current, parse_patch(doc), **kw)


def generic(keys, ops):
    return {"arrayPrimaryKeys": keys, "patch": ops}


# ---------------------------------------------------------------------------------------------------------------
# globalTags (generic keyed patch, keys [attribution␟source, tag])
# ---------------------------------------------------------------------------------------------------------------


def test_tags_add_to_missing_aspect_starts_from_template_default():
    doc = generic(TAG_KEYS, [{"op": "add", "path": "/tags//urn:li:tag:gold", "value": {"tag": "urn:li:tag:gold"}}])
    assert patch("globalTags", None, doc) == {"tags": [{"tag": "urn:li:tag:gold"}]}


def test_tags_add_appends_and_keeps_existing_order():
    current = {"tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:b"}]}
    doc = generic(TAG_KEYS, [{"op": "add", "path": "/tags//urn:li:tag:gold", "value": {"tag": "urn:li:tag:gold"}}])
    assert patch("globalTags", current, doc) == {
        "tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:b"}, {"tag": "urn:li:tag:gold"}]
    }


def test_tags_add_existing_key_replaces_in_place():
    current = {"tags": [{"tag": "urn:li:tag:a", "context": "old"}, {"tag": "urn:li:tag:b"}]}
    doc = generic(TAG_KEYS, [{"op": "add", "path": "/tags//urn:li:tag:a", "value": {"tag": "urn:li:tag:a"}}])
    assert patch("globalTags", current, doc) == {"tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:b"}]}


def test_tags_map_order_groups_by_first_key_field():
    # The map is {source: {tag: element}} (LinkedHashMap order): a new unattributed tag joins the "" group,
    # which was created first, so it lands before the attributed tag.
    attributed = {"tag": "urn:li:tag:b", "attribution": {"source": "urn:li:dataHubAction:x", "actor": JDOE, "time": 1}}
    current = {"tags": [{"tag": "urn:li:tag:a"}, attributed]}
    doc = generic(TAG_KEYS, [{"op": "add", "path": "/tags//urn:li:tag:gold", "value": {"tag": "urn:li:tag:gold"}}])
    assert patch("globalTags", current, doc) == {
        "tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:gold"}, attributed]
    }


def test_tags_attributed_and_unattributed_entries_coexist():
    current = {"tags": [{"tag": "urn:li:tag:gold"}]}
    attributed = {
        "tag": "urn:li:tag:gold",
        "attribution": {"source": "urn:li:dataHubAction:x", "actor": JDOE, "time": 5},
    }
    doc = generic(
        TAG_KEYS, [{"op": "add", "path": "/tags/urn:li:dataHubAction:x/urn:li:tag:gold", "value": attributed}]
    )
    assert patch("globalTags", current, doc) == {"tags": [{"tag": "urn:li:tag:gold"}, attributed]}


def test_tags_remove_without_source_removes_every_source():
    # remove_tag("urn:li:tag:gold") reorders the keys to [tag, attribution␟source] and sends a key prefix.
    attributed = {
        "tag": "urn:li:tag:gold",
        "attribution": {"source": "urn:li:dataHubAction:x", "actor": JDOE, "time": 5},
    }
    current = {"tags": [{"tag": "urn:li:tag:gold"}, {"tag": "urn:li:tag:keep"}, attributed]}
    doc = generic(TAG_REMOVE_KEYS, [{"op": "remove", "path": "/tags/urn:li:tag:gold", "value": {}}])
    assert patch("globalTags", current, doc) == {"tags": [{"tag": "urn:li:tag:keep"}]}


def test_tags_remove_with_source_removes_only_that_entry():
    attributed = {
        "tag": "urn:li:tag:gold",
        "attribution": {"source": "urn:li:dataHubAction:x", "actor": JDOE, "time": 5},
    }
    current = {"tags": [{"tag": "urn:li:tag:gold"}, attributed]}
    doc = generic(TAG_KEYS, [{"op": "remove", "path": "/tags/urn:li:dataHubAction:x/urn:li:tag:gold", "value": {}}])
    assert patch("globalTags", current, doc) == {"tags": [{"tag": "urn:li:tag:gold"}]}


def test_tags_key_prefix_with_default_key_order_is_a_source_prefix():
    # With keys [attribution␟source, tag], a one-segment path names a *source*, not a tag.
    attributed = {"tag": "urn:li:tag:b", "attribution": {"source": "urn:li:dataHubAction:x", "actor": JDOE, "time": 5}}
    current = {"tags": [{"tag": "urn:li:tag:a"}, attributed]}
    by_source = generic(TAG_KEYS, [{"op": "remove", "path": "/tags/urn:li:dataHubAction:x"}])
    assert patch("globalTags", current, by_source) == {"tags": [{"tag": "urn:li:tag:a"}]}
    by_tag_name = generic(TAG_KEYS, [{"op": "remove", "path": "/tags/urn:li:tag:a"}])
    assert patch("globalTags", current, by_tag_name) == current  # no source is called urn:li:tag:a: no-op


def test_tags_remove_absent_is_a_noop():
    current = {"tags": [{"tag": "urn:li:tag:a"}]}
    doc = generic(TAG_REMOVE_KEYS, [{"op": "remove", "path": "/tags/urn:li:tag:zzz", "value": {}}])
    assert patch("globalTags", current, doc) == current


def test_tags_template_patch_plain_list_keyed_by_tag():
    # A plain RFC 6902 list on globalTags goes through GlobalTagsTemplate (key: tag).
    current = {"tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:b"}]}
    ops = [
        {"op": "remove", "path": "/tags/urn:li:tag:a"},
        {"op": "add", "path": "/tags/urn:li:tag:c", "value": {"tag": "urn:li:tag:c"}},
    ]
    assert patch("globalTags", current, ops) == {"tags": [{"tag": "urn:li:tag:b"}, {"tag": "urn:li:tag:c"}]}


# ---------------------------------------------------------------------------------------------------------------
# glossaryTerms (generic, keys [urn, attribution␟source]; paths end with an empty source segment)
# ---------------------------------------------------------------------------------------------------------------


def test_terms_add_on_missing_aspect_gets_template_default_audit_stamp():
    doc = generic(
        TERM_KEYS,
        [{"op": "add", "path": "/terms/urn:li:glossaryTerm:pii/", "value": {"urn": "urn:li:glossaryTerm:pii"}}],
    )
    assert patch("glossaryTerms", None, doc) == {"terms": [{"urn": "urn:li:glossaryTerm:pii"}], "auditStamp": STAMP}


def test_terms_add_and_remove_on_existing():
    stamp = {"time": 1, "actor": JDOE}
    current = {"terms": [{"urn": "urn:li:glossaryTerm:a"}, {"urn": "urn:li:glossaryTerm:b"}], "auditStamp": stamp}
    add = generic(
        TERM_KEYS,
        [{"op": "add", "path": "/terms/urn:li:glossaryTerm:c/", "value": {"urn": "urn:li:glossaryTerm:c"}}],
    )
    assert patch("glossaryTerms", current, add) == {
        "terms": [{"urn": "urn:li:glossaryTerm:a"}, {"urn": "urn:li:glossaryTerm:b"}, {"urn": "urn:li:glossaryTerm:c"}],
        "auditStamp": stamp,
    }
    remove = generic(TERM_KEYS, [{"op": "remove", "path": "/terms/urn:li:glossaryTerm:a", "value": {}}])
    assert patch("glossaryTerms", current, remove) == {"terms": [{"urn": "urn:li:glossaryTerm:b"}], "auditStamp": stamp}


def test_terms_template_patch_adds_missing_audit_stamp():
    # GlossaryTermsTemplate (plain list) sets the required auditStamp when absent; the generic patch does not.
    current = {"terms": [{"urn": "urn:li:glossaryTerm:a"}]}
    ops = [{"op": "remove", "path": "/terms/urn:li:glossaryTerm:a"}]
    assert patch("glossaryTerms", current, ops) == {"terms": [], "auditStamp": STAMP}
    g = generic(TERM_KEYS, ops)
    assert patch("glossaryTerms", current, g) == {"terms": []}


# ---------------------------------------------------------------------------------------------------------------
# ownership (generic, keys [owner, type, typeUrn, attribution␟source])
# ---------------------------------------------------------------------------------------------------------------


def test_owner_add_on_missing_aspect():
    doc = generic(
        OWNER_KEYS,
        [
            {
                "op": "add",
                "path": f"/owners/{JDOE}/TECHNICAL_OWNER//",
                "value": {"owner": JDOE, "type": "TECHNICAL_OWNER"},
            }
        ],
    )
    assert patch("ownership", None, doc) == {
        "owners": [{"owner": JDOE, "type": "TECHNICAL_OWNER"}],
        "lastModified": {"time": NOW, "actor": SYSTEM_ACTOR},
    }


def test_owner_add_replaces_same_owner_and_type_keeps_others():
    lm = {"time": 1, "actor": JDOE}
    current = {
        "owners": [
            {"owner": JDOE, "type": "TECHNICAL_OWNER", "source": {"type": "MANUAL"}},
            {"owner": JDOE, "type": "BUSINESS_OWNER"},
            {"owner": ALICE, "type": "TECHNICAL_OWNER"},
        ],
        "ownerTypes": {},
        "lastModified": lm,
    }
    doc = generic(
        OWNER_KEYS,
        [
            {
                "op": "add",
                "path": f"/owners/{JDOE}/TECHNICAL_OWNER//",
                "value": {"owner": JDOE, "type": "TECHNICAL_OWNER"},
            }
        ],
    )
    assert patch("ownership", current, doc) == {
        "owners": [
            {"owner": JDOE, "type": "TECHNICAL_OWNER"},
            {"owner": JDOE, "type": "BUSINESS_OWNER"},
            {"owner": ALICE, "type": "TECHNICAL_OWNER"},
        ],
        "ownerTypes": {},
        "lastModified": lm,
    }


def test_owner_with_type_urn_coexists_with_plain_type():
    current = {"owners": [{"owner": JDOE, "type": "CUSTOM"}], "lastModified": {"time": 1, "actor": JDOE}}
    value = {"owner": JDOE, "type": "CUSTOM", "typeUrn": "urn:li:ownershipType:steward"}
    doc = generic(
        OWNER_KEYS, [{"op": "add", "path": f"/owners/{JDOE}/CUSTOM/urn:li:ownershipType:steward/", "value": value}]
    )
    assert patch("ownership", current, doc)["owners"] == [{"owner": JDOE, "type": "CUSTOM"}, value]


def test_owner_remove_all_entries_of_an_owner():
    current = {
        "owners": [
            {"owner": JDOE, "type": "TECHNICAL_OWNER"},
            {"owner": ALICE, "type": "TECHNICAL_OWNER"},
            {"owner": JDOE, "type": "BUSINESS_OWNER"},
        ],
        "lastModified": {"time": 1, "actor": JDOE},
    }
    doc = generic(OWNER_KEYS, [{"op": "remove", "path": f"/owners/{JDOE}", "value": {}}])
    assert patch("ownership", current, doc)["owners"] == [{"owner": ALICE, "type": "TECHNICAL_OWNER"}]


def test_owner_remove_by_type():
    current = {
        "owners": [{"owner": JDOE, "type": "TECHNICAL_OWNER"}, {"owner": JDOE, "type": "BUSINESS_OWNER"}],
        "lastModified": {"time": 1, "actor": JDOE},
    }
    doc = generic(OWNER_KEYS, [{"op": "remove", "path": f"/owners/{JDOE}/TECHNICAL_OWNER", "value": {}}])
    assert patch("ownership", current, doc)["owners"] == [{"owner": JDOE, "type": "BUSINESS_OWNER"}]


def test_owner_remove_by_type_urn_reorders_keys():
    # remove_owner(owner, type_urn=...) with owner_type=None → keys [owner, typeUrn, type, attribution␟source].
    steward = {"owner": JDOE, "type": "CUSTOM", "typeUrn": "urn:li:ownershipType:steward"}
    current = {"owners": [{"owner": JDOE, "type": "CUSTOM"}, steward], "lastModified": {"time": 1, "actor": JDOE}}
    keys = {"owners": ["owner", "typeUrn", "type", f"attribution{SEP}source"]}
    doc = generic(keys, [{"op": "remove", "path": f"/owners/{JDOE}/urn:li:ownershipType:steward", "value": {}}])
    assert patch("ownership", current, doc)["owners"] == [{"owner": JDOE, "type": "CUSTOM"}]


def test_owners_set_replaces_whole_array_via_template():
    current = {"owners": [{"owner": JDOE, "type": "TECHNICAL_OWNER"}], "lastModified": {"time": 1, "actor": JDOE}}
    ops = [{"op": "add", "path": "/owners", "value": [{"owner": ALICE, "type": "DATAOWNER"}]}]
    assert patch("ownership", current, ops) == {
        "owners": [{"owner": ALICE, "type": "DATAOWNER"}],
        "lastModified": {"time": 1, "actor": JDOE},
    }


def test_owner_template_deep_path_add_reinjects_scalar_keys():
    # OwnershipTemplate keys [owner, type]; the element only carries "source": owner and type are restored.
    ops = [{"op": "add", "path": f"/owners/{JDOE}/DATAOWNER", "value": {"source": {"type": "MANUAL"}}}]
    result = patch("ownership", None, ops)
    assert result["owners"] == [{"source": {"type": "MANUAL"}, "type": "DATAOWNER", "owner": JDOE}]


# ---------------------------------------------------------------------------------------------------------------
# upstreamLineage (template: upstreams keyed by dataset; fineGrainedLineages)
# ---------------------------------------------------------------------------------------------------------------


def _upstream(ds):
    return {"auditStamp": {"time": 0, "actor": "urn:li:corpuser:unknown"}, "dataset": ds, "type": "TRANSFORMED"}


def test_upstream_add_on_missing_aspect():
    ops = [{"op": "add", "path": f"/upstreams/{DS_A}", "value": _upstream(DS_A)}]
    assert patch("upstreamLineage", None, ops) == {"upstreams": [_upstream(DS_A)], "fineGrainedLineages": []}


def test_upstream_add_with_slash_in_urn_and_remove():
    current = {"upstreams": [_upstream(DS_A)]}
    add = [{"op": "add", "path": f"/upstreams/{DS_S3_ESC}", "value": _upstream(DS_S3)}]
    after_add = patch("upstreamLineage", current, add)
    # fineGrainedLineages is always written back (empty array when there were none)
    assert after_add == {"upstreams": [_upstream(DS_A), _upstream(DS_S3)], "fineGrainedLineages": []}
    remove = [{"op": "remove", "path": f"/upstreams/{DS_S3_ESC}", "value": {}}]
    assert patch("upstreamLineage", after_add, remove) == {"upstreams": [_upstream(DS_A)], "fineGrainedLineages": []}


def test_upstream_patch_normalises_existing_fine_grained_lineages():
    f_a = f"urn:li:schemaField:({DS_A},c1)"
    f_b = f"urn:li:schemaField:({DS_B},c1)"
    current = {
        "upstreams": [_upstream(DS_A)],
        "fineGrainedLineages": [
            {"upstreamType": "FIELD_SET", "upstreams": [f_a], "downstreamType": "FIELD", "downstreams": [f_b]}
        ],
    }
    ops = [{"op": "remove", "path": f"/upstreams/{DS_A}"}]
    assert patch("upstreamLineage", current, ops) == {
        "upstreams": [],
        "fineGrainedLineages": [
            {
                "downstreams": [f_b],
                "upstreams": [f_a],
                "upstreamType": "FIELD_SET",
                "downstreamType": "FIELD",
                "confidenceScore": 1.0,
                "transformOperation": "NONE",
            }
        ],
    }


def test_fine_grained_lineage_builder_add_and_remove():
    f_a = f"urn:li:schemaField:({DS_A},c1)"
    f_b = f"urn:li:schemaField:({DS_B},c1)"
    f_b2 = f"urn:li:schemaField:({DS_B},c2)"
    # add_fine_grained_lineage: one op per upstream, value {"confidenceScore": ...}
    ops = [
        {
            "op": "add",
            "path": f"/fineGrainedLineages/TRANSFORM/{f_b}/urn:li:query:q1/{f_a}",
            "value": {"confidenceScore": 0.9},
        },
        {
            "op": "add",
            "path": f"/fineGrainedLineages/TRANSFORM/{f_b}/urn:li:query:q1/{f_b2}",
            "value": {"confidenceScore": 0.5},
        },
    ]
    result = patch("upstreamLineage", {"upstreams": []}, ops)
    assert result == {
        "upstreams": [],
        "fineGrainedLineages": [
            {
                "downstreams": [f_b],
                "upstreams": [f_a, f_b2],
                "query": "urn:li:query:q1",
                "upstreamType": "FIELD_SET",
                "downstreamType": "FIELD",
                "confidenceScore": 0.5,  # the lowest score of the group
                "transformOperation": "TRANSFORM",
            }
        ],
    }
    remove = [{"op": "remove", "path": f"/fineGrainedLineages/TRANSFORM/{f_b}/urn:li:query:q1/{f_b2}", "value": {}}]
    after = patch("upstreamLineage", result, remove)
    # re-transformed from the array: the stored score (0.5) is now the score of the remaining upstream
    assert after["fineGrainedLineages"] == [
        {
            "downstreams": [f_b],
            "upstreams": [f_a],
            "query": "urn:li:query:q1",
            "upstreamType": "FIELD_SET",
            "downstreamType": "FIELD",
            "confidenceScore": 0.5,
            "transformOperation": "TRANSFORM",
        }
    ]
    remove_last = [{"op": "remove", "path": f"/fineGrainedLineages/TRANSFORM/{f_b}/urn:li:query:q1/{f_a}"}]
    assert patch("upstreamLineage", after, remove_last)["fineGrainedLineages"] == []


def test_fine_grained_lineage_dataset_upstream_type_is_inferred():
    current = {
        "upstreams": [],
        "fineGrainedLineages": [{"upstreams": [DS_A], "downstreams": [f"urn:li:schemaField:({DS_B},c)"]}],
    }
    result = patch("upstreamLineage", current, [{"op": "add", "path": "/upstreams/" + DS_A, "value": _upstream(DS_A)}])
    assert result["fineGrainedLineages"][0]["upstreamType"] == "DATASET"


def test_fine_grained_lineage_with_two_downstreams_cannot_be_patched():
    fgl = {
        "upstreamType": "DATASET",
        "upstreams": [DS_A],
        "downstreamType": "FIELD_SET",
        "downstreams": ["urn:li:schemaField:(x,a)", "urn:li:schemaField:(x,b)"],
    }
    current = {"upstreams": [], "fineGrainedLineages": [fgl]}
    with pytest.raises(PatchError, match="not exactly one downstream"):
        patch("upstreamLineage", current, [{"op": "add", "path": "/upstreams/" + DS_B, "value": _upstream(DS_B)}])


# ---------------------------------------------------------------------------------------------------------------
# datasetProperties (template: customProperties map, tags string array)
# ---------------------------------------------------------------------------------------------------------------


def test_custom_property_add_creates_missing_map():
    current = {"name": "orders"}
    ops = [
        {"op": "add", "path": "/description", "value": "patched desc"},
        {"op": "add", "path": "/customProperties/k", "value": "v"},
    ]
    # DatasetPropertiesTemplate always writes back the (string) tags array
    assert patch("datasetProperties", current, ops) == {
        "name": "orders",
        "tags": [],
        "customProperties": {"k": "v"},
        "description": "patched desc",
    }


def test_custom_property_add_on_missing_aspect():
    ops = [{"op": "add", "path": "/customProperties/k", "value": "v"}]
    assert patch("datasetProperties", None, ops) == {"tags": [], "customProperties": {"k": "v"}}


def test_custom_property_replace_value_and_remove():
    current = {"customProperties": {"a": "1", "b": "2"}, "tags": []}
    ops = [
        {"op": "add", "path": "/customProperties/a", "value": "one"},
        {"op": "remove", "path": "/customProperties/b", "value": {}},
    ]
    assert patch("datasetProperties", current, ops) == {"customProperties": {"a": "one"}, "tags": []}


def test_custom_property_remove_absent_is_noop():
    current = {"customProperties": {"a": "1"}, "tags": []}
    assert patch("datasetProperties", current, [{"op": "remove", "path": "/customProperties/zz"}]) == current


def test_custom_properties_set_replaces_all():
    current = {"customProperties": {"a": "1", "b": "2"}, "tags": [], "name": "n"}
    ops = [{"op": "add", "path": "/customProperties", "value": {"c": "3"}}]
    assert patch("datasetProperties", current, ops) == {"customProperties": {"c": "3"}, "tags": [], "name": "n"}


def test_custom_property_key_with_slash_and_tilde():
    ops = [{"op": "add", "path": "/customProperties/a~1b~0c", "value": "v"}]
    assert patch("datasetProperties", None, ops) == {"tags": [], "customProperties": {"a/b~c": "v"}}


def test_custom_property_on_datajob_info_and_dataflow_info():
    ops = [{"op": "add", "path": "/customProperties/k", "value": "v"}]
    assert patch("dataJobInfo", None, ops) == {"customProperties": {"k": "v"}}
    assert patch("dataFlowInfo", {"name": "flow"}, ops) == {"name": "flow", "customProperties": {"k": "v"}}


# ---------------------------------------------------------------------------------------------------------------
# editableSchemaMetadata (fieldPath-keyed; nested globalTags / glossaryTerms templates)
# ---------------------------------------------------------------------------------------------------------------

ESM_STAMP = {"time": 1, "actor": JDOE}


def test_field_tag_add_on_missing_aspect():
    ops = [
        {
            "op": "add",
            "path": "/editableSchemaFieldInfo/address~1zip/globalTags/tags/urn:li:tag:pii",
            "value": {"tag": "urn:li:tag:pii"},
        }
    ]
    assert patch("editableSchemaMetadata", None, ops) == {
        "created": STAMP,
        "lastModified": STAMP,
        "editableSchemaFieldInfo": [{"globalTags": {"tags": [{"tag": "urn:li:tag:pii"}]}, "fieldPath": "address/zip"}],
    }


def test_field_tags_and_terms_add_remove_on_existing():
    current = {
        "created": ESM_STAMP,
        "lastModified": ESM_STAMP,
        "editableSchemaFieldInfo": [
            {
                "fieldPath": "id",
                "description": "key",
                "globalTags": {"tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:b"}]},
            },
            {
                "fieldPath": "name",
                "glossaryTerms": {"terms": [{"urn": "urn:li:glossaryTerm:t1"}], "auditStamp": ESM_STAMP},
            },
        ],
    }
    ops = [
        {"op": "remove", "path": "/editableSchemaFieldInfo/id/globalTags/tags/urn:li:tag:a", "value": {}},
        {
            "op": "add",
            "path": "/editableSchemaFieldInfo/id/globalTags/tags/urn:li:tag:c",
            "value": {"tag": "urn:li:tag:c"},
        },
        {
            "op": "add",
            "path": "/editableSchemaFieldInfo/name/glossaryTerms/terms/urn:li:glossaryTerm:t2",
            "value": {"urn": "urn:li:glossaryTerm:t2"},
        },
        {
            "op": "remove",
            "path": "/editableSchemaFieldInfo/name/glossaryTerms/terms/urn:li:glossaryTerm:t1",
            "value": {},
        },
        {"op": "add", "path": "/editableSchemaFieldInfo/name/description", "value": "the name"},
    ]
    assert patch("editableSchemaMetadata", current, ops) == {
        "created": ESM_STAMP,
        "lastModified": ESM_STAMP,
        "editableSchemaFieldInfo": [
            {
                "fieldPath": "id",
                "description": "key",
                "globalTags": {"tags": [{"tag": "urn:li:tag:b"}, {"tag": "urn:li:tag:c"}]},
            },
            {
                "fieldPath": "name",
                "glossaryTerms": {"terms": [{"urn": "urn:li:glossaryTerm:t2"}], "auditStamp": ESM_STAMP},
                "description": "the name",
            },
        ],
    }


def test_field_term_add_creates_glossary_terms_with_audit_stamp():
    current = {"created": ESM_STAMP, "lastModified": ESM_STAMP, "editableSchemaFieldInfo": [{"fieldPath": "id"}]}
    ops = [
        {
            "op": "add",
            "path": "/editableSchemaFieldInfo/id/glossaryTerms/terms/urn:li:glossaryTerm:t",
            "value": {"urn": "urn:li:glossaryTerm:t"},
        }
    ]
    assert patch("editableSchemaMetadata", current, ops)["editableSchemaFieldInfo"] == [
        {"fieldPath": "id", "glossaryTerms": {"terms": [{"urn": "urn:li:glossaryTerm:t"}], "auditStamp": STAMP}}
    ]


def test_field_tag_remove_on_unknown_field_creates_empty_entry_like_datahub():
    # populateTopLevelKeys creates the whole path before a remove, so the field entry appears (DataHub quirk).
    current = {"created": ESM_STAMP, "lastModified": ESM_STAMP, "editableSchemaFieldInfo": []}
    ops = [{"op": "remove", "path": "/editableSchemaFieldInfo/ghost/globalTags/tags/urn:li:tag:a", "value": {}}]
    assert patch("editableSchemaMetadata", current, ops)["editableSchemaFieldInfo"] == [
        {"globalTags": {"tags": []}, "fieldPath": "ghost"}
    ]


# ---------------------------------------------------------------------------------------------------------------
# chartInfo / dashboardInfo / dataJobInputOutput edges (keyed by destinationUrn)
# ---------------------------------------------------------------------------------------------------------------


def _edge(urn):
    return {"destinationUrn": urn}


def test_chart_input_edge_add_on_missing_aspect():
    ops = [{"op": "add", "path": f"/inputEdges/{DS_S3_ESC}", "value": _edge(DS_S3)}]
    assert patch("chartInfo", None, ops) == {
        "description": "",
        "title": "",
        "lastModified": {"created": STAMP, "lastModified": STAMP},
        "inputEdges": [_edge(DS_S3)],
        "inputs": [],
    }


def test_chart_input_edge_remove_and_legacy_inputs_add():
    lm = {"created": ESM_STAMP, "lastModified": ESM_STAMP}
    current = {"title": "t", "description": "d", "lastModified": lm, "inputEdges": [_edge(DS_A), _edge(DS_B)]}
    ops = [
        {"op": "remove", "path": f"/inputEdges/{DS_A}", "value": {}},
        {"op": "add", "path": f"/inputs/{DS_A}", "value": DS_A},  # ChartPatchBuilder.add_inputs
    ]
    assert patch("chartInfo", current, ops) == {
        "title": "t",
        "description": "d",
        "lastModified": lm,
        "inputEdges": [_edge(DS_B)],
        "inputs": [DS_A],
    }


def test_dashboard_chart_and_dataset_edges():
    lm = {"created": ESM_STAMP, "lastModified": ESM_STAMP}
    chart1, chart2 = "urn:li:chart:(looker,c1)", "urn:li:chart:(looker,c2)"
    current = {"title": "t", "description": "d", "lastModified": lm, "chartEdges": [_edge(chart1)], "datasets": [DS_A]}
    ops = [
        {"op": "add", "path": f"/chartEdges/{chart2}", "value": _edge(chart2)},
        {"op": "remove", "path": f"/chartEdges/{chart1}", "value": {}},
        {"op": "add", "path": f"/datasetEdges/{DS_B}", "value": _edge(DS_B)},
        {"op": "add", "path": f"/datasets/{DS_B}", "value": DS_B},
    ]
    assert patch("dashboardInfo", current, ops) == {
        "title": "t",
        "description": "d",
        "lastModified": lm,
        "chartEdges": [_edge(chart2)],
        "datasets": [DS_A, DS_B],
        "datasetEdges": [_edge(DS_B)],
        "dashboards": [],
        "charts": [],
    }


def test_dashboard_default():
    assert patch("dashboardInfo", None, [{"op": "add", "path": "/title", "value": "T"}]) == {
        "title": "T",
        "description": "",
        "lastModified": {"created": STAMP, "lastModified": STAMP},
        "chartEdges": [],
        "datasetEdges": [],
        "datasets": [],
        "charts": [],
        "dashboards": [],
    }


def test_datajob_inlets_outlets():
    job = "urn:li:dataJob:(urn:li:dataFlow:(airflow,dag,PROD),task)"
    current = {"inputDatasets": [], "outputDatasets": [], "inputDatasetEdges": [_edge(DS_A)]}
    ops = [
        {"op": "add", "path": f"/inputDatasetEdges/{DS_B}", "value": _edge(DS_B)},
        {"op": "remove", "path": f"/inputDatasetEdges/{DS_A}", "value": {}},
        {"op": "add", "path": f"/outputDatasetEdges/{DS_S3_ESC}", "value": _edge(DS_S3)},
        {"op": "add", "path": f"/inputDatajobEdges/{job}", "value": _edge(job)},
    ]
    assert patch("dataJobInputOutput", current, ops) == {
        "inputDatasets": [],
        "outputDatasets": [],
        "inputDatasetEdges": [_edge(DS_B)],
        "inputDatajobEdges": [_edge(job)],
        "outputDatasetEdges": [_edge(DS_S3)],
        "inputDatasetFields": [],
        "outputDatasetFields": [],
        "fineGrainedLineages": [],
    }
    removed = patch(
        "dataJobInputOutput", current, [{"op": "remove", "path": f"/outputDatasetEdges/{DS_A}", "value": {}}]
    )
    assert removed["outputDatasetEdges"] == []


def test_datajob_default():
    ops = [{"op": "add", "path": f"/outputDatasetEdges/{DS_A}", "value": _edge(DS_A)}]
    assert patch("dataJobInputOutput", None, ops) == {
        "inputDatajobEdges": [],
        "inputDatasetEdges": [],
        "outputDatasetEdges": [_edge(DS_A)],
        "fineGrainedLineages": [],
        "inputDatasetFields": [],
        "outputDatasetFields": [],
        "inputDatajobs": [],
        "inputDatasets": [],
        "outputDatasets": [],
    }


def test_datajob_input_dataset_field_add_reproduces_datahub_value():
    # add_input_dataset_field sends value {}: the string-array template keeps the value, so DataHub produces
    # [{}] (which then fails validation as a urn array). We reproduce the template result as is.
    field = f"urn:li:schemaField:({DS_A},c)"
    ops = [{"op": "add", "path": f"/inputDatasetFields/{field}", "value": {}}]
    assert patch("dataJobInputOutput", {}, ops)["inputDatasetFields"] == [{}]


# ---------------------------------------------------------------------------------------------------------------
# Other templates
# ---------------------------------------------------------------------------------------------------------------


def test_status_siblings_domains_editable_properties():
    assert patch("status", None, [{"op": "add", "path": "/removed", "value": True}]) == {"removed": True}
    assert patch("siblings", None, [{"op": "add", "path": f"/siblings/{DS_A}", "value": DS_A}]) == {
        "siblings": [DS_A],
        "primary": False,
    }
    assert patch(
        "siblings",
        {"siblings": [DS_A, DS_B], "primary": True},
        [{"op": "remove", "path": f"/siblings/{DS_A}", "value": {}}],
    ) == {
        "siblings": [DS_B],
        "primary": True,
    }
    assert patch("domains", None, [{"op": "add", "path": "/domains/urn:li:domain:d", "value": "urn:li:domain:d"}]) == {
        "domains": ["urn:li:domain:d"]
    }
    assert patch("editableDatasetProperties", None, [{"op": "add", "path": "/description", "value": "x"}]) == {
        "description": "x"
    }


def test_structured_properties_generic_and_documentation():
    keys = {"properties": ["propertyUrn", f"attribution{SEP}source"]}
    prop = "urn:li:structuredProperty:io.acryl.retention"
    value = {"propertyUrn": prop, "values": [{"double": 30.0}]}
    doc = generic(keys, [{"op": "add", "path": f"/properties/{prop}/", "value": value}])
    assert patch("structuredProperties", None, doc) == {"properties": [value]}
    docs_keys = {"documentations": [f"attribution{SEP}source"]}
    d = {"documentation": "hello"}
    assert patch(
        "documentation", None, generic(docs_keys, [{"op": "add", "path": "/documentations/", "value": d}])
    ) == {"documentations": [d]}


def test_data_product_assets():
    ops = [{"op": "add", "path": f"/assets/{DS_A}", "value": {"destinationUrn": DS_A}}]
    assert patch("dataProductProperties", {"name": "dp"}, ops) == {"name": "dp", "assets": [{"destinationUrn": DS_A}]}


def test_version_properties_without_current_value_is_refused():
    with pytest.raises(PatchError, match="Default aspect is required"):
        patch("versionProperties", None, [{"op": "add", "path": "/isLatest", "value": True}])


def test_templated_aspect_list_matches_datahub():
    assert TEMPLATED_ASPECTS == {
        "ownership", "datasetProperties", "upstreamLineage", "documentation", "globalTags",
        "editableSchemaMetadata", "glossaryTerms", "dataFlowInfo", "dataJobInfo", "dataProductProperties",
        "chartInfo", "dashboardInfo", "dataJobInputOutput", "structuredProperties", "propertyDefinition",
        "formInfo", "versionProperties", "siblings", "status", "domains", "editableDatasetProperties",
        "editableContainerProperties", "editableMlModelGroupProperties",
    }  # fmt: skip
    assert len(TEMPLATED_ASPECTS) == 23
    assert template_default("globalTags") == {"tags": []}
    assert template_default("ownership", now_ms=7) == {"owners": [], "lastModified": {"time": 7, "actor": SYSTEM_ACTOR}}
    assert template_default("versionProperties") is None
    assert template_default("containerProperties") is None


def test_envelope_without_keys_uses_the_template():
    # OpenAPI wraps a plain list as {"patch": [...]}: no arrayPrimaryKeys → still the template engine.
    current = {"tags": [{"tag": "urn:li:tag:a"}]}
    doc = {"patch": [{"op": "remove", "path": "/tags/urn:li:tag:a"}]}
    assert patch("globalTags", current, doc) == {"tags": []}


# ---------------------------------------------------------------------------------------------------------------
# Generic keyed patches on aspects without a template, forceGenericPatch
# ---------------------------------------------------------------------------------------------------------------


def test_generic_patch_on_non_templated_aspect_with_nested_keys():
    # institutionalMemory (no template): elements keyed by [createStamp␟actor, url]
    cur = {
        "elements": [
            {"url": "https://a", "description": "A", "createStamp": {"time": 1, "actor": JDOE}},
            {"url": "https://b", "description": "B", "createStamp": {"time": 1, "actor": ALICE}},
        ]
    }
    keys = {"elements": [f"createStamp{SEP}actor", "url"]}
    new = {"url": "https://c", "description": "C", "createStamp": {"time": 2, "actor": JDOE}}
    doc = generic(
        keys,
        [
            {"op": "add", "path": f"/elements/{JDOE}/https:~1~1c", "value": new},
            {"op": "remove", "path": f"/elements/{ALICE}"},
        ],
    )
    assert patch("institutionalMemory", cur, doc) == {"elements": [cur["elements"][0], new]}
    assert patch(
        "institutionalMemory",
        None,
        generic(keys, [{"op": "add", "path": f"/elements/{JDOE}/https:~1~1c", "value": new}]),
    ) == {"elements": [new]}


def test_generic_patch_reinjects_flat_scalar_key_only():
    keys = {"elements": ["url"]}
    doc = generic(keys, [{"op": "add", "path": "/elements/https:~1~1x", "value": {"description": "X"}}])
    assert patch("institutionalMemory", None, doc) == {"elements": [{"description": "X", "url": "https://x"}]}
    # GenericPatchTemplateTest.testRecordTypedFlatKeyFieldIsNotReinjectedAsString
    tags_doc = generic(
        {"tags": ["attribution", "source"]},
        [
            {
                "op": "add",
                "path": "/tags/urn:li:platformResource:my-source/urn:li:tag:tag1",
                "value": {"tag": "urn:li:tag:tag1"},
            }
        ],
    )
    assert patch("globalTags", {"tags": []}, tags_doc) == {"tags": [{"tag": "urn:li:tag:tag1"}]}


def test_force_generic_patch_bypasses_template():
    current = {"name": "x"}
    doc = {"patch": [{"op": "add", "path": "/customProperties/k", "value": "v"}], "forceGenericPatch": True}
    # no "tags": [] written back (the template is bypassed), but missing parents are still created
    assert patch("datasetProperties", current, doc) == {"name": "x", "customProperties": {"k": "v"}}


def test_reinjection_uses_the_registry_schema_when_given():
    from app.registry import load_registry

    registry = load_registry(Path(__file__).resolve().parents[2] / "entity_registry.yml")
    schema = registry.aspect_spec("ownership").type
    ops = [{"op": "add", "path": f"/owners/{JDOE}/DATAOWNER", "value": {}}]
    result = patch("ownership", None, ops, schema=schema)
    assert result["owners"] == [{"type": "DATAOWNER", "owner": JDOE}]
    # Owner.source is a record: a key path segment is never injected into it
    doc = generic(
        {"owners": ["owner", "source"]}, [{"op": "add", "path": f"/owners/{JDOE}/MANUAL", "value": {"type": "NONE"}}]
    )
    assert patch("ownership", {"owners": []}, doc, schema=schema)["owners"] == [{"type": "NONE", "owner": JDOE}]
    esm = registry.aspect_spec("editableSchemaMetadata").type
    ops = [{"op": "add", "path": "/editableSchemaFieldInfo/f/globalTags/tags/urn:li:tag:t", "value": {"context": "c"}}]
    assert patch("editableSchemaMetadata", None, ops, schema=esm)["editableSchemaFieldInfo"] == [
        {"globalTags": {"tags": [{"context": "c", "tag": "urn:li:tag:t"}]}, "fieldPath": "f"}
    ]


# ---------------------------------------------------------------------------------------------------------------
# Plain RFC 6902 on aspects without a template
# ---------------------------------------------------------------------------------------------------------------


def test_rfc6902_on_non_templated_aspect():
    current = {"name": "c", "customProperties": {"a": "1"}, "tags": ["x", "y"]}
    ops = [
        {"op": "replace", "path": "/name", "value": "c2"},
        {"op": "add", "path": "/customProperties/b", "value": "2"},
        {"op": "add", "path": "/tags/-", "value": "z"},
        {"op": "remove", "path": "/tags/0"},
        {"op": "copy", "from": "/name", "path": "/qualifiedName"},
        {"op": "move", "from": "/customProperties/a", "path": "/customProperties/c"},
        {"op": "test", "path": "/qualifiedName", "value": "c2"},
    ]
    assert patch("containerProperties", current, ops) == {
        "name": "c2",
        "customProperties": {"b": "2", "c": "1"},
        "tags": ["y", "z"],
        "qualifiedName": "c2",
    }


def test_rfc6902_on_missing_value_starts_from_empty_object():
    assert patch("containerProperties", None, [{"op": "add", "path": "/name", "value": "n"}]) == {"name": "n"}


def test_rfc6902_is_strict_about_missing_parents():
    with pytest.raises(PatchError) as e:
        patch(
            "containerProperties",
            {"name": "n"},
            [{"op": "add", "path": "/name", "value": "m"}, {"op": "add", "path": "/customProperties/k", "value": "v"}],
        )
    assert str(e.value) == "op 1 (add /customProperties/k): path not found"
    assert (e.value.index, e.value.op, e.value.path) == (1, "add", "/customProperties/k")


def test_rfc6902_remove_missing_and_failed_test():
    with pytest.raises(PatchError, match=r"^op 0 \(remove /tags/urn:li:tag:x\): path not found$"):
        patch("containerProperties", {"tags": {}}, [{"op": "remove", "path": "/tags/urn:li:tag:x"}])
    with pytest.raises(PatchError, match=r"^op 0 \(test /name\): test failed"):
        patch("containerProperties", {"name": "a"}, [{"op": "test", "path": "/name", "value": "b"}])


def test_template_replace_of_absent_leaf_fails():
    # populateTopLevelKeys only creates the parents for a replace: the leaf must exist
    with pytest.raises(PatchError, match=r"^op 0 \(replace /customProperties/k\): path not found$"):
        patch("datasetProperties", {}, [{"op": "replace", "path": "/customProperties/k", "value": "v"}])


def test_patched_root_must_stay_an_object():
    with pytest.raises(PatchError, match="not an object"):
        patch("containerProperties", {}, [{"op": "add", "path": "", "value": [1]}])


def test_keyed_field_replaced_by_scalar_is_an_error():
    with pytest.raises(PatchError, match="tags"):
        patch("globalTags", {"tags": []}, [{"op": "add", "path": "/tags", "value": "oops"}])


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------


def test_parse_forms():
    ops = [{"op": "add", "path": "/a", "value": 1}]
    plain = parse_patch(ops)
    assert isinstance(plain, PatchDocument) and not plain.generic and not plain.envelope
    assert plain.to_json() == ops
    env = parse_patch({"arrayPrimaryKeys": TAG_KEYS, "patch": ops})
    assert env.generic and env.array_primary_keys == {"tags": (f"attribution{SEP}source", "tag")}
    assert env.to_json() == {"patch": ops, "arrayPrimaryKeys": TAG_KEYS}
    assert parse_patch({"patch": ops, "forceGenericPatch": True}).generic
    assert not parse_patch({"patch": ops, "arrayPrimaryKeys": {}, "forceGenericPatch": False}).generic
    # JSON text (Rest.li sends the aspect value as a string), with the escaped separator
    text = json.dumps({"arrayPrimaryKeys": TAG_KEYS, "patch": ops})
    assert "\\u241f" in text
    assert parse_patch(text) == env
    assert parse_patch(text.encode()) == env
    # op names are normalised; unknown members are dropped (RFC 6902 §4)
    assert parse_patch([{"op": "ADD", "path": "/a", "value": 1, "x": 2}]).operations == (
        {"op": "add", "path": "/a", "value": 1},
    )
    # remove ops may carry a value (the client sends {}); it is ignored
    assert parse_patch([{"op": "remove", "path": "/a", "value": {}}]).operations == ({"op": "remove", "path": "/a"},)
    assert parse_patch([{"op": "add", "path": "/a", "value": None}]).operations[0]["value"] is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (42, r"^Invalid JSON Patch: expected an array of operations"),
        ("{not json", r"^Invalid JSON Patch: not JSON"),
        ({"arrayPrimaryKeys": {}}, r'^Invalid JSON Patch: an object must carry the operations in a "patch" array$'),
        ({"patch": {}}, r'"patch" must be an array'),
        ({"patch": [], "extra": 1}, r"unknown member\(s\) extra"),
        ({"patch": [], "arrayPrimaryKeys": ["tags"]}, r'"arrayPrimaryKeys" must be an object'),
        ({"patch": [], "arrayPrimaryKeys": {"tags": "tag"}}, r'"arrayPrimaryKeys.tags" must be an array'),
        ({"patch": [], "forceGenericPatch": "yes"}, r'"forceGenericPatch" must be a boolean'),
        (["add"], r"^op 0: an operation must be an object, got str$"),
        ([{"path": "/a"}], r'^op 0 \(\? /a\): missing "op"$'),
        ([{"op": "merge", "path": "/a"}], r"^op 0 \(merge /a\): unsupported operation 'merge'"),
        ([{"op": "add", "value": 1}], r'^op 0 \(add \?\): missing "path"$'),
        ([{"op": "add", "path": 3, "value": 1}], r'"path" must be a string'),
        ([{"op": "add", "path": "a", "value": 1}], r'^op 0 \(add a\): "path" must be "" or start with "/"'),
        ([{"op": "add", "path": "/a~2b", "value": 1}], r"invalid JSON pointer"),
        ([{"op": "remove", "path": "/a"}, {"op": "add", "path": "/b"}], r'^op 1 \(add /b\): missing "value"$'),
        ([{"op": "move", "path": "/b"}], r'^op 0 \(move /b\): missing "from"$'),
    ],
)
def test_malformed_documents(value, message):
    with pytest.raises(PatchError, match=message):
        parse_patch(value)


def test_apply_accepts_raw_documents_too():
    assert apply_patch("status", None, [{"op": "add", "path": "/removed", "value": True}]) == {"removed": True}


def test_current_must_be_an_object():
    with pytest.raises(PatchError, match="not a JSON object"):
        apply_patch("status", ["x"], [{"op": "add", "path": "/removed", "value": True}])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# Immutability
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("aspect", "current", "doc"),
    [
        (
            "globalTags",
            {"tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:b", "context": "c"}]},
            generic(TAG_KEYS, [{"op": "add", "path": "/tags//urn:li:tag:b", "value": {"tag": "urn:li:tag:b"}}]),
        ),
        (
            "ownership",
            {"owners": [{"owner": JDOE, "type": "DATAOWNER"}], "lastModified": {"time": 1, "actor": JDOE}},
            [{"op": "add", "path": f"/owners/{ALICE}/DATAOWNER", "value": {}}],
        ),
        (
            "editableSchemaMetadata",
            {
                "created": ESM_STAMP,
                "lastModified": ESM_STAMP,
                "editableSchemaFieldInfo": [{"fieldPath": "f", "glossaryTerms": {"terms": []}}],
            },
            [{"op": "add", "path": "/editableSchemaFieldInfo/f/globalTags/tags/urn:li:tag:t", "value": {}}],
        ),
        (
            "upstreamLineage",
            {
                "upstreams": [],
                "fineGrainedLineages": [{"upstreams": [DS_A], "downstreams": ["urn:li:schemaField:(x,c)"]}],
            },
            [{"op": "add", "path": f"/upstreams/{DS_B}", "value": {"dataset": DS_B, "type": "COPY"}}],
        ),
        (
            "containerProperties",
            {"name": "a", "customProperties": {"k": "v"}},
            [{"op": "remove", "path": "/customProperties/k"}],
        ),
    ],
)
def test_current_and_document_are_not_mutated(aspect, current, doc):
    before = copy.deepcopy(current)
    document = parse_patch(doc)
    doc_before = copy.deepcopy(document.to_json())
    first = apply_patch(aspect, current, document, now_ms=NOW)
    assert current == before
    assert document.to_json() == doc_before
    # no aliasing: mutating the result does not reach `current`, and a second run gives the same value
    second = apply_patch(aspect, current, document, now_ms=NOW)
    assert first == second
    first.clear()
    assert current == before
