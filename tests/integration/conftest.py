"""The app fixtures (`app`, `client`, `db`, `database_url`, `registry`, ...) live in tests/conftest.py: tests/spark uses them too."""
