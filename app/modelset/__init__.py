"""Runtime model sets: stored (store), taken up by every process (watcher), applied after their checks (service).
Above the write path, search, GraphQL and the ingest gateway, whose checks an apply runs; the workers below it that
follow the set get a watcher from the composition root (app.registry.runtime.ModelFollower)."""
