"""Protected spans on the local backend: masked with each family's placeholders and restored,
or kept by translating the prose runs between them when a placeholder is lost.

On the random-weight test checkpoints of all three families (``service.tools.testmodel``), on
both engines, every placeholder is mangled, which is the hardest case: every output must still
hold every span's ``out``. Where a placeholder does come back (spaced, full-width, moved), the
restore is checked without an engine, and the batch path on the fake engine of
tests/test_local_slot.py, which echoes its input.
"""

from __future__ import annotations

import dataclasses
import json
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the local extra: pip install 'thinktrans[local]'")
pytest.importorskip("transformers", reason="needs the local extra: pip install 'thinktrans[local]'")

from models.base import Job
from models.errors import BackendConfigError
from models.local import LocalTranslator, split_text
from models.local.engines import Loaded
from models.local.masking import FALLBACK, FORMS, MASKED, SpanBatch
from models.local.pieces import cut_texts
from models.local.slot import Route, Slot, Stats, translate_kept
from models.spans import INTEGER, KINDS, Glossary, Protected, SpanFinder, needs_words
from tests.conftest import app_with
from tests.test_local import make_backend
from tests.test_local_slot import EOS, FILLER, EchoEngine, WordTokenizer, route

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

ENGINES = ["transformers"] + (["ctranslate2"] if find_spec("ctranslate2") else [])
FAMILIES = ("nllb", "m2m100", "marian")
GLOSSARY = Glossary.of({"sidecar": "Beiwagen", "batcher": "Stapler"}, ["thinktrans"])
# Reasoning sentences with inline spans, by language; each has at least two spans.
SENTENCES: list[tuple[str, str]] = [
    ("en", "First I run `pip install -e .` and then open config.yaml to check the version "
           "2.13.0."),
    ("en", "The sidecar sends each batch to https://pool.example.com/v1/batch within 250 ms."),
    ("en", "So the loop is O(n log n), and a[i] == b[j] holds when parse_args() returns early."),
    ("en", "Let me rewrite $x^2 + 1$ as \\frac{a}{b} and pass --dry-run to thinktrans."),
    ("en", "As [1] says, the format string {0} in logger.py is filled in by fmt_line()."),
    ("zh", "我需要检查 src/app.py 里的 parse_args() 函数，然后运行 `pytest -q`。"),
    ("zh", "用户说 thinktrans 的 batcher 在 v1.2.3 之后变慢了，大约 120 ms。"),
    ("ja", "まず `npm install` を実行して、~/.config/app.toml を確認します。"),
    ("ja", "このエラー \"ModuleNotFoundError: No module named 'yaml'\" は README.md に書いて"
           "あります。"),
    ("de", "Ich prüfe zuerst die Datei requirements.txt und rufe dann `make test` auf."),
    ("de", "Der sidecar schreibt nach /var/log/thinktrans.log und nutzt max_batch_size=32."),
    ("ru", "Сначала я открою main.py и проверю функцию load_config() в строке 42."),
    ("ru", "Ответ приходит на user@example.com, а версия Python 3.11.7 уже установлена."),
]
FINDER = SpanFinder()


def protect(text: str) -> Protected:
    found = FINDER.find(text, GLOSSARY)
    assert found is not None and len(found.spans) >= 2, text
    return found


@pytest.fixture(autouse=True)
def _offline(hub_offline: None) -> None:
    """No test reaches the hub (conftest keeps conversions in a cache of the session)."""


async def started(model: Path, engine: str, **config: Any) -> LocalTranslator:
    """The backend as the service builds it (settings, registry), ``config`` replaced."""
    built = make_backend(model, local_engine=engine)
    backend = LocalTranslator(dataclasses.replace(built.config, **config)) if config else built
    if config:
        await built.aclose()
    await backend.start()
    assert await backend.wait_ready(timeout_s=120), backend.reason
    return backend


# -- the test checkpoints: every span kept, whatever the engine makes of the placeholders ----


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("family", FAMILIES)
async def test_every_span_is_kept_on_every_family_and_engine(
    models: dict[str, Path], family: str, engine: str,
) -> None:
    backend = await started(models[family], engine)
    try:
        # Marian's checkpoint serves en -> de alone: every text goes as English to it.
        groups: dict[str, list[str]] = {}
        for lang, text in SENTENCES:
            groups.setdefault("en" if family == "marian" else lang, []).append(text)
        for source, texts in groups.items():
            protected = [protect(text) for text in texts]
            plain = "Nothing to protect in this one."
            out = await backend.run(Job([*texts, plain], source, "de",
                                        protected=[*protected, None]))
            for text, spans, translated in zip(texts, protected, out, strict=False):
                assert spans.missing(translated) == [], (text, translated)
                assert translated != text
            # Glossary terms come out as their targets (the spans' out), kept ones as they are.
            assert all("sidecar" not in o for o in out[:-1])
            assert out[-1] and out[-1] != plain
        counts = backend.info()["spans"]
        assert isinstance(counts, dict) and sum(counts.values()) == len(SENTENCES), counts
        assert counts["fallback"] > 0, counts  # random weights: placeholders mangled
    finally:
        await backend.aclose()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_long_text_is_split_and_keeps_its_spans(models: dict[str, Path],
                                                       engine: str) -> None:
    sentence = ("Then I open src/module_{i}.py and call run_step_{i}() with --level={i} "
                "before the next check. ")
    text = "".join(sentence.format(i=i) for i in range(12)).strip()
    spans = FINDER.find(text)
    assert spans is not None and len(spans.spans) == 36
    backend = await started(models["nllb"], engine, max_input_tokens=24)
    try:
        [out] = await backend.run(Job([text], "en", "de", protected=[spans]))
        assert spans.missing(out) == []
        assert backend.stats.split_segments >= 1  # the masked text went as several parts
    finally:
        await backend.aclose()


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_runs_strategy_sends_every_text_as_its_runs(models: dict[str, Path],
                                                             engine: str) -> None:
    backend = await started(models["m2m100"], engine, span_strategy="runs")
    try:
        texts = [text for lang, text in SENTENCES if lang == "en"]
        protected = [protect(text) for text in texts]
        out, kept = await backend.run_kept(Job(texts, "en", "de", protected=protected))
        assert kept == [FALLBACK] * len(texts)
        assert all(p.missing(o) == [] for p, o in zip(protected, out, strict=True))
        assert backend.stats.last_generate_sizes and len(backend.stats.last_generate_sizes) == 1
        assert backend.cache_identity(None, "en", "de").endswith("|spans=runs")  # type: ignore[union-attr]
    finally:
        await backend.aclose()
    with pytest.raises(BackendConfigError, match="local_span_strategy"):
        LocalTranslator(dataclasses.replace(backend.config, span_strategy="hope"))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("family", ["nllb", "marian"])
async def test_a_segment_of_90_spans_fits_a_model_of_256_positions(
    models: dict[str, Path], family: str, engine: str,
) -> None:
    # The test checkpoints have 256 positions, as many as the setting's tokens a part: a
    # masked part that long, with the model's special tokens, ran past the positions and
    # failed its whole batch, its neighbour too (CTranslate2: "no position encodings").
    config = json.loads((models[family] / "config.json").read_text(encoding="utf-8"))
    assert config["max_position_embeddings"] == 256
    text = " ".join(f"then call step_{i}() now" for i in range(90))
    spans = FINDER.find(text)
    assert spans is not None and len(spans.spans) == 90
    neighbour = "The next sentence is a short one."
    backend = await started(models[family], engine, max_input_tokens=256)
    try:
        out = await backend.run(Job([text, neighbour], "en", "de", protected=[spans, None]))
        assert spans.missing(out[0]) == [] and out[1].strip()
        assert backend.stats.split_segments >= 1
    finally:
        await backend.aclose()


# -- restoring placeholders that survive: no engine ----------------------------------------


def _as_engine_writes(masked: str, family: str) -> str:
    """What a good engine might make of a masked text: placeholders spaced, full-width, and
    the words around them changed and moved."""
    if family == "marian":
        spaced = re.sub(r"\{(\d+)\}", lambda m: f"{{ {m[1]} }}", masked)
        spaced = spaced.replace("{ 1 }", "｛1｝")
    else:
        spaced = re.sub(r"\[(\d+)\]", lambda m: f"[ {m[1]}]", masked)
        spaced = spaced.replace("[ 2]", "［２］")
    first, _, rest = spaced.partition(" ")
    return f"Zuerst {rest.upper()} ({first})"


@pytest.mark.parametrize("family", FAMILIES)
def test_placeholders_that_come_back_are_restored_whatever_their_spacing(family: str) -> None:
    form = FORMS[family]
    text = SENTENCES[0][1]
    spans = protect(text)
    masked = form.mask(spans)
    assert all(span.out not in masked for span in spans.spans)
    first = "[1]" if family != "marian" else "{0}"
    assert first in masked
    batch = SpanBatch([text], [spans], form)
    assert batch.first == [masked]
    # The placeholders' stretches, for the splitter: exactly where they are.
    assert [masked[a:b] for a, b in batch.first_keep[0]] == [
        form.render(i) for i in range(len(spans.spans))]
    written = _as_engine_writes(masked, family)
    assert batch.settle([written]) == []  # nothing more for the engine
    [restored] = batch.finish([])
    assert batch.outcomes == [MASKED]
    assert spans.missing(restored) == []
    assert restored.startswith("Zuerst ")
    assert form.unmask(written, spans) == restored


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lost_repeated_or_unknown_placeholder_falls_back_to_the_runs(family: str) -> None:
    form = FORMS[family]
    texts = [SENTENCES[1][1], SENTENCES[5][1], SENTENCES[10][1], "No spans here."]
    protected: list[Protected | None] = [protect(t) for t in texts[:3]] + [None]
    batch = SpanBatch(texts, protected, form)
    masked = batch.first
    one, two = form.render(0), form.render(1)
    lost = masked[0].replace(one, "")
    repeated = masked[1].replace(two, one)
    unknown = masked[2].replace(one, form.render(7))
    second = batch.settle([lost, repeated, unknown, "Keine Spans."])
    # Only the runs with words go to the engine, all in one more call.
    runs = [[part for part in p.runs() if isinstance(part, str) and needs_words(part)]
            for p in protected[:3] if p is not None]
    assert second == [run for own in runs for run in own]
    assert not any(re.search(form.pattern, run) for run in second)
    results = batch.finish([f"<{run}>" for run in second])
    assert batch.outcomes == [FALLBACK, FALLBACK, FALLBACK, None]
    assert results[3] == "Keine Spans."
    for spans, result in zip(protected[:3], results, strict=False):
        assert spans is not None and spans.missing(result) == []
    # The glossary's term is rendered as its target; a kept term as it is.
    assert results[0] == ("<The >Beiwagen< sends each batch to >"
                          "https://pool.example.com/v1/batch< within >250 ms.")


def test_prose_that_reads_like_a_placeholder_goes_as_runs_at_once() -> None:
    # The 1 of "[1]" is an integer, a span of its own; with integers left out (span_kinds)
    # the prose reads like a placeholder.
    text = "As [1] says, the format string {0} in logger.py is filled in by fmt_line()."
    spans = SpanFinder(kinds=[kind for kind in KINDS if kind != INTEGER]).find(text, GLOSSARY)
    assert spans is not None
    for family in FAMILIES:
        batch = SpanBatch([text], [spans], FORMS[family])
        assert batch.outcomes == [FALLBACK]  # decided before the engine
        assert all("logger.py" not in sent for sent in batch.first)
        assert batch.settle([f"<{t}>" for t in batch.first]) == []
        [result] = batch.finish([])
        assert spans.missing(result) == [] and "[1]" in result and "{0}" in result


# -- integers: spans of their own -----------------------------------------------------------


def test_a_bracketed_integer_is_masked_inside_its_brackets() -> None:
    text = "As [1] says, the format string {0} in logger.py is filled in by fmt_line()."
    spans = protect(text)
    assert [s.out for s in spans.spans if s.kind == INTEGER] == ["1", "0"]
    for family in FAMILIES:
        batch = SpanBatch([text], [spans], FORMS[family])
        assert batch.outcomes == [None]  # masked: decided once the engine answers
        assert batch.settle(list(batch.first)) == []  # echoed, every placeholder back
        assert batch.finish([]) == [text] and batch.outcomes == [MASKED]


NUMBERED = ["Then it returns 404 when the token is missing.", "So maxRetryCount is set to 3."]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_translated_segment_keeps_its_integers(models: dict[str, Path],
                                                      engine: str) -> None:
    # Random weights drop the digits of whatever they are sent: an integer is a span, kept
    # by its placeholder or, that lost, by translating the prose around it.
    async with app_with(backend="local", local_model=str(models["nllb"]), local_engine=engine,
                        default_locale="de", cache_mb=0, deadline_ms=120_000,
                        backend_timeout_s=120) as app:
        assert await app.runtime.wait_ready(60.0)
        resp = await app.client.post("/v1/translate", json={"texts": NUMBERED})
    assert resp.status_code == 200, resp.text
    for text, result in zip(NUMBERED, resp.json()["results"], strict=True):
        [seg] = result["segments"]
        [number] = re.findall(r"\d+", text)
        assert seg["status"] == "translated", seg
        assert re.search(rf"(?<!\d){number}(?!\d)", seg["text"]), seg


# -- the batch path on a fake engine that echoes its input ----------------------------------


class CharTokenizer(WordTokenizer):
    """One id per character: text without spaces is cut at character midpoints."""

    def _ids(self, text: str) -> list[int]:
        ids = []
        for ch in text:
            if ch not in self.words:
                self.words.append(ch)
            ids.append(self.words.index(ch))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.words[i] for i in ids)


class Mangler(EchoEngine):
    """Writes filler in place of every row: no placeholder survives."""

    def generate(self, loaded: Loaded, tokenizer: Any, rows: list[list[int]],
                 forced: int | None, max_new: int) -> list[list[int]]:
        self.calls.append((rows, forced, max_new))
        return [[FILLER, FILLER, EOS] for _ in rows]


def test_surviving_placeholders_cost_no_second_engine_call() -> None:
    tokenizer, engine, stats = WordTokenizer(), EchoEngine(), Stats()
    texts = [text for _, text in SENTENCES[:4]]
    protected = [protect(text) for text in texts]
    out, kept = translate_kept(engine, route(tokenizer), texts, 256, stats, protected)
    assert kept == [MASKED] * 4 and len(engine.calls) == 1
    # The echo gives the text back, word by word: every span restored in its place.
    assert all(p.missing(o) == [] for p, o in zip(protected, out, strict=True))
    assert out[0] == "First I run `pip install -e .` and then open config.yaml to check the " \
                     "version 2.13.0."
    assert (stats.spans_masked, stats.spans_fallback, stats.batches) == (4, 0, 1)


def test_lost_placeholders_cost_one_more_engine_call_for_the_whole_batch() -> None:
    tokenizer, engine, stats = WordTokenizer(), Mangler(), Stats()
    texts = [text for _, text in SENTENCES[:4]] + ["Plain text."]
    protected: list[Protected | None] = [protect(text) for text in texts[:4]] + [None]
    out, kept = translate_kept(engine, route(tokenizer), texts, 256, stats, protected)
    assert kept == [FALLBACK] * 4 + [None]
    assert len(engine.calls) == 2  # the masked texts, then every lost one's runs at once
    assert all(p is None or p.missing(o) == [] for p, o in zip(protected, out, strict=True))
    assert out[4] == "la la"
    assert (stats.spans_masked, stats.spans_fallback, stats.batches) == (0, 4, 1)


def test_a_split_never_cuts_a_placeholder_in_half() -> None:
    """Chinese without spaces, cut at character midpoints to 6 tokens a part: no part holds
    half a placeholder, so the echoed parts, rejoined with a space, restore every span."""
    text = "先检查app.py再看lib.rs然后改main.go最后跑run.sh和test.py还有x.cfg。"
    spans = FINDER.find(text)
    assert spans is not None and len(spans.spans) == 6
    tokenizer, engine, stats = CharTokenizer(), EchoEngine(), Stats()
    slot = Slot("fake", "nllb", tokenizer, Loaded(None, frozenset({EOS})), {"de": "deu_Latn"})
    spaced = Route(slot, "eng_Latn", 7, "", no_space=False)  # a space between parts
    [out], kept = translate_kept(engine, spaced, [text], 6, stats, [spans])
    assert stats.split_segments == 1 and kept == [MASKED]
    parts = [tokenizer.decode(row) for rows, _, _ in engine.calls for row in rows]
    assert len(parts) > 5
    assert all(part.count("[") == part.count("]") for part in parts), parts
    assert spans.missing(out) == []


def test_split_text_keeps_its_stretches_whole() -> None:
    text = "甲乙丙丁戊己庚辛壬癸子丑寅卯辰巳午未申酉"
    keep = [(3, 9), (12, 14)]
    pieces = split_text(text, len, 4, keep)
    assert "".join(pieces) == text and len(pieces) > 3
    cuts = {sum(map(len, pieces[:i])) for i in range(1, len(pieces))}
    assert not any(start < cut < end for cut in cuts for start, end in keep), pieces
    assert text[3:9] in pieces  # longer than the bound, it goes whole
    # cut_texts says where each part starts in its text (for the pool's spans).
    cut = cut_texts(["  " + text], len, 4, [[(5, 11), (14, 16)]])
    assert all(("  " + text)[p.start:p.start + len(p.text)] == p.text for p in cut.parts)
