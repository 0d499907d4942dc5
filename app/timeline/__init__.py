"""DataHub's Timeline API over the aspect store's kept versions (service.py; its SQL in repository.py)."""
