"""thinktrans-client as its own distribution: its imports, its metadata, its locale helper."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from thinktrans_client.locale import MAX_TAG_LENGTH, InvalidLocale, canonicalize, is_allowed

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "client"
PACKAGE = CLIENT / "thinktrans_client"
FORBIDDEN = {"fastapi", "starlette", "pydantic", "pydantic_settings", "uvicorn", "torch",
             "transformers", "langdetect", "langcodes", "language_data", "numpy", "deepl",
             "yaml", "prometheus_client", "service", "models"}


# -- what it imports -----------------------------------------------------------------------


def test_import_loads_only_httpx_and_the_standard_library(tmp_path: Path) -> None:
    # Run from an empty directory with only client/ added: the checkout's root, which
    # holds `service` and `models`, is not on the path unless something installed it.
    code = (
        "import json, sys\n"
        "import httpx\n"
        "before = set(sys.modules)\n"
        "import thinktrans_client, thinktrans_client.acp, thinktrans_client.client\n"
        "import thinktrans_client.locale\n"
        "print(json.dumps({'file': thinktrans_client.__file__, 'all': sorted(sys.modules),\n"
        "                  'new': sorted(set(sys.modules) - before),\n"
        "                  'stdlib': sorted(sys.stdlib_module_names)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, env={**env, "PYTHONPATH": str(CLIENT)}, check=True)
    seen = json.loads(out.stdout)
    assert Path(seen["file"]).resolve().parent == PACKAGE
    top = {name.split(".")[0] for name in seen["all"]}
    assert top & FORBIDDEN == set()
    # What the package adds beyond httpx's own imports: itself and the standard library.
    added = {name.split(".")[0] for name in seen["new"]}
    assert added - set(seen["stdlib"]) - {"thinktrans_client"} == set()


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_sources_import_only_httpx_and_the_standard_library() -> None:
    """Imports anywhere in the package, lazy ones in functions included; the proxy also
    imports the ACP SDK (its ``acp`` extra), and nothing imports the proxy."""
    sources = sorted(PACKAGE.glob("*.py"))
    assert {p.name for p in sources} >= {"__init__.py", "client.py", "acp.py", "locale.py",
                                         "proxy.py"}
    for path in sources:
        extra = _imported_modules(path) - sys.stdlib_module_names - {"httpx",
                                                                     "thinktrans_client"}
        assert extra == ({"acp"} if path.name == "proxy.py" else set()), (
            f"{path.name} imports {sorted(extra)}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not any(isinstance(node, ast.ImportFrom) and node.module
                       and node.module.endswith("proxy") for node in ast.walk(tree))


def _package_imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (in functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "thinktrans_client":
            modules = [f"thinktrans_client.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        names.update(module.split(".")[1] for module in modules
                     if module.startswith("thinktrans_client."))
    return names


def test_the_modules_import_no_circle() -> None:
    """The stream's parts (posting, reading, fallback) never import the client back."""
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    graph = {path.stem: _package_imports(path) & modules for path in PACKAGE.glob("*.py")}
    assert {"posting", "reading", "fallback", "pending"} <= set(graph)
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in graph[module]:
                visit(imported, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())


def test_no_class_reaches_into_another_objects_private_members() -> None:
    """``obj._name`` only on ``self`` or ``cls``: the client's surface for streams is public."""
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                owner = node.value
                assert isinstance(owner, ast.Name) and owner.id in {"self", "cls"}, (
                    f"{path.name}:{node.lineno} uses {ast.unparse(node)}")


def test_public_names() -> None:
    import thinktrans_client

    for name in thinktrans_client.__all__:
        assert getattr(thinktrans_client, name) is not None
    assert {"ThinktransClient", "ThinkingStream", "ThoughtTranslator", "TranslatedSegment",
            "SegmentUpdate", "SidecarError", "locale_from_initialize",
            "safe_stream_id"} <= set(thinktrans_client.__all__)
    client = thinktrans_client.ThinktransClient
    for method in ("request", "note_failure", "release_stream", "translate", "stream",
                   "aclose"):
        assert callable(getattr(client, method)), method
    assert (PACKAGE / "py.typed").is_file()


# -- its distribution ----------------------------------------------------------------------


def test_pyproject_depends_on_httpx_only_and_ships_only_its_package() -> None:
    meta = tomllib.loads((CLIENT / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    assert project["name"] == "thinktrans-client"
    assert project["version"] == "0.1.0"
    assert project["requires-python"] == ">=3.11"
    assert project["license"] == "Apache-2.0"
    assert project["dependencies"] == ["httpx>=0.27"]
    assert project["optional-dependencies"] == {"acp": ["agent-client-protocol>=0.12"]}
    assert project["scripts"] == {"thinktrans-acp": "thinktrans_client.proxy:main"}
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["thinktrans_client*"]
    assert any(req.startswith("setuptools") for req in meta["build-system"]["requires"])
    assert (CLIENT / "README.md").is_file()


def test_package_discovery_finds_only_the_client() -> None:
    from setuptools import find_packages

    meta = tomllib.loads((CLIENT / "pyproject.toml").read_text(encoding="utf-8"))
    include = meta["tool"]["setuptools"]["packages"]["find"]["include"]
    assert find_packages(where=str(CLIENT), include=include) == ["thinktrans_client"]


# -- the locale helper ---------------------------------------------------------------------


@pytest.mark.parametrize(("tag", "expected"), [
    ("zh-CN", "zh-CN"),
    ("ZH-cn", "zh-CN"),
    ("en", "en"),
    ("EN", "en"),
    ("pt-br", "pt-BR"),
    ("zh-hant-tw", "zh-Hant-TW"),
    ("SR-LATN-rs", "sr-Latn-RS"),
    ("es-419", "es-419"),
    ("de-de-1996", "de-DE-1996"),
    ("sl-rozaj-biske", "sl-biske-rozaj"),  # variants in order, as the sidecar writes them
    ("zh-yue-HK", "yue-HK"),  # Cantonese's extlang is its own language, as on the sidecar
    ("ar-arb", "ar-arb"),  # an extlang stays lower case
    ("ZH-HANS-CN-U-CO-PINYIN", "zh-Hans-CN-u-co-pinyin"),  # extensions are lower case
    ("en-a-BB-x-CC", "en-a-bb-x-cc"),  # in extensions, 2 letters are not a region
    ("en-US-x-Foo-1", "en-US-x-foo-1"),
    ("iw", "he"),
    ("in-ID", "id-ID"),
])
def test_canonicalize(tag: str, expected: str) -> None:
    assert canonicalize(tag) == expected
    assert canonicalize(expected) == expected


@pytest.mark.parametrize("tag", [
    "", "zh_CN", "zh-", "-zh", "zh--CN", "z", "en US", " en", "en\n", "zh-CN\u202e",
    "e\u200bn", "én", "ｅｎ", "en-123456789", "a" * 70, "und", "und-US", "x-private",
    "i-klingon", "abcd", "abcde-US", "en-US-US", "en-abcd-efgh", "de-1996-1996", "en-u",
    "en-a-b", "en-a-bb-a-cc", "en-x", "en-Latn-Latn", "zh-yue-yue-yue-yue", 42, None,
])
def test_canonicalize_refuses(tag: object) -> None:
    with pytest.raises(InvalidLocale):
        canonicalize(tag)


def test_refusals_say_what_to_do_without_echoing_unsafe_input() -> None:
    with pytest.raises(InvalidLocale, match="use '-', not '_'") as caught:
        canonicalize("zh_CN")
    assert "zh_CN" not in str(caught.value)
    for tag in ("en\u202e", "en\x1b[31m", "e\u2028n"):
        with pytest.raises(InvalidLocale, match="control or bidi") as caught:
            canonicalize(tag)
        assert tag not in str(caught.value)
    with pytest.raises(InvalidLocale, match=f"at most {MAX_TAG_LENGTH}"):
        canonicalize("en-" + "-".join(["abcdefgh"] * 8))
    assert isinstance(InvalidLocale("x"), ValueError)


@pytest.mark.parametrize(("tag", "allowed", "expected"), [
    ("zh-CN", (), True),  # no list: everything
    ("zh-CN", ("zh",), True),  # a bare language admits its regions...
    ("zh-Hant-TW", ("zh",), True),  # ...and scripts
    ("zh-CN", ("zh-CN",), True),
    ("zh-CN", ("ZH-cn",), True),  # entries are canonicalised
    ("zh-TW", ("zh-CN",), False),  # a region admits only itself
    ("zh-Hant-TW", ("zh-Hant",), False),  # so does a script
    ("zh", ("zh-CN",), False),
    ("ja-JP", ("zh", "en"), False),
    ("de-AT", ("de-1996",), True),  # a variant names neither script nor region
    ("en-GB", ("en-x-priv",), True),
    ("en", ("zh_CN", "???"), False),  # malformed entries admit nothing
    ("en", ("zh_CN", "en"), True),
    ("he-IL", ("iw",), True),
    ("en", "en", True),  # one entry as a plain string, not its letters
])
def test_is_allowed(tag: str, allowed: tuple[str, ...] | str, expected: bool) -> None:
    assert is_allowed(tag, allowed) is expected
