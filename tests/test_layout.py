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
