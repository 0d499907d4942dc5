"""`metaledger model apply <dir>` reads the .avsc schemas and models.yml of a directory: a file it would not read
(an entity_registry.yml, DataHub's file name for the entities) is refused, named, with the file it expected, instead
of the entities it holds being silently missing from the applied set."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from app.cli import main as cli
from app.registry.runtime import MODELS_FILE, ModelSetError, RuntimeModelSet

SCHEMA = {
    "type": "record",
    "name": "Rating",
    "namespace": "com.example",
    "Aspect": {"name": "rating"},
    "fields": [{"name": "stars", "type": "int"}],
}


def model_directory(tmp_path: Path, **files: str) -> Path:
    (tmp_path / "rating.avsc").write_bytes(orjson.dumps(SCHEMA))
    for name, text in files.items():
        (tmp_path / name.replace("__", "/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name.replace("__", "/")).write_text(text)
    return tmp_path


def test_schemas_and_models_yml_are_read(tmp_path):
    folder = model_directory(tmp_path, **{MODELS_FILE: "entities:\n  - name: dataset\n    aspects: [rating]\n"})
    models = RuntimeModelSet.from_directory(folder)
    assert list(models.aspects) == ["rating"]
    assert [(e.name, e.aspects) for e in models.entities] == [("dataset", ("rating",))]


def test_an_entity_registry_yml_is_refused_naming_it_and_the_file_expected(tmp_path):
    folder = model_directory(tmp_path, **{"entity_registry.yml": "entities:\n  - name: dataset\n"})
    with pytest.raises(ModelSetError) as refused:
        RuntimeModelSet.from_directory(folder)
    assert refused.value.path == str(folder)
    assert refused.value.reason.startswith("entity_registry.yml: not read by `model apply`")
    assert MODELS_FILE in refused.value.reason


def test_every_unread_file_is_named_and_hidden_files_are_not(tmp_path):
    folder = model_directory(
        tmp_path, **{"notes.txt": "", "sub__old.json": "{}", ".editorconfig": "", ".git__HEAD": "ref"}
    )
    with pytest.raises(ModelSetError) as refused:
        RuntimeModelSet.from_directory(folder)
    assert refused.value.reason.startswith("notes.txt, sub/old.json: not read")


def test_the_command_says_so_without_a_traceback(tmp_path):
    folder = model_directory(tmp_path, **{"entity_registry.yml": "entities: []\n"})
    result = CliRunner().invoke(cli, ["model", "apply", str(folder)], env={"METALEDGER_URL": "http://127.0.0.1:9"})
    assert result.exit_code == 1
    assert "entity_registry.yml: not read by `model apply`" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
