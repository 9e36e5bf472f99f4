"""Each setting's default is written once, in its settings field: no config class or
function signature under ``pool/`` and ``service/`` gives the same value as a default of a
field or parameter named for that setting (its name, its name without its section's prefix,
``pool_max_clients`` as ``max_clients``, or a name the code gives it, below). Such a part
takes the value from its caller, which has it from the settings.

Not scanned, as their defaults are their own: the settings module itself, the CLI's options
(``typer.Option`` parameters), the tooling in ``service/tools`` (compare's and bench's
knobs), and the response schemas (``*Response``: what an answer says, not a setting).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("pool", "service")
NOT_SCANNED = ("service/settings.py", "service/tools/")

# Names code gives a setting other than its own or its own without its section's prefix.
CALLED: dict[str, tuple[str, ...]] = {
    "pool_client_max_waiting": ("max_waiting",),
    "pool_fair_unit": ("unit",),
    "max_segment_chars": ("max_chars",),
}

# Restated defaults in modules being reworked on their own (service/stream, service/chain):
# each to go as its module takes the value from its caller.
PENDING: frozenset[tuple[str, str]] = frozenset()

_NONE = object()  # not a constant


def _names() -> dict[str, list[tuple[str, Any]]]:
    """Each name a setting goes by: [(the setting, its default)], for the settings whose
    default is a plain value (None and the empty lists say nothing of where they came from)."""
    names: dict[str, list[tuple[str, Any]]] = {}
    for name, info in Settings.model_fields.items():
        default = info.default
        if default is PydanticUndefined or not isinstance(default, bool | int | float | str):
            continue
        _, _, unprefixed = name.partition("_")
        for alias in {name, unprefixed, *CALLED.get(name, ())} - {""}:
            names.setdefault(alias, []).append((name, default))
    return names


def _constant(node: ast.expr) -> Any:
    """The value of a literal or of arithmetic on literals (``1 << 20``, ``7 * 24 * 3600``);
    ``_NONE`` for anything else."""
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    if not all(isinstance(n, allowed) for n in ast.walk(node)):
        return _NONE
    try:
        return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})
    except Exception:
        return _NONE


def _same(value: Any, default: Any) -> bool:
    """Equal, a bool only to a bool (``1`` is not ``True``), an int to a float by value."""
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    if isinstance(value, int | float) and isinstance(default, int | float):
        return bool(value == default)
    return type(value) is type(default) and value == default


def _is_cli_option(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute | ast.Name)
        and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id)
        in ("Option", "Argument")
        for n in ast.walk(annotation))


def _field_default(value: ast.expr) -> ast.expr | None:
    """A class field's default: the value, or what ``field(default=...)`` or ``Field(...)``
    gives; None for a field without one."""
    if isinstance(value, ast.Call):
        func = value.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called not in ("field", "Field"):
            return value
        given = {k.arg: k.value for k in value.keywords}
        if "default" in given:
            return given["default"]
        return value.args[0] if called == "Field" and value.args else None
    return value


def defaults(tree: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(name, default) of every parameter and class field with a default, but CLI options
    and the fields of response schemas."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults,
                          strict=True),
                     *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                       if d is not None)]
            for arg, default in pairs:
                if not _is_cli_option(arg.annotation):
                    yield arg.arg, default
        elif isinstance(node, ast.ClassDef) and not node.name.endswith("Response"):
            for stmt in node.body:
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and stmt.value is not None):
                    default = _field_default(stmt.value)
                    if default is not None:
                        yield stmt.target.id, default


def restated(source: str, names: dict[str, list[tuple[str, Any]]]) -> list[str]:
    """``name=value (setting), line n`` for each default in ``source`` that is a setting's."""
    found = []
    for name, node in defaults(ast.parse(source)):
        value = _constant(node)
        if value is _NONE:
            continue
        for setting, default in names.get(name, []):
            if _same(value, default):
                found.append(f"{name}={value!r} ({setting}), line {node.lineno}")
    return found


def test_no_setting_default_is_restated_in_a_signature_or_config_class() -> None:
    names = _names()
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(NOT_SCANNED):
                continue
            for line in restated(path.read_text(encoding="utf-8"), names):
                if (rel, line.partition("=")[0]) not in PENDING:
                    found.append(f"{rel}: {line}")
    assert not found, ("defaults that are settings' (take them from the caller, which has "
                       "them from the settings):\n" + "\n".join(found))


def test_the_scan_tells_a_restated_default_from_the_rest() -> None:
    """What the scan flags and what it leaves, on a module written for it."""
    source = '''
import typer
from dataclasses import dataclass, field
from pydantic import BaseModel, Field

@dataclass
class Limits:
    max_call_bytes: int = 1 << 20          # pool_max_call_bytes, without its prefix
    max_clients: int = field(default=1024) # pool_max_clients
    fair: bool = 1                         # an int, not pool_fair's True
    unit: str = "segments"                 # not pool_fair_unit's value

class Knobs(BaseModel):
    policy: str = Field("translate")      # policy

class OpenStreamResponse(BaseModel):
    previews: bool = False                 # a response schema

def cut(text, max_chars=400, *, max_fence_chars=20_000, timeout_s=60): ...

def serve(port: Annotated[int, typer.Option(help="Port.")] = 8088, host="127.0.0.1"): ...

def compare(n):
    return n == 400                        # a comparison, not a default
'''
    found = [line.rpartition(", line")[0] for line in restated(source, _names())]
    assert found == [
        "max_call_bytes=1048576 (pool_max_call_bytes)",
        "max_clients=1024 (pool_max_clients)",
        "policy='translate' (policy)",
        "max_chars=400 (max_segment_chars)",
        "max_fence_chars=20000 (max_fence_chars)",
        "timeout_s=60 (backend_timeout_s)",
        "host='127.0.0.1' (host)",
    ]
