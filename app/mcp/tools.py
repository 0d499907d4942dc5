"""The tools of metaledger's MCP endpoint, declared once: each one's name, description, input model (which both
parses the call's arguments and is the tool's `inputSchema`) and handler, in `TOOLS`. app.mcp.server lists and calls
them from here; the handlers are app.mcp.datahub's (DataHub's tools, in DataHub's names and shapes) and
app.mcp.extras' (what only metaledger has).

A handler takes the call (`ToolCall`: the caller, the request's services, DataHub's GraphQL executed in-process as
the caller) and its parsed input, and returns the JSON the tool answers, or raises `ToolError` (any
`MetaledgerError` too: its message is the tool error's text, a 403 naming the permission the caller lacks)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from app.errors import Issue, MetaledgerError, ValidationFailed
from app.limits import clip

if TYPE_CHECKING:
    import mcp_types as types

    from app.mcp.call import ToolCall

Input = TypeVar("Input", bound=BaseModel)
MAX_URNS = 100  # URNs one call names (get_entities, the curation tools): DataHub's tools take "a few"
MAX_TEXT = 10_000  # a query, a filter, a description's characters
MAX_URN = 2_000  # a URN's characters (a dataset URN with a long name stays well under)


# How pydantic names a union's member in an error's location (`list[constrained-str]`): not a place in the arguments
_UNION_MEMBER = re.compile(r"(list|dict|str|int|float|bool|constrained-[a-z]+|function-[a-z]+|nullable)(\[.*\])?")


class ToolInput(BaseModel):
    """A tool's arguments: unknown ones are refused by name, as every body of the API is."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


class ToolError(MetaledgerError):
    """A refusal of the tool's own (an argument that names nothing, a limit): a tool error, not a protocol error."""


@dataclass(frozen=True, slots=True)
class Tool(Generic[Input]):
    name: str
    description: str
    model: type[Input]
    run: Callable[[ToolCall, Input], Awaitable[Any]]
    writes: bool = False  # a curation tool: needs WRITE, and its writes are attributed to it
    metaledger: bool = False  # not one of DataHub's tools

    def definition(self) -> types.Tool:
        import mcp_types as types  # the SDK's: imported by the MCP endpoint's first call, not with the app

        schema = self.model.model_json_schema()
        schema.pop("title", None)
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=schema,
            annotations=types.ToolAnnotations(read_only_hint=not self.writes, open_world_hint=False),
        )

    def parse(self, arguments: dict[str, Any] | None) -> Input:
        """The call's arguments as the tool's input; a 400 naming each argument that does not fit."""
        try:
            return self.model.model_validate(arguments or {})
        except ValidationError as error:
            issues: dict[str, Issue] = {}  # one per argument: a union's members each report the same one
            for e in error.errors(include_url=False):
                place = [p for p in e["loc"] if isinstance(p, int) or not _UNION_MEMBER.fullmatch(p)]
                path = "$.arguments" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in place)
                issues.setdefault(path, Issue(e["msg"], path=path, found=clip(repr(e.get("input")), 200)))
            names = ", ".join(issues)
            raise ValidationFailed(f"invalid arguments of {self.name}: {names}", list(issues.values())) from None


TOOLS: dict[str, Tool[Any]] = {}
_DEFINITIONS: list[types.Tool] = []


def tool(
    name: str, model: type[Input], description: str, *, writes: bool = False, metaledger: bool = False
) -> Callable[[Callable[[ToolCall, Input], Awaitable[Any]]], Callable[[ToolCall, Input], Awaitable[Any]]]:
    """Declare a tool: `@tool("search", SearchInput, "...")` on its handler."""

    def register(run: Callable[[ToolCall, Input], Awaitable[Any]]) -> Callable[[ToolCall, Input], Awaitable[Any]]:
        assert name not in TOOLS, f"tool {name} declared twice"
        TOOLS[name] = Tool(name, description, model, run, writes, metaledger)
        _DEFINITIONS.clear()
        return run

    return register


def definitions() -> list[types.Tool]:
    """Every tool's MCP definition, in declaration order (built once)."""
    if not _DEFINITIONS:
        _DEFINITIONS.extend(t.definition() for t in TOOLS.values())
    return _DEFINITIONS


@dataclass(slots=True)
class Page:
    """A list result that a limit may cut: it always says its total, and when cut `truncated` and where to go on."""

    total: int
    returned: int
    offset: int
    cut_by: str | None = None  # the limit that cut it, when it was cut by one rather than by the page size asked
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        truncated = self.offset + self.returned < self.total
        body: dict[str, Any] = {"total": self.total, "returned": self.returned, "offset": self.offset}
        body["truncated"] = truncated
        if truncated:
            body["nextOffset"] = self.offset + self.returned
        if self.cut_by:
            body["cutBy"] = self.cut_by
        return {**body, **self.extra}
