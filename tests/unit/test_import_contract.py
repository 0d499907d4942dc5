"""The import contract of `app`, read from the source (every import counts: at module level, inside a function, and
under `if TYPE_CHECKING:`, since a type-only import is a dependency a reader follows too):

* no cycle between packages (`app.write`, `app.search`, …; each top-level module is a node of its own), so a package
  can be read, tested and changed knowing only what it imports;
* no router module imports another router module (`app/api/*.py` and `app/api/restli/*.py` that declare routes):
  what two routers share lives below them (app.api.http, app.api.deps, or the package that owns it).

docs/architecture.md draws the packages in the order these imports allow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path) -> Iterator[str]:
    """The `app` modules `path` imports (a `from app.x import name` counts `app.x` and, when `name` is a module,
    `app.x.name`)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("app."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module == "app" or module.startswith("app."):
                yield module
                yield from (f"{module}.{a.name}" for a in node.names if _exists(f"{module}.{a.name}"))


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _node(module: str) -> str:
    """A module's node in the package graph: `app.<package>` for a module of a package, else the module itself."""
    parts = module.split(".")
    if len(parts) >= 2 and (APP / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def package_graph() -> dict[str, dict[str, set[str]]]:
    """{package: {imported package: the files whose imports make that edge}}."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in sorted(APP.rglob("*.py")):
        source = _node(_module_name(path))
        for module in _imported_modules(path):
            if _exists(module) and (target := _node(module)) != source:
                graph.setdefault(source, {}).setdefault(target, set()).add(str(path.relative_to(ROOT)))
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _declares_routes(path: Path) -> bool:
    return "APIRouter(" in path.read_text()


def test_no_package_cycle_type_only_imports_included():
    graph = package_graph()
    report = []
    for component in cycles(graph):
        members = set(component)
        edges = [
            f"  {a} -> {b}: {', '.join(sorted(files))}"
            for a in component
            for b, files in sorted(graph.get(a, {}).items())
            if b in members
        ]
        report.append(" <-> ".join(component) + "\n" + "\n".join(edges))
    assert not report, "package cycles:\n" + "\n".join(report)


def test_no_router_module_imports_another():
    routers = {_module_name(p): p for p in [*APP.glob("api/*.py"), *APP.glob("api/restli/*.py")] if _declares_routes(p)}
    crossings = sorted(
        f"{name} imports {module}"
        for name, path in routers.items()
        for module in set(_imported_modules(path))
        if module in routers and module != name
    )
    assert not crossings, crossings


def test_the_contract_sees_a_cycle_and_a_router_crossing():
    """The checks themselves: a cycle is found, and an edge that only goes one way is not one."""
    graph = {"app.a": {"app.b": {"a.py"}}, "app.b": {"app.c": {"b.py"}}, "app.c": {"app.a": {"c.py"}, "app.d": set()}}
    assert cycles(graph) == [["app.a", "app.b", "app.c"]]
    assert cycles({"app.a": {"app.b": {"a.py"}}}) == []
    assert "app.api.http" in set(_imported_modules(APP / "api" / "deps.py"))
