"""The house's shape, as the architecture document states it: checked, so that it stays true."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 80


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_backends_import_nothing_from_the_service() -> None:
    for path in _modules("models"):
        from_service = {m for m in _imports(path) if m == "service" or m.startswith("service.")}
        assert not from_service, f"{path.name} imports {from_service}"


def test_serving_modules_do_not_import_the_tooling() -> None:
    serving = [p for p in _modules("service") if "tools" not in p.parts and p.name != "cli.py"]
    for path in serving:
        tooling = {m for m in _imports(path) if m.startswith("service.tools")}
        assert not tooling, f"{path.name} imports {tooling}"


def test_no_function_in_the_service_runs_past_80_lines() -> None:
    long = []
    for path in _modules("service"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, long


def test_the_app_factory_is_wiring_only() -> None:
    assert len((ROOT / "service" / "app.py").read_text().splitlines()) < 200


# -- the backends' floor ----------------------------------------------------------------------

# The local backend's modules, bottom up: each imports only those before it.
LOCAL_ORDER = ("checkpoint", "text", "convert", "engines", "slot", "catalog", "translator")
MAX_CLASS_LINES = 300


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _models_graph() -> dict[str, set[str]]:
    """Every module of models/ and the models/ modules it imports, at any depth of the code
    (an import inside a function counts: it is still a cycle)."""
    names = {_module_name(path): path for path in _modules("models")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from models.local import engines`` imports the module models.local.engines
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(names)
                found.update(submodules or {node.module})
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in names and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        for child in sorted(graph[node]):
            found = visit(child, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_import_cycle_among_the_backends() -> None:
    assert _cycle(_models_graph()) is None, " -> ".join(_cycle(_models_graph()) or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_local_backend_is_built_bottom_up() -> None:
    graph = _models_graph()
    package = {f"models.local.{name}" for name in LOCAL_ORDER}
    assert {m for m in graph if m.startswith("models.local.")} == package
    for i, name in enumerate(LOCAL_ORDER):
        below = {f"models.local.{lower}" for lower in LOCAL_ORDER[:i]}
        imported = {m for m in graph[f"models.local.{name}"] if m.startswith("models.local")}
        assert imported <= below, f"models.local.{name} imports {sorted(imported - below)}"


def test_the_local_backend_has_no_long_class_or_function() -> None:
    long = []
    for path in sorted((ROOT / "models" / "local").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                limit = MAX_CLASS_LINES
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                limit = MAX_FUNCTION_LINES
            else:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, long
