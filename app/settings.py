"""Service settings, read from the environment with the ``METALEDGER_`` prefix."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="METALEDGER_", extra="ignore")

    # Unset: `metaledger serve` starts its own private Postgres under `data_dir` (the embedded default).
    database_url: str | None = None
    data_dir: Path = PROJECT_ROOT / ".metaledger"
    embedded_pg_port: int = 55433

    registry_path: Path = PROJECT_ROOT / "entity_registry.yml"
    # DataHub trims unknown aspect fields silently; metaledger rejects them unless this is set.
    trim_unknown_fields: bool = False
    # DataHub's STRICT_URN_VALIDATION_ENABLED: reserved characters inside URN parts are errors, not warnings.
    strict_urn_validation: bool = True

    # History rows kept per aspect (row 0, the latest, is never deleted). Overrides per "entity/aspect",
    # "entity/*" or "*/aspect", e.g. METALEDGER_RETENTION_OVERRIDES='{"dataset/status": 1}'.
    retention_max_versions: int = 20
    retention_overrides: dict[str, int] = Field(default_factory=dict)

    # DataHub's ALWAYS_EMIT_CHANGE_LOG: also log no-op writes (as RESTATE).
    always_emit_change_log: bool = False

    max_request_bytes: int = 16_000_000
    max_aspect_bytes: int = 16_000_000
    transaction_retries: int = 5
    db_pool_size: int = 10

    apply_migrations_on_start: bool = True


@lru_cache
def get_settings() -> Settings:
    return Settings()
