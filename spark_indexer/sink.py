"""What a Spark task needs to write index changes: the registry and a search backend, built once per Python worker
from the job's settings (shipped to executors as plain JSON, the registry by value), with an event loop to run the backend's coroutines.

The registry follows the runtime model set stored in the job's database (app.registry.runtime) as the service's
processes do, through the same `ModelWatcher`: a stream task takes it up when the driver's reading of its version
for the batch is not the registry's, and re-checks it before dead-lettering a record of an aspect or entity type the
registry does not know (`WorkerRuntime.follow_models`, `recheck_models`); restore-indices and reconcile take the set
stored when they start, on the driver and in each task (`current_registry`)."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml

from app.registry import EntityRegistry
from app.search.model import RebuildTarget, SearchBackend
from spark_indexer.config import IndexerSettings

T = TypeVar("T")

_registries: dict[str, Any] = {}


REGISTRY_KEY = "registry_by_value"


def registry_bundle(path: Path) -> dict[str, Any]:
    """The entity registry as values: the file's text and the `.avsc` files of the `path:` model sources it names
    (each source rewritten to a folder inside the bundle). `package:` sources are read from the packages installed
    where the registry is loaded (the shipped environment carries acryl-datahub's model files). Raises when the
    file cannot be read: on the driver, before any task runs."""
    text = path.read_text(encoding="utf-8")
    config = yaml.safe_load(text) or {}
    sources = config.get("modelSources") if isinstance(config, dict) else None
    models: dict[str, str] = {}
    if isinstance(sources, list) and any(isinstance(src, dict) and "path" in src for src in sources):
        for i, source in enumerate(sources):
            if not isinstance(source, dict) or "path" not in source:
                continue
            folder = Path(str(source["path"]))
            folder = folder if folder.is_absolute() else path.parent / folder
            for file in sorted(folder.rglob("*.avsc")):
                models[f"models/{i}/{file.relative_to(folder)}"] = file.read_text(encoding="utf-8")
            source["path"] = f"models/{i}"
        text = yaml.safe_dump(config, sort_keys=False)
    return {"file": path.name, "text": text, "models": models}


def materialize_registry(bundle: dict[str, Any]) -> Path:
    """The bundle's registry file on this node's local disk (one folder per content, shared by the node's Python
    workers; written to a private folder first, then renamed into place whole)."""
    digest = hashlib.sha256(orjson.dumps(bundle, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"metaledger-registry-{digest}"
    if not folder.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
        for name, text in {bundle["file"]: bundle["text"], **bundle["models"]}.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text, encoding="utf-8")
        try:
            staging.rename(folder)
        except OSError:  # another worker of this node was first: its copy is the same content
            shutil.rmtree(staging, ignore_errors=True)
    return folder / bundle["file"]


def settings_payload(settings: IndexerSettings) -> dict[str, Any]:
    """The settings as JSON-safe values, for closures shipped to executors, with the entity registry by value:
    `registry_path` is a path on the driver's disk, which executors cannot read."""
    return {**settings.model_dump(mode="json"), REGISTRY_KEY: registry_bundle(Path(settings.registry_path))}


def settings_from_payload(payload: dict[str, Any]) -> IndexerSettings:
    """The settings on an executor, their registry written to this node's disk from the payload."""
    fields = {k: v for k, v in payload.items() if k != REGISTRY_KEY}
    return IndexerSettings.model_validate({**fields, "registry_path": materialize_registry(payload[REGISTRY_KEY])})


def registry_for(settings: IndexerSettings) -> Any:
    """The entity registry, loaded once per Python worker and database (loading and compiling it is the expensive
    part; a stream's registry follows its own database's runtime model set)."""
    key = f"{settings.registry_path}\n{settings.database_url}"
    if key not in _registries:
        from app.registry import load_registry

        _registries[key] = load_registry(
            settings.registry_path,
            trim_unknown_fields=settings.trim_unknown_fields,
            strict_urns=settings.strict_urn_validation,
        )
    return _registries[key]


def current_registry(settings: IndexerSettings) -> Any:
    """`registry_for(settings)` at the runtime model set stored in the job's database now (a restore or reconcile
    after an apply indexes and compares the runtime aspects' fields too; without a database: the base models). Taken
    up by the service's `ModelWatcher` (one query when the set has not changed), on an event loop of its own in a
    thread, since callers may be inside a running one. A database error raises (the job could not read its rows
    either)."""
    registry = registry_for(settings)
    if settings.database_url:
        with ThreadPoolExecutor(1, thread_name_prefix="metaledger-models") as pool:
            pool.submit(asyncio.run, _take_up_stored_models(settings, settings.database_url, registry)).result()
    return registry


async def _take_up_stored_models(settings: IndexerSettings, database_url: str, registry: EntityRegistry) -> None:
    from app.db import create_engine, create_sessionmaker
    from app.modelset.watcher import ModelWatcher

    engine = create_engine(database_url, pool_size=1)
    try:
        await ModelWatcher(settings, create_sessionmaker(engine), registry).refresh()
    finally:
        await engine.dispose()


def build_backend(
    settings: IndexerSettings,
    registry: EntityRegistry,
    *,
    refresh: bool | str = False,
    pool_size: int = 10,
    target: RebuildTarget | None = None,
) -> tuple[Any, Any]:
    """(backend, engine or None), not started: the service's choice of backend (`make_backend`), with an engine of
    its own for the embedded Postgres backend. Bulk writers do not wait for refreshes. `target`: a restore's fresh
    indices to write into instead of the live ones (`ElasticBackend.writing_into`; Elasticsearch/OpenSearch only)."""
    from app.search.service import make_backend

    engine = None
    if not settings.search_url:
        from app.db import create_engine

        if target is not None:
            raise ValueError("only the Elasticsearch/OpenSearch backend rebuilds into fresh indices")
        if not settings.database_url:
            raise RuntimeError(
                "set METALEDGER_SEARCH_URL (Elasticsearch/OpenSearch) or METALEDGER_DATABASE_URL "
                "(the embedded Postgres search backend)"
            )
        engine = create_engine(settings.database_url, pool_size=pool_size)
    backend = make_backend(settings, registry, engine, refresh=refresh)
    if target is not None:
        from app.search.elastic import ElasticBackend

        assert isinstance(backend, ElasticBackend)  # `search_url` is set: the Postgres backend is refused above
        backend = backend.writing_into(target)
    return backend, engine


@asynccontextmanager
async def opened_backend(
    settings: IndexerSettings, registry: EntityRegistry, *, refresh: bool | str = False, start: bool = True
) -> AsyncIterator[Any]:
    """The configured backend, started (unless `start=False`: driver-side index lifecycle and reads, which create
    no index on their own), and closed (with its engine) on exit."""
    backend, engine = build_backend(settings, registry, refresh=refresh)
    try:
        if start:
            await backend.start()
        yield backend
    finally:
        await backend.close()
        if engine is not None:
            await engine.dispose()


class WorkerRuntime:
    """One per Python worker (Spark reuses workers across tasks): an event loop, the registry and a started backend,
    kept between tasks so a task does not pay for connecting and checking every index mapping again."""

    def __init__(self, settings: IndexerSettings) -> None:
        from spark_indexer.values import decoder_for

        self.settings = settings
        self.registry = registry_for(settings)
        self.decode = decoder_for(settings)  # Kafka values (Avro or JSON) → the MCL's JSON form
        self.loop = asyncio.new_event_loop()
        self.models = self._model_watcher()  # None without a database: the base models only
        self._backend_cm: Any = None
        self.backend: SearchBackend | None = None

    def _model_watcher(self) -> Any:
        if not self.settings.database_url:
            return None
        from app.db import create_engine, create_sessionmaker
        from app.modelset.watcher import ModelWatcher

        engine = create_engine(self.settings.database_url, pool_size=1)  # connects at its first query
        return ModelWatcher(self.settings, create_sessionmaker(engine), self.registry)

    def follow_models(self, version: int | None) -> None:
        """Take up the stored runtime model set when `version`, the driver's reading for this batch (None: unknown),
        is not the one in force. A database error fails the task (Spark retries it): indexing under a set older than
        the batch's would skip or dead-letter what the newer one defines."""
        if version is not None and version != self.registry.runtime_version:
            self.recheck_models()

    def recheck_models(self) -> bool:
        """Read the stored set's version (one query) and take the set up when it moved; True when it did (False
        without a database)."""
        return self.models is not None and self.run(self.models.refresh())

    def run(self, coroutine: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def started_backend(self) -> SearchBackend:
        if self.backend is None:
            cm = opened_backend(self.settings, self.registry)
            self.backend = self.run(cm.__aenter__())
            self._backend_cm = cm
        return self.backend

    def reset_backend(self) -> None:
        """Drop the backend after a failure (a broken connection pool must not be reused by the next task)."""
        cm, self._backend_cm, self.backend = self._backend_cm, None, None
        if cm is not None:
            try:
                self.run(cm.__aexit__(None, None, None))
            except Exception:  # noqa: BLE001 - closing a broken client may fail too
                pass


_runtimes: dict[str, WorkerRuntime] = {}


def worker_runtime(payload: dict[str, Any]) -> WorkerRuntime:
    import orjson

    key = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()
    runtime = _runtimes.get(key)
    if runtime is None:
        runtime = _runtimes[key] = WorkerRuntime(settings_from_payload(payload))
    return runtime
