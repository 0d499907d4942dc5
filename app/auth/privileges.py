"""DataHub's privileges (its PoliciesConfig names): which one a write of an aspect needs, and which ones each of
metaledger's roles holds without a policy.

Declared once here; the decision (app.auth.decision), the policy checks (app.auth.policies), the explain answer and
the docs' table are derived from these names.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.auth.model import Role

# --- platform privileges (no resource) ------------------------------------------------------------------------------
MANAGE_POLICIES = "MANAGE_POLICIES"
MANAGE_INGESTION = "MANAGE_INGESTION"
MANAGE_ACCESS_TOKENS = "MANAGE_ACCESS_TOKENS"
GENERATE_PERSONAL_ACCESS_TOKENS = "GENERATE_PERSONAL_ACCESS_TOKENS"
MANAGE_SYSTEM_OPERATIONS = "MANAGE_SYSTEM_OPERATIONS"
GET_PLATFORM_EVENTS = "GET_PLATFORM_EVENTS"
PLATFORM_PRIVILEGES = frozenset(
    {
        MANAGE_POLICIES,
        MANAGE_INGESTION,
        MANAGE_ACCESS_TOKENS,
        GENERATE_PERSONAL_ACCESS_TOKENS,
        MANAGE_SYSTEM_OPERATIONS,
        GET_PLATFORM_EVENTS,
        "MANAGE_USERS_AND_GROUPS",
        "CREATE_USERS_AND_GROUPS",
        "UPDATE_USERS_AND_GROUPS",
        "VIEW_ANALYTICS",
        "GET_ANALYTICS_PRIVILEGE",
        "MANAGE_DOMAINS",
        "MANAGE_GLOBAL_ANNOUNCEMENTS",
        "MANAGE_SECRETS",
        "VIEW_TESTS",
        "MANAGE_TESTS",
        "MANAGE_GLOSSARIES",
        "MANAGE_USER_CREDENTIALS",
        "MANAGE_TAGS",
        "VIEW_MANAGE_TAGS",
        "CREATE_TAGS",
        "CREATE_DOMAINS",
        "CREATE_GLOBAL_ANNOUNCEMENTS",
        "MANAGE_GLOBAL_VIEWS",
        "MANAGE_GLOBAL_OWNERSHIP_TYPES",
        "CREATE_BUSINESS_ATTRIBUTE",
        "MANAGE_BUSINESS_ATTRIBUTE",
        "MANAGE_CONNECTIONS",
        "MANAGE_STRUCTURED_PROPERTIES",
        "VIEW_STRUCTURED_PROPERTIES_PAGE",
        "MANAGE_DOCUMENTATION_FORMS",
        "MANAGE_FEATURES",
    }
)

# --- resource (metadata) privileges -------------------------------------------------------------------------------
VIEW_ENTITY_PAGE = "VIEW_ENTITY_PAGE"
VIEW_DATASET_USAGE = "VIEW_DATASET_USAGE"
VIEW_DATASET_PROFILE = "VIEW_DATASET_PROFILE"
EXISTS_ENTITY = "EXISTS_ENTITY"
EDIT_ENTITY = "EDIT_ENTITY"  # every edit of the entity: it satisfies each EDIT_* below (DataHub's disjunction)
DELETE_ENTITY = "DELETE_ENTITY"
EDIT_ENTITY_TAGS = "EDIT_ENTITY_TAGS"
EDIT_ENTITY_GLOSSARY_TERMS = "EDIT_ENTITY_GLOSSARY_TERMS"
EDIT_ENTITY_OWNERS = "EDIT_ENTITY_OWNERS"
EDIT_ENTITY_DOCS = "EDIT_ENTITY_DOCS"
EDIT_ENTITY_DOC_LINKS = "EDIT_ENTITY_DOC_LINKS"
EDIT_ENTITY_STATUS = "EDIT_ENTITY_STATUS"
EDIT_ENTITY_DOMAINS = "EDIT_DOMAINS_PRIVILEGE"  # DataHub's own name for it
EDIT_ENTITY_DEPRECATION = "EDIT_DEPRECATION_PRIVILEGE"
EDIT_ENTITY_PROPERTIES = "EDIT_ENTITY_PROPERTIES"
EDIT_ENTITY_EMBED = "EDIT_ENTITY_EMBED"
EDIT_ENTITY_OPERATIONS = "EDIT_ENTITY_OPERATIONS"
EDIT_ENTITY_INCIDENTS = "EDIT_ENTITY_INCIDENTS"
EDIT_ENTITY_DATA_PRODUCTS = "EDIT_ENTITY_DATA_PRODUCTS"
EDIT_ENTITY_ASSERTIONS = "EDIT_ENTITY_ASSERTIONS"
EDIT_LINEAGE = "EDIT_LINEAGE"
EDIT_DATASET_COL_TAGS = "EDIT_DATASET_COL_TAGS"
EDIT_DATASET_COL_GLOSSARY_TERMS = "EDIT_DATASET_COL_GLOSSARY_TERMS"
EDIT_DATASET_COL_DESCRIPTION = "EDIT_DATASET_COL_DESCRIPTION"

VIEW_PRIVILEGES = frozenset({VIEW_ENTITY_PAGE, VIEW_DATASET_USAGE, VIEW_DATASET_PROFILE, EXISTS_ENTITY})
EDIT_PRIVILEGES = frozenset(
    {
        EDIT_ENTITY,
        EDIT_ENTITY_TAGS,
        EDIT_ENTITY_GLOSSARY_TERMS,
        EDIT_ENTITY_OWNERS,
        EDIT_ENTITY_DOCS,
        EDIT_ENTITY_DOC_LINKS,
        EDIT_ENTITY_STATUS,
        EDIT_ENTITY_DOMAINS,
        EDIT_ENTITY_DEPRECATION,
        EDIT_ENTITY_PROPERTIES,
        EDIT_ENTITY_EMBED,
        EDIT_ENTITY_OPERATIONS,
        EDIT_ENTITY_INCIDENTS,
        EDIT_ENTITY_DATA_PRODUCTS,
        EDIT_ENTITY_ASSERTIONS,
        EDIT_LINEAGE,
        EDIT_DATASET_COL_TAGS,
        EDIT_DATASET_COL_GLOSSARY_TERMS,
        EDIT_DATASET_COL_DESCRIPTION,
    }
)
# what makes a reader pass the write routes' gate when a policy grants it (the write itself is decided per aspect)
WRITE_GRANTS = EDIT_PRIVILEGES | {DELETE_ENTITY, MANAGE_POLICIES}
RESOURCE_PRIVILEGES = VIEW_PRIVILEGES | EDIT_PRIVILEGES | {DELETE_ENTITY, "CREATE_ENTITY"}
KNOWN_PRIVILEGES = PLATFORM_PRIVILEGES | RESOURCE_PRIVILEGES

# The privilege a write of an aspect needs, as DataHub's resolvers check them for the edit each aspect holds (the
# tags an asset carries, its owners, its description, ...). An aspect not named here needs EDIT_ENTITY.
ASPECT_PRIVILEGES: Mapping[str, tuple[str, ...]] = {
    "globalTags": (EDIT_ENTITY_TAGS,),
    "glossaryTerms": (EDIT_ENTITY_GLOSSARY_TERMS,),
    "ownership": (EDIT_ENTITY_OWNERS,),
    "documentation": (EDIT_ENTITY_DOCS,),
    "institutionalMemory": (EDIT_ENTITY_DOC_LINKS,),
    "status": (EDIT_ENTITY_STATUS,),
    "domains": (EDIT_ENTITY_DOMAINS,),
    "deprecation": (EDIT_ENTITY_DEPRECATION,),
    "structuredProperties": (EDIT_ENTITY_PROPERTIES,),
    "embed": (EDIT_ENTITY_EMBED,),
    "operation": (EDIT_ENTITY_OPERATIONS,),
    "incidentsSummary": (EDIT_ENTITY_INCIDENTS,),
    "assertionsSummary": (EDIT_ENTITY_ASSERTIONS,),
    "upstreamLineage": (EDIT_LINEAGE,),
    "dataJobInputOutput": (EDIT_LINEAGE,),
    # one aspect holds the columns' tags, terms and descriptions: a write of it may change each of them
    "editableSchemaMetadata": (EDIT_DATASET_COL_DESCRIPTION, EDIT_DATASET_COL_TAGS, EDIT_DATASET_COL_GLOSSARY_TERMS),
}
POLICY_ENTITY = "dataHubPolicy"
POLICY_INFO = "dataHubPolicyInfo"


def write_privileges(entity_type: str, aspect: str, *, deletes_entity: bool) -> tuple[str, ...]:
    """Every privilege a write of `aspect` of an entity of `entity_type` needs (all of them; each EDIT_* one is also
    satisfied by EDIT_ENTITY). `deletes_entity`: the write deletes the entity's key aspect, the whole entity."""
    if entity_type == POLICY_ENTITY:
        return (MANAGE_POLICIES,)
    if deletes_entity:
        return (DELETE_ENTITY,)
    held = ASPECT_PRIVILEGES.get(aspect)
    if held is not None:
        return held
    if aspect.startswith("editable") and aspect.endswith("Properties"):  # an entity's description (DescriptionUtils)
        return (EDIT_ENTITY_DOCS,)
    return (EDIT_ENTITY,)


def satisfying(privilege: str) -> frozenset[str]:
    """The privileges any of which grants `privilege`: itself, and EDIT_ENTITY for an edit."""
    return frozenset({privilege, EDIT_ENTITY}) if privilege in EDIT_PRIVILEGES else frozenset({privilege})


def role_holds(role: Role, privilege: str, *, view_authorization: bool) -> bool:
    """What a role holds without any policy: an admin everything; a writer every edit of an entity (not its deletion,
    not a platform privilege); reader and writer the view privileges, unless view authorization is on (then only
    policies grant them, as in DataHub with VIEW_AUTHORIZATION_ENABLED)."""
    if role >= Role.ADMIN:
        return True
    if privilege in VIEW_PRIVILEGES:
        return not view_authorization
    return role >= Role.WRITER and privilege in EDIT_PRIVILEGES
