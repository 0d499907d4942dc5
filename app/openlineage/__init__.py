"""OpenLineage events in DataHub's model: the spec check (validation) and the mapping to aspects (mapping), for the
endpoint in app.api.openlineage."""
