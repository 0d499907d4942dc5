"""docs/configuration.md is what app.settings_docs renders from the settings' declarations, and every setting says what
it does. When this fails after a change to a setting: `.venv/bin/metaledger settings docs`, and commit the page."""

from __future__ import annotations

import re
from pathlib import Path

from app import settings_docs
from app.cli import main as metaledger
from app.settings import PROJECT_ROOT, Settings

DOCS = PROJECT_ROOT / "docs"
ENV_NAME = re.compile(r"\bMETALEDGER_[A-Z0-9_]*[A-Z0-9]\b(?!\*)")


def test_every_setting_has_a_description():
    assert settings_docs.missing_descriptions() == [], (
        'give each of these settings a Field(..., description="...") in app/settings.py (or spark_indexer/config.py)'
    )


def test_configuration_page_is_what_the_settings_render():
    committed = settings_docs.DOCS_PATH.read_text(encoding="utf-8") if settings_docs.DOCS_PATH.exists() else ""
    assert committed == settings_docs.render(metaledger), (
        "docs/configuration.md is out of date: run `.venv/bin/metaledger settings docs` and commit it"
    )


def test_every_setting_is_listed_once():
    page = settings_docs.render(metaledger)
    for model in settings_docs.setting_models():
        for name, field in settings_docs.own_fields(model):
            env = settings_docs.env_name(model, name, field)
            assert page.count(f"| `{env}` |") == 1, env


def test_every_setting_belongs_to_a_group():
    """The first setting starts a group (app.settings.group), so none falls into the catch-all."""
    assert all(row.group != settings_docs.UNGROUPED for row in settings_docs.setting_rows())


def test_the_page_does_not_depend_on_the_machine():
    page = settings_docs.render(metaledger)
    assert str(PROJECT_ROOT) not in page
    assert "<checkout>/.metaledger" in page  # METALEDGER_DATA_DIR's default, a path under the checkout
    assert "file://<checkout>/.metaledger/spark" in page  # METALEDGER_SPARK_WORK_DIR's, a URI
    assert Settings.model_fields["data_dir"].default == PROJECT_ROOT / ".metaledger"


def test_command_line_variables_are_listed():
    """`metaledger serve --workers` reads METALEDGER_WORKERS: not a setting, but a variable a user sets."""
    rows = {row.env: row for row in settings_docs.command_line_rows(metaledger)}
    assert "METALEDGER_WORKERS" in rows
    assert rows["METALEDGER_WORKERS"].default == "the machine's cores"


def test_check_names_what_is_out_of_date(tmp_path: Path):
    stale = tmp_path / "configuration.md"
    stale.write_text("# Configuration\n", encoding="utf-8")
    assert "out of date" in settings_docs.check(metaledger, stale)
    stale.write_text(settings_docs.render(metaledger), encoding="utf-8")
    assert settings_docs.check(metaledger, stale) is None


def test_every_metaledger_variable_the_docs_name_exists():
    """A `METALEDGER_*` name in the README or docs/ is a setting, or a variable a `metaledger` option reads."""
    known = {row.env for row in settings_docs.setting_rows() + settings_docs.command_line_rows(metaledger)}
    unknown = {}
    for page in [PROJECT_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for name in ENV_NAME.findall(page.read_text(encoding="utf-8")):
            if name not in known:
                unknown.setdefault(name, page.name)
    assert unknown == {}, "these names are no setting (renamed or removed?)"
