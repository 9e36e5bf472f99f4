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


def test_backends_import_nothing_from_the_service_but_its_errors() -> None:
    for path in _modules("models"):
        from_service = {m for m in _imports(path) if m == "service" or m.startswith("service.")}
        assert from_service <= {"service.errors"}, f"{path.name} imports {from_service}"


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


STREAM_PARTS = ("streams", "intake", "admission", "cutting", "emission")
MAX_CLASS_LINES = 300


def test_a_streams_parts_are_classes_of_one_job() -> None:
    """A stream is composed of small parts (service/streams.py and its parts' modules)."""
    long = []
    for name in STREAM_PARTS:
        path = ROOT / "service" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long.append(f"{path.name}: {node.name} ({lines})")
    assert not long, long


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_on_load(node: ast.AST) -> set[str]:
    """The modules imported when a module is loaded: not inside its functions."""
    found: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            found.add(child.module)
        elif isinstance(child, ast.Import):
            found.update(alias.name for alias in child.names)
        else:
            found |= _imports_on_load(child)
    return found


def test_the_service_modules_import_no_circle() -> None:
    """Module-level imports among the service's modules form no cycle (an import hidden
    in a function is not seen here, and is the circle all the same: keep them out)."""
    graph: dict[str, set[str]] = {}
    for path in _modules("service"):
        found = _imports_on_load(ast.parse(path.read_text(encoding="utf-8")))
        graph[_module_name(path)] = {m for m in found if m.startswith("service.")}
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                raise AssertionError(" -> ".join([*path[path.index(dep):], dep]))
            if dep in graph and dep not in state:
                walk(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
