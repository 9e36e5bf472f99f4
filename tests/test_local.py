"""The local backend on tiny real checkpoints: real from_pretrained loading, real generate.

The checkpoints come from ``service.tools.testmodel`` (random weights, so outputs are garbage but
deterministic); no test touches the network: the hub is switched off for all of them. Every test
runs on both engines (transformers, and CTranslate2 where installed: the checkpoint is converted
on first load into a cache kept for the session) unless it is marked ``engines(...)``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import threading
from collections.abc import AsyncIterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the local extra: pip install 'thinktrans[local]'")
pytest.importorskip("transformers", reason="needs the local extra: pip install 'thinktrans[local]'")

from transformers import AutoConfig, AutoTokenizer

from models.errors import BackendConfigError, BackendUnavailable, UnsupportedLanguage
from models.local import (
    M2M_CODES,
    NLLB_CODES,
    LocalTranslator,
    detect_family,
    engines,
    split_text,
)
from models.passthrough import PassthroughTranslator
from models.registry import build_backend
from service.settings import load_settings
from service.tools import testmodel
from service.tools.testmodel import make_test_model
from tests.configs import local_config
from tests.conftest import app_with

# MarianTokenizer asks for sacremoses, an optional punctuation normaliser these tests do not need.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

ENGINES = ["transformers"] + (["ctranslate2"] if find_spec("ctranslate2") else [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test once per engine; ``@pytest.mark.engines("transformers")`` narrows it."""
    marker = metafunc.definition.get_closest_marker("engines")
    names = [name for name in marker.args if name in ENGINES] if marker else ENGINES
    metafunc.parametrize("engine", names, indirect=True)


@pytest.fixture(autouse=True)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


TEXTS = [
    "Hmm, the user said hello.",
    "First, I need to check the file and then run the tests again.",
    "ok",
    "The function returns a list of numbers; maybe the bug is in the loop.",
    "你好，用户说了你好。",
]


@pytest.fixture(autouse=True)
def _offline(hub_offline: None, monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """No test may reach the hub (conftest has cleared THINKTRANS_* from the caller's shell
    and points the conversion cache at one of the session); the backend runs on this test's
    engine."""
    monkeypatch.setenv("THINKTRANS_LOCAL_ENGINE", engine)


def make_backend(model: str | Path, **overrides: Any) -> LocalTranslator:
    """Through the registry, from ``local_*`` settings, as the service builds it."""
    settings = load_settings(local_model=str(model), backend="local", **overrides)
    backend = build_backend("local", settings)
    assert isinstance(backend, LocalTranslator)
    return backend


async def started(model: str | Path, **overrides: Any) -> LocalTranslator:
    backend = make_backend(model, **overrides)
    await backend.start()
    assert await backend.wait_ready(timeout_s=60), backend.reason
    return backend


@pytest.fixture
async def nllb(models: dict[str, Path]) -> AsyncIterator[LocalTranslator]:
    backend = await started(models["nllb"])
    yield backend
    await backend.aclose()


@pytest.fixture
async def m2m(models: dict[str, Path]) -> AsyncIterator[LocalTranslator]:
    backend = await started(models["m2m100"])
    yield backend
    await backend.aclose()


# -- the test checkpoints themselves ------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "model_type", "tokenizer_class"),
    [
        ("nllb", "m2m_100", "NllbTokenizer"),
        ("m2m100", "m2m_100", "M2M100Tokenizer"),
        ("marian", "marian", "MarianTokenizer"),
    ],
)
def test_test_models_load_through_the_auto_classes(
    models: dict[str, Path], family: str, model_type: str, tokenizer_class: str
) -> None:
    config = AutoConfig.from_pretrained(models[family])
    tokenizer = AutoTokenizer.from_pretrained(models[family])
    assert config.model_type == model_type
    assert type(tokenizer).__name__ == tokenizer_class
    assert detect_family(config, tokenizer) == family


def test_testmodel_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert testmodel.main(["--family", "m2m100", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    with pytest.raises(ValueError, match="family must be one of"):
        make_test_model("t5", tmp_path / "t5")


def test_test_models_are_deterministic(models: dict[str, Path], tmp_path: Path) -> None:
    again = make_test_model("nllb", tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json"):
        assert (again / name).read_bytes() == (models["nllb"] / name).read_bytes()


# -- family detection and language codes ---------------------------------------------------------


@pytest.mark.parametrize("family", ["nllb", "m2m100", "marian"])
async def test_family_detected_and_translations_non_empty(
    models: dict[str, Path], family: str, engine: str
) -> None:
    backend = await started(models[family])
    try:
        info = backend.info()
        assert info["family"] == family and info["engine"] == engine
        compute_type = "float32" if engine == "transformers" else "int8"  # the CPU defaults
        assert info["device"] == "cpu" and info["compute_type"] == compute_type
        out = await backend.translate(TEXTS, source="en", target="de")
        assert len(out) == len(TEXTS)
        assert all(text.strip() for text in out)
        assert out != TEXTS
    finally:
        await backend.aclose()


async def test_nllb_uses_flores_codes(nllb: LocalTranslator) -> None:
    tokenizer = nllb._catalog.slots[0].tokenizer
    route = nllb._catalog.route
    assert route("en", "zh-CN").src_code == "eng_Latn"
    assert route("en", "zh-CN").forced_bos == tokenizer.convert_tokens_to_ids("zho_Hans")
    assert route("en", "zh-TW").forced_bos == tokenizer.convert_tokens_to_ids("zho_Hant")
    assert route("zh-Hans", "en").src_code == "zho_Hans"
    assert route("nb", "pt-BR").src_code == "nob_Latn"
    assert route(None, "de").src_code == "eng_Latn"  # the documented fallback
    assert route("tlh", "de").src_code == "eng_Latn"  # a source outside the table

    # The source code really reaches the encoder: the tokenizer is set per batch.
    await nllb.translate(["こんにちは"], source="ja", target="en")
    assert tokenizer.src_lang == "jpn_Jpan"
    assert tokenizer("x")["input_ids"][0] == tokenizer.convert_tokens_to_ids("jpn_Jpan")


async def test_m2m100_uses_iso_codes_through_get_lang_id(m2m: LocalTranslator) -> None:
    tokenizer = m2m._catalog.slots[0].tokenizer
    assert m2m._catalog.route("en", "de").forced_bos == tokenizer.get_lang_id("de")
    assert m2m._catalog.route("en", "nb").forced_bos == tokenizer.get_lang_id("no")
    assert m2m._catalog.route("en", "zh-TW").forced_bos == tokenizer.get_lang_id("zh")
    assert m2m._catalog.route("ja", "en").src_code == "ja"
    assert m2m._catalog.route(None, "en").src_code == "en"
    await m2m.translate(["Hallo"], source="de", target="en")
    assert tokenizer.src_lang == "de"


@pytest.mark.parametrize("family", ["nllb", "m2m100"])
async def test_a_different_target_gives_a_different_forced_bos(
    models: dict[str, Path], family: str
) -> None:
    backend = await started(models[family])
    de, ja = backend._catalog.route("en", "de"), backend._catalog.route("en", "ja")
    assert de.forced_bos is not None and ja.forced_bos is not None
    assert de.forced_bos != ja.forced_bos
    # The forced token is the decoder's first input, so the garbage that follows differs too.
    out_de = await backend.translate(TEXTS, source="en", target="de")
    out_ja = await backend.translate(TEXTS, source="en", target="ja")
    assert out_de != out_ja
    # ...while the language token itself never shows in the text.
    for text in out_de + out_ja:
        assert "__de__" not in text and "deu_Latn" not in text and "jpn_Jpan" not in text
    await backend.aclose()


async def test_marian_pairs_choose_the_checkpoint(models: dict[str, Path]) -> None:
    backend = await started(
        models["marian"], local_marian_models=[f"en-ja={models['marian-en-ja']}"]
    )
    try:
        assert backend._catalog.route("en", "de").slot.model_id == str(models["marian"])
        assert backend._catalog.route("en", "ja").slot.model_id == str(models["marian-en-ja"])
        assert backend._catalog.route(None, "ja").slot.model_id == str(models["marian-en-ja"])
        assert backend.languages() == ["de", "ja"]
        assert backend.supports("en", "de-AT") and backend.supports(None, "ja")
        assert not backend.supports("en", "fr")
        assert not backend.supports("fr", "de")  # Marian is one pair per checkpoint
        assert backend.info()["marian_pairs"] == [
            f"en-de={models['marian']}",
            f"en-ja={models['marian-en-ja']}",
        ]
        assert all(await backend.translate(TEXTS[:2], source="en", target="ja"))
        with pytest.raises(UnsupportedLanguage, match="en-de, en-ja"):
            await backend.translate(["Bonjour"], source="fr", target="de")
    finally:
        await backend.aclose()


async def test_marian_pair_from_the_setting_or_the_name(
    models: dict[str, Path], tmp_path: Path
) -> None:
    # A checkpoint without source_lang/target_lang in its tokenizer config...
    bare = tmp_path / "opus-mt-en-fr"
    shutil.copytree(models["marian"], bare)
    config_path = bare / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config.pop("source_lang", None)
    tok_config.pop("target_lang", None)
    config_path.write_text(json.dumps(tok_config))
    # ...takes its pair from its opus-mt name,
    backend = await started(bare)
    assert backend.languages() == ["fr"]
    await backend.aclose()
    # ...or from an explicit prefix, which wins over what the tokenizer says.
    backend = await started(f"en-it={models['marian']}")
    assert backend.languages() == ["it"]
    assert backend.model_id == str(models["marian"])
    await backend.aclose()
    # Without either, the reason says how to name the pair.
    nameless = tmp_path / "nameless"
    shutil.copytree(bare, nameless)
    backend = make_backend(nameless)
    assert not await backend.wait_ready(timeout_s=60)
    assert backend.reason is not None and f"'en-de={nameless}'" in backend.reason
    await backend.aclose()


def test_marian_models_setting_is_checked_at_build() -> None:
    with pytest.raises(BackendConfigError, match="src-tgt=ID_OR_DIR"):
        make_backend("x", local_marian_models=["Helsinki-NLP/opus-mt-en-de"])


async def test_marian_models_setting_rejects_other_families(models: dict[str, Path]) -> None:
    backend = make_backend(models["marian"], local_marian_models=[f"en-de={models['nllb']}"])
    assert not await backend.wait_ready(timeout_s=60)
    assert backend.reason is not None and "not a Marian one" in backend.reason
    await backend.aclose()


# -- languages and supports ------------------------------------------------------------------


async def test_languages_and_supports(nllb: LocalTranslator, m2m: LocalTranslator) -> None:
    assert nllb.languages() == sorted(NLLB_CODES)
    m2m_langs = m2m.languages()
    assert m2m_langs is not None
    assert "te" not in m2m_langs  # M2M-100 has no Telugu
    assert set(m2m_langs) == set(M2M_CODES)  # every code of the tokenizer
    assert nllb.supports(None, "te") and not m2m.supports(None, "te")
    assert nllb.supports("en", "zh-Hant-TW") and nllb.supports(None, "pt-BR")
    assert not nllb.supports("en", "tlh")  # valid BCP 47, not in the table
    assert not nllb.supports("en", "not a tag")
    with pytest.raises(UnsupportedLanguage, match="cannot translate en -> te"):
        await m2m.translate(["hello"], source="en", target="te")
    assert nllb.info()["languages"] == len(NLLB_CODES)


@pytest.mark.engines("transformers")
async def test_every_language_of_the_nllb_checkpoint_is_listed_and_served(
    models: dict[str, Path],
) -> None:
    """NLLB-200's tokenizer has 202 FLORES-200 language tokens: each maps to a BCP 47 tag,
    GET /v1/languages lists every one, and a target such as yo or am is translated (the test
    checkpoint's output check is off: its text is noise), into its own token."""
    tokenizer = AutoTokenizer.from_pretrained(models["nllb"])
    flores = {token for token in tokenizer.get_vocab()
              if re.fullmatch(r"[a-z]{3}_[A-Z][a-z]{3}", token)}
    assert len(flores) == 202
    tags = {code: tag for tag, code in NLLB_CODES.items()}
    assert flores <= set(tags), sorted(flores - set(tags))
    backend = make_backend(models["nllb"])
    async with app_with(backends={"local": backend, "passthrough": PassthroughTranslator()},
                        backend="local") as app:
        assert await backend.wait_ready(timeout_s=60), backend.reason
        body = (await app.client.get("/v1/languages")).json()
        local = body["backends"]["local"]
        assert sorted(local["targets"]) == sorted(tags[code] for code in flores)
        assert local["models"][str(models["nllb"])] == local["targets"]
        assert {"yo", "am", "ks", "ks-Deva", "fa-AF", "zh-Hant"} <= set(body["targets"])
        route = backend._catalog.route
        for target, code in (("yo", "yor_Latn"), ("am", "amh_Ethi"), ("ks", "kas_Arab"),
                             ("ks-Deva", "kas_Deva"), ("fa", "pes_Arab"), ("fa-AF", "prs_Arab"),
                             ("zh-TW", "zho_Hant"), ("sr-Cyrl", "srp_Cyrl"), ("ar", "arb_Arab")):
            assert route("en", target).forced_bos == tokenizer.convert_tokens_to_ids(code)
        # A source in a script the model lacks goes in as its language.
        assert route("sr-Latn", "de").src_code == "srp_Cyrl"
        assert route("arb", "de").src_code == "arb_Arab"
        for target in ("yo", "am", "ks-Deva", "fa-AF"):
            r = await app.client.post("/v1/translate", json={
                "texts": ["The user said hello. Let me check the file first."],
                "target": target})
            assert r.status_code == 200, r.text
            segments = r.json()["results"][0]["segments"]
            assert {(seg["status"], seg["backend"]) for seg in segments} == {
                ("translated", "local")}, (target, segments)
        # A script the model does not have for a language is not served in another one.
        assert not backend.supports("en", "sr-Latn")


# -- batching --------------------------------------------------------------------------------


async def test_one_generate_per_batch_and_pairs_do_not_mix(nllb: LocalTranslator) -> None:
    solo_de = await nllb.translate(TEXTS, source="en", target="de")
    solo_ja = await nllb.translate(TEXTS, source="en", target="ja")
    calls = nllb.stats.generate_calls
    await nllb.translate(TEXTS, source="en", target="de")
    assert nllb.stats.generate_calls == calls + 1
    assert nllb.stats.last_generate_sizes == [len(TEXTS)]
    # Two pairs at once: the worker runs them one after the other, each with its own codes.
    both = await asyncio.gather(
        nllb.translate(TEXTS, source="en", target="de"),
        nllb.translate(TEXTS, source="en", target="ja"),
    )
    assert both == [solo_de, solo_ja]


async def test_sorted_by_length_then_put_back_in_order(nllb: LocalTranslator) -> None:
    texts = [TEXTS[2], TEXTS[3], TEXTS[0], TEXTS[1]]  # neither sorted nor reverse sorted
    batch = await nllb.translate(texts, source="en", target="de")
    solo = [(await nllb.translate([text], source="en", target="de"))[0] for text in texts]
    assert len(set(solo)) == len(texts)  # the outputs tell the inputs apart
    assert batch == solo


async def test_whitespace_kept_and_blank_texts_skip_the_model(nllb: LocalTranslator) -> None:
    calls = nllb.stats.generate_calls
    assert await nllb.translate(["", "  ", "\n"], source="en", target="de") == ["", "  ", "\n"]
    assert nllb.stats.generate_calls == calls
    (plain,) = await nllb.translate(["Hmm, the user said hello."], source="en", target="de")
    (padded,) = await nllb.translate(["  Hmm, the user said hello.\n"], source="en", target="de")
    assert padded == "  " + plain + "\n"


# -- long segments ---------------------------------------------------------------------------


async def test_long_segments_split_and_rejoined(models: dict[str, Path]) -> None:
    backend = await started(models["nllb"], local_max_input_tokens=12)
    try:
        tokenizer = backend._catalog.slots[0].tokenizer
        long_text = " ".join(TEXTS[:4])

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        pieces = split_text(long_text, count, 12)
        assert len(pieces) >= 3 and all(count(piece) <= 12 for piece in pieces)
        before = backend.stats.split_segments
        (whole,) = await backend.translate([long_text], source="en", target="de")
        assert backend.stats.split_segments == before + 1
        parts = await backend.translate([p.strip() for p in pieces], source="en", target="de")
        assert whole == " ".join(parts)
        # Into Japanese the parts are rejoined without spaces.
        (whole_ja,) = await backend.translate([long_text], source="en", target="ja")
        parts_ja = await backend.translate([p.strip() for p in pieces], source="en", target="ja")
        assert whole_ja == "".join(parts_ja)
    finally:
        await backend.aclose()


# -- start-up, readiness, failures ---------------------------------------------------------------


async def test_start_returns_at_once_and_ready_flips_after_loading(
    models: dict[str, Path],
) -> None:
    backend = make_backend(models["nllb"])
    assert not backend.ready
    # Hold the worker so that "loading" is observable, not a race.
    gate = threading.Event()
    backend._executor.submit(gate.wait, 30)
    await backend.start()
    assert backend.ready is False  # it returned with the worker still held
    assert backend.reason == f"loading model {str(models['nllb'])!r}"
    assert backend.languages() is None and backend.supports("en", "de")
    with pytest.raises(BackendUnavailable, match="loading model"):
        await backend.translate(["hello"], source="en", target="de")
    gate.set()
    assert await backend.wait_ready(timeout_s=60)
    assert backend.ready and backend.reason is None
    assert await backend.translate(["hello"], source="en", target="de")
    await backend.aclose()
    assert not backend.ready
    with pytest.raises(BackendUnavailable, match="closed"):
        await backend.translate(["hello"], source="en", target="de")


async def _assert_unavailable(backend: LocalTranslator, *needles: str) -> str:
    await backend.start()
    assert await backend.wait_ready(timeout_s=30) is False
    reason = backend.reason
    assert reason is not None
    for needle in needles:
        assert needle in reason
    with pytest.raises(BackendUnavailable) as caught:
        await backend.translate(["hello"], source="en", target="de")
    assert caught.value.detail == reason
    await asyncio.sleep(0)  # the loop is alive and well
    await backend.aclose()
    return reason


async def test_missing_directory_leaves_the_service_running(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    reason = await _assert_unavailable(
        make_backend(missing), "THINKTRANS_LOCAL_MODEL", "HF_HUB_OFFLINE", "does not exist"
    )
    assert str(missing) in reason


async def test_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    await _assert_unavailable(
        make_backend(tmp_path), "THINKTRANS_LOCAL_MODEL", "not a loadable checkpoint"
    )


async def test_unknown_hub_id_offline_fails_fast_with_one_clear_reason() -> None:
    reason = await _assert_unavailable(
        make_backend("nobody-here/no-such-model"),
        "THINKTRANS_LOCAL_MODEL",
        "HF_HUB_OFFLINE",
        "HF_HOME",
        "'nobody-here/no-such-model' not found locally",
    )
    # Offline (the autouse fixture): the hub client has no network to retry against.
    assert "\n" not in reason


async def test_an_uncached_hub_id_offline_fails_before_the_engine_is_prepared() -> None:
    """That it cannot load is known from the cache alone: the reason comes before the engine
    imports torch or ctranslate2 (seconds a one-shot command spent before failing)."""
    backend = make_backend("nobody-here/no-such-model")
    await backend.start()
    assert await backend.wait_ready(timeout_s=30) is False
    assert "'nobody-here/no-such-model' not found locally" in (backend.reason or "")
    assert backend.info()["device"] is None  # the engine's prepare() never ran
    await backend.aclose()


async def test_a_non_translation_checkpoint_is_refused(tmp_path: Path) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    # A tokenizer from a real family, a model from another: the config decides.
    shutil.copytree(make_test_model("m2m100", tmp_path / "m2m"), tmp_path / "t5")
    T5ForConditionalGeneration(
        T5Config(vocab_size=64, d_model=8, d_ff=8, num_layers=1, num_heads=1, d_kv=8)
    ).save_pretrained(tmp_path / "t5")
    await _assert_unavailable(make_backend(tmp_path / "t5"), "'t5' checkpoint", "NLLB-200")


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="needs a machine without CUDA"
)
async def test_cuda_device_without_cuda(models: dict[str, Path]) -> None:
    await _assert_unavailable(
        make_backend(models["nllb"], local_device="cuda:0"), "THINKTRANS_LOCAL_DEVICE"
    )


@pytest.mark.engines("transformers")
def test_missing_packages_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = engines.find_spec
    monkeypatch.setattr(
        engines, "find_spec", lambda name: None if name == "torch" else real(name)
    )
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'thinktrans\[local\]'") as err:
        LocalTranslator(local_config(local_model="x", local_engine="transformers"))
    assert err.value.name == "torch"
    # The registry turns it into a configuration error that names the extra.
    needs = r"needs 'torch': pip install 'thinktrans\[local\]'"
    with pytest.raises(BackendConfigError, match=needs):
        make_backend("x")


# -- the worker thread -------------------------------------------------------------------------


class HeldBatches:
    """``translate_kept`` as the worker runs it, held at its start until ``finish`` is set:
    which thread ran it, and when one is running."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from models.local import local_translator

        self.running, self.finish = threading.Event(), threading.Event()
        self.threads: list[int] = []
        original = local_translator.translate_kept

        def held(*args: Any, **kwargs: Any) -> Any:
            self.threads.append(threading.get_ident())
            self.running.set()
            self.finish.wait(600)
            return original(*args, **kwargs)

        monkeypatch.setattr(local_translator, "translate_kept", held)

    async def started(self) -> None:
        assert await asyncio.to_thread(self.running.wait, 120), "no batch started"


async def test_inference_runs_off_the_event_loop(models: dict[str, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    backend = await started(models["nllb"], local_num_beams=4)
    held = HeldBatches(monkeypatch)
    try:
        batch = asyncio.create_task(
            backend.translate([" ".join(TEXTS)] * 16, source="en", target="de"))
        await held.started()
        # The batch runs in the worker thread; the loop goes on meanwhile.
        assert threading.get_ident() not in held.threads
        for _ in range(10):
            await asyncio.sleep(0)
        assert not batch.done()
        held.finish.set()
        assert all(await batch)
    finally:
        held.finish.set()
        await backend.aclose()


async def test_work_runs_on_the_backends_own_thread(nllb: LocalTranslator) -> None:
    seen: list[str] = []
    engine = nllb._engine
    original = engine.generate

    def spy(*args: Any) -> list[list[int]]:
        seen.append(threading.current_thread().name)
        return original(*args)

    engine.generate = spy  # type: ignore[method-assign]
    try:
        await nllb.translate(["hello"], source="en", target="de")
    finally:
        del engine.generate
    assert seen == ["thinktrans-local_0"]


async def test_generation_is_bounded_and_guarded_against_loops(nllb: LocalTranslator) -> None:
    calls: list[tuple[list[list[int]], int, list[list[int]]]] = []
    engine = nllb._engine
    real_generate = engine.generate

    def recording_generate(loaded: Any, tokenizer: Any, rows: list[list[int]],
                           forced: int | None, max_new: int) -> list[list[int]]:
        out = real_generate(loaded, tokenizer, rows, forced, max_new)
        calls.append((rows, max_new, out))
        return out

    engine.generate = recording_generate  # type: ignore[method-assign]
    before = nllb.stats.output_tokens
    try:
        await nllb.translate(TEXTS, source="en", target="de")
    finally:
        del engine.generate
    ((rows, max_new, out),) = calls
    assert max_new == math.ceil(1.5 * max(len(row) for row in rows)) + 10
    n = nllb.config.no_repeat_ngram_size
    assert 2 <= n <= 8 and nllb.config.num_beams == 1
    assert any(len(row) == max_new for row in out), "no row ran to the bound: a weak test"
    for row in out:
        assert len(row) <= max_new
        grams = [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
        assert len(grams) == len(set(grams)), "a repeated n-gram got through"
    # Each segment is cut at its own bound, not the batch's: short inputs give short outputs.
    per_segment = [math.ceil(1.5 * len(row)) + 10 for row in rows]
    assert nllb.stats.output_tokens - before <= sum(per_segment)


@pytest.mark.engines("transformers")
async def test_transformers_generate_gets_the_guards(nllb: LocalTranslator) -> None:
    model = nllb._catalog.slots[0].model
    seen: list[dict[str, Any]] = []
    real_generate = model.generate

    def recording_generate(**kwargs: Any) -> Any:
        seen.append(kwargs)
        return real_generate(**kwargs)

    model.generate = recording_generate
    try:
        await nllb.translate(TEXTS, source="en", target="de")
    finally:
        del model.generate
    ((kwargs,),) = [seen]
    assert kwargs["num_beams"] == 1 and kwargs["do_sample"] is False
    assert kwargs["no_repeat_ngram_size"] == nllb.config.no_repeat_ngram_size


async def test_close_fails_queued_batches_cleanly(models: dict[str, Path]) -> None:
    backend = await started(models["nllb"])
    gate = threading.Event()
    backend._executor.submit(gate.wait, 30)  # the worker is busy
    queued = asyncio.create_task(backend.translate(["hello"], source="en", target="de"))
    await asyncio.sleep(0.05)
    await backend.aclose()
    gate.set()
    with pytest.raises(BackendUnavailable, match="closed"):
        await queued


async def test_multi_target_marian_prefixes_the_target_token(
    models: dict[str, Path], tmp_path: Path
) -> None:
    # opus-mt-en-ROMANCE style: target tokens in the vocabulary; two rare pieces are renamed.
    multi = tmp_path / "opus-mt-en-mul"
    shutil.copytree(models["marian"], multi)
    vocab = json.loads((multi / "vocab.json").read_text(encoding="utf-8"))
    rare = [piece for piece, i in vocab.items() if i in (len(vocab) - 3, len(vocab) - 2)]
    for piece, code in zip(rare, (">>fra<<", ">>jpn<<"), strict=True):
        vocab[code] = vocab.pop(piece)
    (multi / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config_path = multi / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config.pop("target_lang", None)
    config_path.write_text(json.dumps(tok_config))

    backend = await started(multi)
    try:
        assert backend.languages() == ["fr", "ja"]
        route = backend._catalog.route("en", "ja")
        assert route.prefix == ">>jpn<<"
        tokenizer = route.slot.tokenizer
        ids = tokenizer(route.prefix + "hello")["input_ids"]
        assert ids[0] == vocab[">>jpn<<"]
        out_fr = await backend.translate(TEXTS, source="en", target="fr")
        out_ja = await backend.translate(TEXTS, source="en", target="ja")
        assert all(out_fr) and out_fr != out_ja  # the token reaches the encoder
    finally:
        await backend.aclose()


async def test_the_service_on_a_test_checkpoint(models: dict[str, Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user would: readyz turns 200, 48 concurrent requests are all translated by
    local, and /healthz answers while a batch runs."""
    from tests.conftest import make_settings, start_app

    settings = make_settings(backend="local", local_model=str(models["nllb"]), max_wait_ms=20,
                             local_num_beams=4, deadline_ms=120_000)
    async for app in start_app(settings):
        assert await app.runtime.backends["local"].wait_ready(120)
        assert (await app.client.get("/readyz")).status_code == 200
        long_text = " ".join(TEXTS)

        async def one(client: Any, text: str) -> dict[str, Any]:
            r = await client.post("/v1/translate", json={"target": "zh-CN", "texts": [text]})
            return dict(r.json()["results"][0]["segments"][0])

        held = HeldBatches(monkeypatch)
        work = asyncio.gather(*(one(app.client, f"{long_text} Number {i}.") for i in range(48)))
        try:
            await held.started()  # a batch is running now
            health = await app.client.get("/healthz")
            assert not work.done(), "/healthz was answered while the batch ran"
        finally:
            held.finish.set()
        segments = await work
        assert health.status_code == 200
        assert all(s["status"] == "translated" and s["backend"] == "local" for s in segments)
        assert all(s["text"].strip() and s["text"] != s["original"] for s in segments)
        sizes = app.app.state.metrics.registry.get_sample_value(
            "thinktrans_batch_size_count", {"backend": "local"})
        assert sizes is not None and sizes < 48  # batched, not one by one
