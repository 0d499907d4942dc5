"""docs/configuration.md, rendered from the settings' declarations, so the page and the code cannot disagree.

Every setting is a field of `app.settings.Settings` (and, for the Spark indexer's own, of
`spark_indexer.config.IndexerSettings`) with a `description`; `app.settings.group` marks the first field of each group
(the fields declared after it, up to the next mark, belong to it). The `METALEDGER_*` variables that `metaledger`
options read (`--workers`, `--url`) are listed too, from the click declarations of the command group the caller passes
(app.cli's `main`: this module does not import app.cli, which imports it).

`metaledger settings docs` writes the page; `metaledger settings docs --check` (`make docs-check`, CI) fails when the
committed page differs from what this renders, and `tests/unit/test_settings_docs.py` also fails on a setting without
a description. Defaults that depend on the machine render without it: paths under the checkout as `<checkout>/…`.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from app.settings import PROJECT_ROOT, Settings

DOCS_PATH = PROJECT_ROOT / "docs" / "configuration.md"
CHECKOUT = "<checkout>"
UNGROUPED = "Other"
COMMAND_LINE_GROUP = "Command-line options"


@dataclass(frozen=True)
class Row:
    """One environment variable as the page lists it."""

    env: str
    type: str
    default: str
    description: str
    group: str
    docs: str | None = None


def _indexer_settings() -> type[BaseSettings]:
    from spark_indexer.config import IndexerSettings

    return IndexerSettings


def setting_models() -> list[type[BaseSettings]]:
    """The settings classes the page covers: the service's, then the Spark indexer's (which extends it)."""
    return [Settings, _indexer_settings()]


def env_name(model: type[BaseSettings], name: str, field: FieldInfo) -> str:
    prefix = model.model_config.get("env_prefix", "")
    return (field.alias or f"{prefix}{name}").upper()


def own_fields(model: type[BaseSettings]) -> list[tuple[str, FieldInfo]]:
    """`model`'s fields in declaration order, without those of the settings classes before it in `setting_models()`."""
    inherited: set[str] = set()
    for base in model.__mro__[1:]:
        inherited.update(getattr(base, "model_fields", {}))
    return [(name, field) for name, field in model.model_fields.items() if name not in inherited]


def missing_descriptions() -> list[str]:
    """The variables whose setting has no description (the page would have an empty cell)."""
    return [
        env_name(model, name, field)
        for model in setting_models()
        for name, field in own_fields(model)
        if not (field.description or "").strip()
    ]


def _machine_independent(text: str) -> str:
    root = str(PROJECT_ROOT)
    return text.replace(PROJECT_ROOT.as_uri(), f"file://{CHECKOUT}").replace(root, CHECKOUT)


def render_default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        # pydantic types default_factory as taking the validated data or not; the settings' factories take none
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, str):
        return f"`{_machine_independent(value)}`" if value else "empty"
    if isinstance(value, (list, dict)):
        import json

        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        named = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(named)
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is list or annotation is list:
        return "JSON list"
    if origin is dict or annotation is dict:
        return "JSON object"
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return "path"
    return {bool: "bool", int: "int", float: "float", str: "string"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def render_type(field: FieldInfo) -> str:
    bounds = []
    for item in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
    name = _type_name(field.annotation)
    return f"{name} ({', '.join(bounds)})" if bounds else name


def setting_rows() -> list[Row]:
    rows: list[Row] = []
    for model in setting_models():
        group, docs = UNGROUPED, None
        for name, field in own_fields(model):
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if "group" in extra:
                group, docs = str(extra["group"]), extra.get("docs")
            rows.append(
                Row(
                    env=env_name(model, name, field),
                    type=render_type(field),
                    default=render_default(field),
                    description=_machine_independent((field.description or "").strip()),
                    group=group,
                    docs=str(docs) if docs else None,
                )
            )
    return rows


def command_line_rows(commands: Any) -> list[Row]:
    """The `METALEDGER_*` variables that the options of `commands` (a click group: app.cli's `main`) read, from their
    declarations."""
    import re

    import click

    known = {row.env for row in setting_rows()}
    rows: list[Row] = []

    def walk(command: click.Command, path: list[str]) -> None:
        for param in command.params:
            envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
            for env in envvars:
                if not env.startswith("METALEDGER_") or env in known or not isinstance(param, click.Option):
                    continue
                help_text = param.help or ""
                stated = re.search(r"\s*\[default: ([^\]]+)\]", help_text)
                default = (
                    stated.group(1) if stated else (f"`{param.default}`" if param.default is not None else "unset")
                )
                help_text = re.sub(r"\s*\[default: [^\]]+\]", "", help_text).strip()
                option = max(param.opts, key=len)
                rows.append(
                    Row(
                        env=env,
                        type=_click_type(param.type),
                        default=default,
                        description=f"`{' '.join(path)} {option}`: {help_text}",
                        group=COMMAND_LINE_GROUP,
                        docs="commands.md",
                    )
                )
        if isinstance(command, click.Group):
            for name in sorted(command.commands):
                walk(command.commands[name], [*path, name])

    walk(commands, [commands.name or "metaledger"])
    return rows


def _click_type(kind: Any) -> str:
    import click

    if isinstance(kind, click.IntRange):
        bounds = [f"≥ {kind.min}"] if kind.min is not None else []
        bounds += [f"≤ {kind.max}"] if kind.max is not None else []
        return f"int ({', '.join(bounds)})" if bounds else "int"
    return {"integer": "int", "text": "string", "float": "float", "boolean": "bool"}.get(kind.name, kind.name)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _slug(title: str) -> str:
    import re

    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


HEADER = """# Configuration

metaledger reads its settings from environment variables with the prefix `METALEDGER_` (`app/settings.py`,
pydantic-settings; the Spark indexer adds its own in `spark_indexer/config.py`): set them in the environment of
`make run`, `metaledger …` or `python -m spark_indexer …`, or in `docker-compose.yml`. Lists and maps are JSON.
A value the service cannot start with is refused at start-up with one line naming the variable (exit code 78; see
[Operations](operations.md#start-up-refusals)). Paths default to places under the checkout (`<checkout>` below).

This page is generated from the settings' declarations by `metaledger settings docs` (`app/settings_docs.py`);
`make docs-check` fails when it is out of date. To change a description, edit the setting's `Field(description=…)`
and run `.venv/bin/metaledger settings docs`.
"""


def render(commands: Any) -> str:
    """The page: every setting, then the variables the options of `commands` (app.cli's `main`) read."""
    rows = setting_rows() + command_line_rows(commands)
    groups: dict[str, list[Row]] = {}
    docs: dict[str, str] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
        if row.docs and row.group not in docs:
            docs[row.group] = row.docs
    out = [HEADER]
    out.extend(f"- [{name}](#{_slug(name)})" for name in groups)
    out.append("")
    for name, members in groups.items():
        out.append(f"## {name}\n")
        if name in docs:
            out.append(f"See [{_page_title(docs[name].partition('#')[0])}]({docs[name]}).\n")
        out.append("| variable | type | default | description |")
        out.append("|---|---|---|---|")
        for row in members:
            out.append(f"| `{row.env}` | {_cell(row.type)} | {_cell(row.default)} | {_cell(row.description)} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _page_title(page: str) -> str:
    """The first heading of docs/<page>, or the page's name."""
    path = DOCS_PATH.parent / page
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return Path(page).stem.replace("-", " ").capitalize()


def check(commands: Any, path: Path = DOCS_PATH) -> str | None:
    """None when `path` holds what `render(commands)` gives, else why not."""
    committed = path.read_text(encoding="utf-8") if path.exists() else ""
    if committed != render(commands):
        return f"{path} is out of date: run `metaledger settings docs` and commit it"
    return None
