"""The CTranslate2 engine: conversion, the cache, parity with transformers, serving.

Tiny test checkpoints of the three families (``service.tools.testmodel``) are converted by the
real converter and served by a real ``ctranslate2.Translator``; the engine-agnostic behaviour
(codes, splitting, bounds, failures) is covered for both engines by tests/test_local.py.

The backend converts in a child process; here the child's command runs in the test process
(tests/checkpoints.py), but for the test marked ``child_conversion``, which only a real child
passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ctranslate2", reason="needs the ct2 extra: pip install 'thinktrans[ct2]'")
pytest.importorskip("torch", reason="needs the local extra: pip install 'thinktrans[local]'")


from models.errors import BackendConfigError
from models.local import LocalTranslator, engines
from models.local import convert as convert_module
from models.local.convert import ConversionError, cache_path, convert, is_converted, read_meta
from models.registry import build_backend
from service.cli import app
from service.settings import load_settings
from tests.conftest import make_settings, post_chunks, read_until, segments, start_app
from tests.test_local import TEXTS as LOCAL_TEXTS

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

FAMILIES = ("nllb", "m2m100", "marian")
TEXTS = LOCAL_TEXTS[:4]  # the English ones


@pytest.fixture(scope="module")
def checkpoints(models: dict[str, Path]) -> dict[str, Path]:
    """The session's test checkpoints (tests/checkpoints.py), one per family; read only."""
    return {family: models[family] for family in FAMILIES}


@pytest.fixture(scope="module")
def converted(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    """Each family converted by `thinktrans convert`, at int8, as an operator would."""
    from typer.testing import CliRunner

    root = tmp_path_factory.mktemp("converted")
    out = {}
    for family, path in checkpoints.items():
        result = CliRunner().invoke(app, ["convert", str(path), str(root / family)])
        assert result.exit_code == 0, result.output
        out[family] = root / family
    return out


@pytest.fixture(autouse=True)
def _offline(hub_offline: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Offline (conftest cleared THINKTRANS_*); conversions on first load go to this test's
    own cache, so that each test sees its own conversions."""
    monkeypatch.setenv("THINKTRANS_LOCAL_CT2_CACHE", str(tmp_path / "ct2-cache"))


async def started(model: str | Path, **overrides: Any) -> LocalTranslator:
    overrides.setdefault("local_engine", "ctranslate2")
    settings = load_settings(backend="local", local_model=str(model), **overrides)
    backend = build_backend("local", settings)
    assert isinstance(backend, LocalTranslator)
    await backend.start()
    assert await backend.wait_ready(timeout_s=120), backend.reason
    return backend


async def failure_reason(model: str | Path, **overrides: Any) -> str:
    """The reason a backend that cannot load gives, once its first attempt has failed."""
    overrides.setdefault("local_engine", "ctranslate2")
    backend = build_backend("local", load_settings(backend="local", local_model=str(model),
                                                   **overrides))
    await backend.start()
    assert not await backend.wait_ready(timeout_s=60)
    reason = backend.reason or ""
    await backend.aclose()
    return reason


async def translate_with(model: str | Path, target: str = "de", **overrides: Any
                         ) -> tuple[list[str], dict[str, Any]]:
    backend = await started(model, **overrides)
    try:
        out = await backend.translate(TEXTS, source="en", target=target)
        return out, backend.info()
    finally:
        await backend.aclose()


# -- conversion ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_convert_writes_a_servable_directory(converted: dict[str, Path], family: str) -> None:
    path = converted[family]
    assert is_converted(path)
    meta = read_meta(path)
    assert meta["family"] == family and meta["quantization"] == "int8"
    assert meta["thinktrans_test_checkpoint"] is True
    names = {p.name for p in path.iterdir()}
    assert {"model.bin", "config.json", "generation_config.json", "tokenizer_config.json"} <= names
    assert not [n for n in names if n.endswith(".safetensors")], "no HF weights are copied"
    # CTranslate2's config.json, not the checkpoint's: that one says model_type.
    assert "model_type" not in json.loads((path / "config.json").read_text())


def test_convert_refuses_what_it_cannot_convert(tmp_path: Path, converted: dict[str, Path]
                                                ) -> None:
    with pytest.raises(ConversionError, match="not a directory"):
        convert(str(tmp_path / "missing"), tmp_path / "out")
    with pytest.raises(ConversionError, match="--force"):
        convert(str(converted["nllb"]), converted["nllb"])  # not empty
    with pytest.raises(ConversionError, match="unknown quantization"):
        convert(str(converted["nllb"]), tmp_path / "out", quantization="int3")


def test_convert_command_line_errors_are_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["convert", str(tmp_path / "nope"), str(tmp_path / "out")])
    assert result.exit_code == 3
    assert result.output.strip().startswith("thinktrans: ")
    assert len(result.output.strip().splitlines()) == 1


# -- serving ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
async def test_greedy_float32_output_matches_transformers(
    checkpoints: dict[str, Path], family: str
) -> None:
    """The same checkpoint, the same guards, float32 on both: the same text, token for token."""
    reference, info_tf = await translate_with(checkpoints[family], local_engine="transformers")
    ours, info_ct2 = await translate_with(checkpoints[family], local_compute_type="float32")
    assert (info_tf["engine"], info_ct2["engine"]) == ("transformers", "ctranslate2")
    assert info_ct2["compute_type"] == "float32"
    assert all(text.strip() for text in ours)
    assert ours == reference


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_converted_directory_is_served(converted: dict[str, Path], family: str) -> None:
    out, info = await translate_with(converted[family])
    assert info["engine"] == "ctranslate2" and info["compute_type"] == "int8"
    assert info["family"] == family and info["device"] == "cpu"
    assert len(out) == len(TEXTS) and all(text.strip() for text in out) and out != TEXTS


async def test_auto_picks_ctranslate2_where_installed(converted: dict[str, Path]) -> None:
    _, info = await translate_with(converted["marian"], local_engine="auto")
    assert info["engine"] == "ctranslate2"


async def test_a_converted_directory_on_transformers_says_what_to_set(
    converted: dict[str, Path],
) -> None:
    reason = await failure_reason(converted["nllb"], local_engine="transformers")
    assert "THINKTRANS_LOCAL_ENGINE=ctranslate2" in reason


async def test_a_converted_directory_without_its_tokenizer(
    converted: dict[str, Path], tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("model.bin", "config.json", "shared_vocabulary.json"):
        (bare / name).write_bytes((converted["nllb"] / name).read_bytes())
    assert "lacks its tokenizer files" in await failure_reason(bare)


@pytest.mark.parametrize("family", FAMILIES)
async def test_through_the_service_one_shot_stream_and_backends(
    converted: dict[str, Path], family: str
) -> None:
    """As a user runs it: /v1/backends names the engine, /v1/translate and a stream translate."""
    settings = make_settings(backend="local", local_model=str(converted[family]),
                             local_engine="ctranslate2", deadline_ms=60_000,
                             default_locale="de")
    async for run in start_app(settings):
        assert await run.runtime.backends["local"].wait_ready(120)
        assert (await run.client.get("/readyz")).status_code == 200
        backends = (await run.client.get("/v1/backends")).json()
        [local] = [b for b in backends["backends"] if b["name"] == "local"]
        assert local["info"]["engine"] == "ctranslate2" and local["info"]["family"] == family
        assert local["info"]["compute_type"] == "int8" and local["info"]["device"] == "cpu"

        r = await run.client.post("/v1/translate", json={"target": "de", "texts": TEXTS[:2]})
        assert r.status_code == 200, r.text
        for result, text in zip(r.json()["results"], TEXTS[:2], strict=True):
            [segment] = result["segments"]
            assert segment["status"] == "translated" and segment["backend"] == "local"
            assert segment["text"].strip() and segment["text"] != text

        text = " ".join(TEXTS)
        chunks = [(i, text[k : k + 9]) for i, k in enumerate(range(0, len(text), 9))]
        assert (await post_chunks(run.client, "c1", chunks)).status_code == 200
        await run.client.post("/v1/streams/c1/close")
        events = await read_until(run.client, "c1", timeout_s=60)
        segs = segments(events)
        assert "".join(s["original"] for s in segs) == text
        translated = [s for s in segs if s["status"] == "translated"]
        assert translated and all(s["backend"] == "local" for s in translated)


# -- the conversion cache --------------------------------------------------------------------


async def test_a_checkpoint_is_converted_once_and_again_when_it_changes(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "marian"
    source.mkdir()
    for entry in checkpoints["marian"].iterdir():
        (source / entry.name).write_bytes(entry.read_bytes())
    cache = tmp_path / "cache"
    runs: list[list[str]] = []
    real_run = convert_module.subprocess.run

    def counting_run(command: list[str], **kwargs: Any) -> Any:
        runs.append(command)
        return real_run(command, **kwargs)

    monkeypatch.setattr(convert_module.subprocess, "run", counting_run)
    first, info = await translate_with(source, local_ct2_cache=str(cache))
    assert len(runs) == 1 and info["engine"] == "ctranslate2"
    [entry] = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert entry.name.startswith(cache_path(cache, str(source), "int8", "x").name[:-1])
    assert read_meta(entry)["source"] == str(source)
    again, _ = await translate_with(source, local_ct2_cache=str(cache))  # a restart
    assert len(runs) == 1 and again == first
    # A changed checkpoint (new weights) is converted anew; the old conversion is not used.
    weights = source / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    await translate_with(source, local_ct2_cache=str(cache))
    assert len(runs) == 2
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2
    assert not [p for p in cache.iterdir() if p.name.startswith(".converting")]


async def test_an_unwritable_cache_names_the_setting_and_auto_falls_back(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    locked = tmp_path / "locked"
    locked.write_text("a file where the cache's parent directory should be")  # even root fails
    reason = await failure_reason(checkpoints["nllb"], local_ct2_cache=str(locked / "c"))
    assert "THINKTRANS_LOCAL_CT2_CACHE" in reason
    out, info = await translate_with(checkpoints["nllb"], local_engine="auto",
                                     local_ct2_cache=str(locked / "c"))
    assert info["engine"] == "transformers" and "ctranslate2" in info["engine_note"]
    assert all(out)


@pytest.mark.child_conversion
async def test_a_failed_conversion_says_why_and_auto_falls_back(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converter's own message reaches the reason; under auto, torch serves instead.
    The converter is shadowed for child processes only: this passes only if the conversion
    runs in one, as it must (the full-precision checkpoint stays out of the service)."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))
    shadow = tmp_path / "shadow" / "ctranslate2" / "converters"
    shadow.mkdir(parents=True)
    # The child process imports this instead of the real converter, as a broken install would.
    (shadow.parent / "__init__.py").write_text("")
    (shadow / "__init__.py").write_text(
        "class TransformersConverter:\n"
        "    def __init__(self, *a, **k): pass\n"
        "    def convert(self, *a, **k): raise ValueError('vocabulary 0 has size 1')\n"
    )
    assert "vocabulary 0 has size 1" in await failure_reason(checkpoints["marian"])
    _, info = await translate_with(checkpoints["marian"], local_engine="auto")
    assert info["engine"] == "transformers" and "vocabulary 0 has size 1" in info["engine_note"]


# -- packages --------------------------------------------------------------------------------


def test_missing_ctranslate2_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = engines.find_spec
    monkeypatch.setattr(engines, "find_spec",
                        lambda name: None if name == "ctranslate2" else real(name))
    needs = r"needs 'ctranslate2': pip install 'thinktrans\[ct2\]'"
    with pytest.raises(BackendConfigError, match=needs):
        build_backend("local", load_settings(backend="local", local_engine="ctranslate2"))


def test_serving_a_converted_model_needs_no_torch(converted: dict[str, Path]) -> None:
    """In a process where torch cannot be imported, a converted model loads and translates."""
    script = f"""
import asyncio, sys
sys.modules["torch"] = None  # find_spec answers None, import raises: as if not installed
from models.local import LocalTranslator
from service.settings import load_settings

async def main():
    config = load_settings(local_model={str(converted["nllb"])!r},
                           local_engine="ctranslate2").local_config()
    backend = LocalTranslator(config)
    await backend.start()
    assert await backend.wait_ready(120), backend.reason
    print(await backend.translate(["Hello there."], source="en", target="de"))
    assert sys.modules["torch"] is None
    await backend.aclose()

asyncio.run(main())
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env, cwd=Path(__file__).parent.parent, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("['")


# -- CPU threads -----------------------------------------------------------------------------


async def test_a_small_models_batch_is_cut_for_the_workers(checkpoints: dict[str, Path]) -> None:
    """A narrow model's batch goes to single-threaded workers in parts; the answers are the
    same as in one part, in the input order."""
    whole, info_one = await translate_with(checkpoints["nllb"], local_ct2_workers=1,
                                           local_threads=2)
    assert (info_one["workers"], info_one["threads"]) == (1, 2)
    backend = await started(checkpoints["nllb"], local_threads=2)  # d_model 32: small
    try:
        assert (backend.info()["workers"], backend.info()["threads"]) == (2, 2)
        translator = backend._catalog.slots[0].model
        seen: list[int] = []

        class Spy:
            def translate_batch(self, source: list[list[str]], **kwargs: Any) -> Any:
                seen.append(kwargs["max_batch_size"])
                return translator.translate_batch(source, **kwargs)

        backend._catalog.slots[0].loaded.model = Spy()
        parts = await backend.translate(TEXTS, source="en", target="de")
    finally:
        await backend.aclose()
    assert seen == [2]  # 4 texts, 2 workers: parts of 2
    assert parts == whole


def _copies(source: Path, root: Path, names: str) -> list[Path]:
    """Copies of a checkpoint, each its own model to the cache (its own path)."""
    out = []
    for name in names:
        copy = root / name
        copy.mkdir(parents=True)
        for entry in source.iterdir():
            (copy / entry.name).write_bytes(entry.read_bytes())
        out.append(copy)
    return out


def _cached(cache: Path) -> list[str]:
    """The converted models in ``cache``, by the name of the checkpoint's directory."""
    return sorted(read_meta(p)["source"].rsplit("/", 1)[-1] for p in cache.iterdir()
                  if not p.name.startswith("."))


async def test_the_conversion_cache_is_bounded_in_bytes_never_dropping_one_in_use(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    a, b, c, d = _copies(checkpoints["marian"], tmp_path / "models", "abcd")
    cache = tmp_path / "cache"
    await translate_with(a, local_ct2_cache=str(cache))
    [entry] = cache.iterdir()
    one = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
    bound_mb = 2.5 * one / (1 << 20)  # room for two conversions
    await translate_with(b, local_ct2_cache=str(cache), local_ct2_cache_mb=bound_mb)
    assert _cached(cache) == ["a", "b"]
    await translate_with(c, local_ct2_cache=str(cache), local_ct2_cache_mb=bound_mb)
    assert _cached(cache) == ["b", "c"]  # a, the least recently used, is gone
    # b is used again (a restart on it): c is now the least recently used.
    await translate_with(b, local_ct2_cache=str(cache), local_ct2_cache_mb=bound_mb)
    # One in use is never removed: d's conversion, loaded and open, stays, and so does b's
    # while a backend serves it, even past the bound.
    serving = await started(b, local_ct2_cache=str(cache), local_ct2_cache_mb=one / 2 / (1 << 20))
    try:
        await translate_with(d, local_ct2_cache=str(cache),
                             local_ct2_cache_mb=one / 2 / (1 << 20))
        assert _cached(cache) == ["b", "d"]
        assert all(await serving.translate(TEXTS, source="en", target="de"))
    finally:
        await serving.aclose()


async def test_other_spellings_of_the_model_convert_nothing_again(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [a] = _copies(checkpoints["marian"], tmp_path / "models", "a")
    runs: list[list[str]] = []
    real_run = convert_module.subprocess.run
    monkeypatch.setattr(convert_module.subprocess, "run",
                        lambda command, **kw: runs.append(command) or real_run(command, **kw))
    backend = await started(a, local_ct2_cache=str(tmp_path / "cache"))
    try:
        for spelling in (f"{a}/./", f"{a}/", str(a).replace("/", "//")):
            assert backend.model_problem(spelling) is None
            assert all(await backend.translate(TEXTS, source="en", target="de", model=spelling))
        assert len(runs) == 1 and _cached(tmp_path / "cache") == ["a"]
    finally:
        await backend.aclose()


async def test_a_killed_conversion_leaves_nothing_behind(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A conversion killed midway leaves its `.converting-*` directory, unlocked: the next
    start removes it; one whose process still runs (its lock held) is left alone."""
    cache = tmp_path / "cache"
    cache.mkdir()
    killed, running = cache / ".converting-killed", cache / ".converting-running"
    hold = ("import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "(open(sys.argv[1] + '.part', 'w')).write('x' * 4096)\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n")
    children = []
    for work in (killed, running):
        work.mkdir()
        child = subprocess.Popen([sys.executable, "-c", hold, str(work / ".lock")],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        children.append(child)
    try:
        children[0].kill()  # SIGKILL: no cleanup of its own
        children[0].wait(timeout=30)
        await translate_with(checkpoints["marian"], local_ct2_cache=str(cache))
        left = sorted(p.name for p in cache.iterdir() if p.name.startswith("."))
        assert left == [".converting-running"]
    finally:
        for child in children:
            child.kill()
            child.wait(timeout=30)
    await translate_with(checkpoints["m2m100"], local_ct2_cache=str(cache))  # converts: sweeps
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]
