"""The house's shape, as the architecture document states it: checked, so that it stays true.

- the rooms: ``service/`` holds ``stream/``, ``text/``, ``chain/``, ``http/``, ``ops/`` and
  ``tools/`` beside its top modules; the pool is its own package (``pool/``), which nothing
  of the sidecar imports but the CLI; no two modules share a name;
- ``text/`` and ``chain/`` import neither ``stream/`` nor ``http/``; nothing outside
  ``http/`` and the pool imports FastAPI or Starlette;
- ``models/`` imports nothing from ``service/`` or ``pool/``, and ``client/`` nothing of the
  rest;
- serving modules do not import the tooling (``service/tools``);
- no import cycle among the modules of ``service/``, ``models/`` and ``client/``, counting
  every import wherever it stands (in a function, under ``TYPE_CHECKING``): an import hidden
  inside a function to break a circle is still a circle;
- no class runs past 300 lines and no function past 80;
- a module docstring says what the module is for and why in a few lines (the error trees of
  ``service/exceptions.py`` and ``models/errors.py`` excepted): the architecture is written
  once, in docs/ARCHITECTURE.md;
- the app factory is wiring only: its routes come from ``service/http/routes``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("service", "models", "pool", "client/thinktrans_client")
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _all_modules() -> list[Path]:
    return [path for folder in PACKAGES for path in _modules(folder)]


def _name(path: Path) -> str:
    """The module's dotted name (``client/thinktrans_client/acp.py``: thinktrans_client.acp)."""
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[0] == "client":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
def _module_names() -> frozenset[str]:
    return frozenset(_name(path) for path in _all_modules())


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it; relative imports are resolved."""
    found: set[str] = set()
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from a import b`` imports the module ``a.b`` where there is one (``a``, its
            # package, is imported first by any import of one of its modules), else ``a``.
            modules = {f"{base}.{alias.name}" for alias in node.names} & _module_names()
            found.update(modules if len(modules) == len(node.names) else {base, *modules})
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    paths = {_name(path): path for path in _all_modules()}
    return {name: {m for m in _imports(path) if m in paths and m != name}
            for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_service_models_or_client() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


def _importing(folder: str, roots: tuple[str, ...]) -> dict[str, set[str]]:
    """The modules under ``folder`` that import a module under one of ``roots``, and what."""
    found = {}
    for path in _modules(folder):
        hits = {m for m in _imports(path) if any(m == r or m.startswith(r + ".") for r in roots)}
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    return found


def test_backends_import_nothing_from_the_service_or_the_pool() -> None:
    assert _importing("models", ("service", "pool")) == {}


def test_the_client_imports_nothing_of_the_rest() -> None:
    assert _importing("client/thinktrans_client", ("service", "models", "pool")) == {}


ROOMS = ("stream", "text", "chain", "http", "ops", "tools")
TOP = {"__init__.py", "cli.py", "exceptions.py", "runtime.py", "schemas.py", "settings.py"}


def test_the_service_is_in_rooms() -> None:
    """Beside its rooms, the service's top holds the composition (settings, runtime, the
    CLI), the wire shapes and the error table; every other module is in a room."""
    service = ROOT / "service"
    top = {p.name for p in service.glob("*.py")}
    assert top == TOP, f"modules at the top of service/: {sorted(top - TOP)}"
    folders = {p.name for p in service.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {*ROOMS, "data"}, sorted(folders)


def test_text_and_chain_import_neither_streams_nor_http() -> None:
    for room in ("service/text", "service/chain"):
        assert _importing(room, ("service.stream", "service.http")) == {}, room


def test_only_http_and_the_pool_import_the_web_framework() -> None:
    web = ("fastapi", "starlette")
    others = [p for p in _all_modules()
              if not p.is_relative_to(ROOT / "service" / "http")
              and not p.is_relative_to(ROOT / "pool")]
    found = {str(p.relative_to(ROOT)): hits for p in others
             if (hits := {m for m in _imports(p) if m.split(".")[0] in web})}
    assert found == {}


def test_the_pool_is_its_own_program() -> None:
    """Nothing of the sidecar imports the pool, but the CLI that starts it."""
    found = _importing("service", ("pool",))
    assert set(found) <= {"service/cli.py"}, found


def test_no_two_modules_share_a_name() -> None:
    names: dict[str, list[str]] = {}
    for path in _all_modules():
        if path.name != "__init__.py":
            names.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
        else:
            names.setdefault(path.parent.name, []).append(str(path.parent.relative_to(ROOT)))
    repeated = {name: where for name, where in names.items() if len(where) > 1}
    assert repeated == {}


def test_serving_modules_do_not_import_the_tooling() -> None:
    serving = [p for p in [*_modules("service"), *_modules("pool")]
               if "tools" not in p.parts and p.name != "cli.py"]
    for path in serving:
        tooling = {m for m in _imports(path) if m.startswith("service.tools")}
        assert not tooling, f"{path.name} imports {tooling}"


def _defs(kind: type[ast.AST] | tuple[type[ast.AST], ...]) -> Iterator[tuple[str, int]]:
    for path in _all_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, kind):
                assert isinstance(node, ast.stmt)
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                name = getattr(node, "name", "?")
                yield f"{path.relative_to(ROOT)}:{node.lineno} {name} ({lines})", lines


def test_no_function_runs_past_80_lines() -> None:
    long = [where for where, lines in _defs((ast.FunctionDef, ast.AsyncFunctionDef))
            if lines > MAX_FUNCTION_LINES]
    assert not long, long


def test_no_class_runs_past_300_lines() -> None:
    long = [where for where, lines in _defs(ast.ClassDef) if lines > MAX_CLASS_LINES]
    assert not long, long


MAX_MODULE_DOC_LINES = 10
ERROR_TREES = {"service/exceptions.py", "models/errors.py"}


def test_module_docstrings_are_a_few_lines() -> None:
    long = []
    for path in _all_modules():
        rel = str(path.relative_to(ROOT))
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if doc and rel not in ERROR_TREES and doc.count("\n") + 1 > MAX_MODULE_DOC_LINES:
            long.append(f"{rel} ({doc.count(chr(10)) + 1} lines)")
    assert not long, long


def test_the_app_factory_is_wiring_only() -> None:
    """Every route the app serves is a router's from ``service/http/routes`` (none is defined in
    ``app.py``); the app calls nothing but wiring; the lifespan opens the runtime."""
    from fastapi.routing import APIRoute

    from service.http.app import create_app
    from service.settings import load_settings

    def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
        for route in routes:
            if isinstance(route, APIRoute):
                yield route
            elif hasattr(route, "original_router"):  # an included router, as FastAPI keeps it
                yield from api_routes(route.original_router.routes)

    app = create_app(load_settings(backend="passthrough"))
    routes = list(api_routes(app.routes))
    assert len(routes) > 10
    foreign = [r.path for r in routes
               if not r.endpoint.__module__.startswith("service.http.routes.")]
    assert not foreign, f"routes defined outside service/http/routes: {foreign}"
    tree = ast.parse((ROOT / "service" / "http" / "app.py").read_text(encoding="utf-8"))
    called = {node.func.attr for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    wiring = {"include_router", "add_middleware", "get_secret_value", "freeze"}
    assert called <= wiring, f"app.py does more than wiring: {sorted(called - wiring)}"
    assert "Runtime(" in (ROOT / "service" / "http" / "app.py").read_text(encoding="utf-8")


# The local backend's modules, bottom up: each imports only those before it.
LOCAL_ORDER = ("checkpoint", "pieces", "masking", "convert", "engines", "slot", "catalog",
               "loader", "load_retry", "local_translator")


def test_the_local_backend_is_built_bottom_up() -> None:
    graph = _graph()
    package = {f"models.local.{name}" for name in LOCAL_ORDER}
    assert {m for m in graph if m.startswith("models.local.")} == package
    for i, name in enumerate(LOCAL_ORDER):
        below = {f"models.local.{lower}" for lower in LOCAL_ORDER[:i]}
        imported = {m for m in graph[f"models.local.{name}"] if m.startswith("models.local")}
        assert imported <= below, f"models.local.{name} imports {sorted(imported - below)}"
