"""Operator mistakes through the real command line: exit 2 and one line naming the
setting, from `thinktrans serve` (before anything listens) and `thinktrans translate`,
never a traceback or uvicorn's exit 3."""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakes_remote import closed_port_url

ROOT = Path(__file__).resolve().parent.parent

# Each case: what it sets up in a temporary directory -> (variables, --config file or None),
# and the words its one line must hold.
Case = Callable[[Path], tuple[dict[str, str], Path | None]]


def _cache_mb(value: str) -> Case:
    return lambda tmp: ({"THINKTRANS_CACHE_MB": value}, None)


def _directory(tmp: Path) -> tuple[dict[str, str], Path | None]:
    return {"THINKTRANS_CACHE_PATH": str(tmp)}, None


def _not_sqlite(tmp: Path) -> tuple[dict[str, str], Path | None]:
    path = tmp / "notes.txt"
    path.write_text("my notes, not a database\n" * 200)
    return {"THINKTRANS_CACHE_PATH": str(path)}, None


def _under_a_file(tmp: Path) -> tuple[dict[str, str], Path | None]:
    (tmp / "file").write_text("x")
    return {"THINKTRANS_CACHE_PATH": str(tmp / "file" / "cache.db")}, None


def _symlink(tmp: Path) -> tuple[dict[str, str], Path | None]:
    victim = tmp / "other.db"
    sqlite3.connect(victim).close()
    (tmp / "cache.db").symlink_to(victim)
    return {"THINKTRANS_CACHE_PATH": str(tmp / "cache.db")}, None


def _latin1_config(tmp: Path) -> tuple[dict[str, str], Path | None]:
    path = tmp / "thinktrans.yaml"
    path.write_bytes("backend: passthrough  # für Tests\n".encode("latin-1"))
    return {}, path


def _duplicate_key(tmp: Path) -> tuple[dict[str, str], Path | None]:
    path = tmp / "thinktrans.yaml"
    path.write_text("backend: passthrough\nbackend: local\n")
    return {}, path


def _glossary(text: str) -> Case:
    def make(tmp: Path) -> tuple[dict[str, str], Path | None]:
        path = tmp / "glossary.yaml"
        path.write_text(text, encoding="utf-8")
        return {"THINKTRANS_GLOSSARY_FILE": str(path)}, None
    return make


def _glossary_fifo(tmp: Path) -> tuple[dict[str, str], Path | None]:
    os.mkfifo(tmp / "glossary.yaml")  # no writer: reading it would wait for ever
    return {"THINKTRANS_GLOSSARY_FILE": str(tmp / "glossary.yaml")}, None


def _glossary_at(path: str) -> Case:
    return lambda tmp: ({"THINKTRANS_GLOSSARY_FILE": path}, None)


def _glossary_large(tmp: Path) -> tuple[dict[str, str], Path | None]:
    env, _ = _glossary("zh: {keep: [a]}\n" + "#" * 2000 + "\n")(tmp)
    return {**env, "THINKTRANS_MAX_GLOSSARY_FILE_BYTES": "1024"}, None


def _boolean(value: str) -> Case:
    return lambda tmp: ({"THINKTRANS_PREVIEWS": value}, None)


def _boolean_in_file(tmp: Path) -> tuple[dict[str, str], Path | None]:
    path = tmp / "thinktrans.yaml"
    path.write_text("backend: passthrough\ncheck_output_language: off\n")
    return {}, path


CASES: dict[str, tuple[Case, list[str]]] = {
    "cache_mb inf": (_cache_mb("inf"), ["THINKTRANS_CACHE_MB", "finite"]),
    "cache_mb nan": (_cache_mb("nan"), ["THINKTRANS_CACHE_MB"]),
    "cache_mb negative": (_cache_mb("-5"), ["THINKTRANS_CACHE_MB"]),
    "cache_mb huge": (_cache_mb("1e300"), ["THINKTRANS_CACHE_MB"]),
    "cache path a directory": (_directory, ["THINKTRANS_CACHE_PATH"]),
    "cache path not sqlite": (_not_sqlite, ["THINKTRANS_CACHE_PATH", "notes.txt"]),
    "cache path under a file": (_under_a_file, ["THINKTRANS_CACHE_PATH"]),
    "cache path a symlink": (_symlink, ["THINKTRANS_CACHE_PATH", "symbolic link"]),
    "config not utf-8": (_latin1_config, ["thinktrans.yaml", "UTF-8"]),
    "config key twice": (_duplicate_key, ["thinktrans.yaml", "'backend'", "twice"]),
    "glossary target twice": (
        _glossary("zh:\n  keep: [thinktrans]\nde:\n  keep: [x]\nzh:\n  terms: {merge: 合并}\n"),
        ["THINKTRANS_GLOSSARY_FILE", "glossary.yaml", "'zh' twice", "lines 1 and 5"]),
    "glossary target twice, spelled apart": (
        _glossary("zh-cn: {keep: [a]}\nzh-CN: {keep: [b]}\n"),
        ["glossary.yaml", "'zh-CN' twice", "'zh-cn'"]),
    "glossary a FIFO": (_glossary_fifo, ["THINKTRANS_GLOSSARY_FILE", "FIFO", "regular file"]),
    "glossary /dev/zero": (_glossary_at("/dev/zero"), ["/dev/zero", "character device"]),
    "glossary a directory": (lambda tmp: ({"THINKTRANS_GLOSSARY_FILE": str(tmp)}, None),
                             ["THINKTRANS_GLOSSARY_FILE", "directory"]),
    "glossary too large": (_glossary_large, ["glossary.yaml", "more than 1024 bytes",
                                             "THINKTRANS_MAX_GLOSSARY_FILE_BYTES"]),
    "boolean yes": (_boolean("yes"), ["THINKTRANS_PREVIEWS", "true or false", "'yes'"]),
    "boolean off in the file": (_boolean_in_file, ["THINKTRANS_CHECK_OUTPUT_LANGUAGE",
                                                   "true or false", "'off'"]),
    "list item not a string": (lambda tmp: ({"THINKTRANS_SPAN_KINDS": '["code", 3]'}, None),
                               ["THINKTRANS_SPAN_KINDS", "valid string"]),
}


def _memory_cap() -> None:
    """A run that reads what it must not (``/dev/zero``) fails at 4 GiB, not the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run(command: list[str], env: dict[str, str], config: Path | None
        ) -> subprocess.CompletedProcess[str]:
    args = [*command, *(["--config", str(config)] if config else [])]
    environ = {**os.environ, "THINKTRANS_BACKEND": "passthrough", **env}
    if config is not None:
        del environ["THINKTRANS_BACKEND"]  # the file says which backend
    try:
        return subprocess.run([sys.executable, "-m", "service.cli", *args], env=environ,
                              cwd=ROOT, capture_output=True, text=True, timeout=60,
                              preexec_fn=_memory_cap)
    except subprocess.TimeoutExpired as exc:  # it served: nothing was refused
        raise AssertionError(f"{args} still running after 60 s") from exc


# `serve` with each (where the lifespan gave tracebacks); `translate` with one of each kind.
RUNS = [*(("serve", case) for case in CASES),
        *(("translate", case) for case in ("cache_mb inf", "cache path not sqlite",
                                           "cache path a symlink", "config not utf-8",
                                           "config key twice", "glossary target twice",
                                           "glossary a FIFO", "boolean yes"))]


@pytest.mark.parametrize(("command", "case"), RUNS)
def test_a_bad_setting_is_one_line_and_exit_2(tmp_path: Path, command: str, case: str) -> None:
    make, words = CASES[case]
    env, config = make(tmp_path)
    if command == "serve":
        argv = ["serve", "--port", closed_port_url().rsplit(":", 1)[1]]
    else:
        argv = ["translate", "--to", "de", "Hello there, this is a test."]
    result = run(argv, env, config)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert (result.returncode, lines[0].startswith("thinktrans: ")) == (2, True), lines[0]
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("roots", ["/models, /srv/models", '["/models", "/srv/models"]'])
def test_a_list_variable_starts_in_either_form(roots: str) -> None:
    # THINKTRANS_LOCAL_MODEL_ROOTS was refused in both forms ("should be a valid list").
    result = run(["translate", "--to", "de", "Hello there, this is a test."],
                 {"THINKTRANS_LOCAL_MODEL_ROOTS": roots}, None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "Hello there, this is a test."
