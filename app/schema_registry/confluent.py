"""A Confluent-compatible schema registry over HTTP (DataHub's "KAFKA" registry type): a Confluent Schema Registry,
or another metaledger's `/schema-registry/api`. Used when `METALEDGER_SCHEMA_REGISTRY_URL` is set."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import orjson

from app.schema_registry.errors import (
    IncompatibleSchema,
    InvalidSchema,
    RegistryUnavailable,
    SchemaRegistryError,
    UnknownSchema,
)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ACCEPT = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json"


class ConfluentRegistryClient:
    """`schema_by_id` and `register` against the registry at `url`. Schemas by id and registrations are cached for
    the life of the client (a registry never changes what an id means), so steady-state decoding costs no call."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        user_info: str | None = None,
    ) -> None:
        """`user_info`: "user:password" for HTTP Basic (Confluent's basic.auth.user.info; for another metaledger's
        registry, its system client's "id:secret")."""
        self.url = url.rstrip("/")
        user, _, password = (user_info or "").partition(":")
        self._http = httpx.AsyncClient(
            base_url=self.url + "/",
            timeout=timeout,
            transport=transport,
            headers={"Accept": ACCEPT, "User-Agent": "metaledger"},
            auth=httpx.BasicAuth(user, password) if user_info else None,
        )
        self._by_id: dict[int, str] = {}
        self._registered: dict[tuple[str, str], int] = {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def schema_by_id(self, schema_id: int) -> str:
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        body = await self._call("GET", f"schemas/ids/{int(schema_id)}")
        schema = body.get("schema") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(schema, str):
            raise RegistryUnavailable(f"the schema registry at {self.url} answered without a schema for id {schema_id}")
        schema_type = body.get("schemaType", "AVRO")
        if schema_type != "AVRO":
            raise UnknownSchema(f"schema {schema_id} is a {schema_type} schema, not Avro")
        self._by_id[schema_id] = schema
        return schema

    async def register(self, subject: str, schema: str) -> int:
        cached = self._registered.get((subject, schema))
        if cached is not None:
            return cached
        body = await self._call(
            "POST", f"subjects/{quote(subject, safe='')}/versions", {"schema": schema, "schemaType": "AVRO"}
        )
        schema_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(schema_id, int) or isinstance(schema_id, bool):
            raise RegistryUnavailable(f"the schema registry at {self.url} answered a registration without an id")
        self._registered[(subject, schema)] = schema_id
        self._by_id.setdefault(schema_id, schema)
        return schema_id

    async def _call(self, method: str, path: str, body: dict | None = None) -> object:
        try:
            if body is None:
                response = await self._http.request(method, path)
            else:
                response = await self._http.request(
                    method, path, content=orjson.dumps(body), headers={"Content-Type": CONTENT_TYPE}
                )
        except httpx.HTTPError as error:
            raise RegistryUnavailable(f"the schema registry at {self.url} is unreachable: {error}") from None
        try:
            payload = response.json() if response.content else None
        except ValueError:
            payload = None
        if response.is_success:
            return payload
        code = payload.get("error_code") if isinstance(payload, dict) else None
        message = payload.get("message") if isinstance(payload, dict) else None
        message = str(message or response.text[:300] or response.reason_phrase)
        where = f"the schema registry at {self.url}"
        if response.status_code == 404:
            raise UnknownSchema(f"{where}: {message}")
        if response.status_code == 409:
            raise IncompatibleSchema(message)
        if response.status_code == 422 or code == 42201:
            raise InvalidSchema(message)
        if response.status_code >= 500 or response.status_code in (408, 429):
            raise RegistryUnavailable(f"{where} answered {response.status_code}: {message}")
        refusal = SchemaRegistryError(f"{where} answered {response.status_code}: {message}")
        refusal.status = response.status_code
        refusal.error_code = code if isinstance(code, int) else response.status_code
        raise refusal
