"""The corpus of real sentences with inline spans (tests/data/spans_corpus.jsonl) through the
whole service, on every backend: each segment marked ``translated`` holds every protected
span of its original byte for byte, glossary terms come out as given and ``keep`` terms
unchanged, and the backends that keep spans by construction (local, DeepL) lose none.

The spans are found here again with the service's own finder, so a backend that wrote a
span differently (``配置.yaml``) cannot pass. The pool's run of the corpus is in
tests/test_pool.py, which starts Ray once for its module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from models.spans import Glossary, SpanFinder
from tests.conftest import app_with
from tests.fakes_deepl import MarkupDeepL
from tests.fakes_remote import FakeChat

CORPUS = [json.loads(line) for line in
          (Path(__file__).parent / "data" / "spans_corpus.jsonl").read_text("utf-8").splitlines()
          if line.strip()]
GLOSSARY = {"terms": {"model": "MODELL", "function": "FUNKTION", "模型": "MODELL",
                      "fichier": "DATEI"},
            "keep": ["Python", "Windows"]}
FINDER = SpanFinder()
ENGINES = ["transformers"] + (["ctranslate2"] if find_spec("ctranslate2") else [])


def texts(*, langs: set[str] | None = None, every: int = 1) -> list[str]:
    """The corpus's sentences (of ``langs``), every ``every``-th one; German ones are left
    out, as the target is German."""
    chosen = [row["text"] for row in CORPUS if row["lang"] != "de"
              and (langs is None or row["lang"] in langs)]
    return chosen[::every]


async def run_corpus(sentences: list[str], **settings: Any) -> list[dict[str, Any]]:
    """Every sentence one-shot through an app with ``settings`` and the glossary, into
    German; the segments that came back."""
    segments: list[dict[str, Any]] = []
    async with app_with(default_locale="de", cache_mb=0, deadline_ms=120_000,
                        backend_timeout_s=120, **settings) as app:
        assert await app.runtime.wait_ready(60.0)
        for at in range(0, len(sentences), 16):
            resp = await app.client.post("/v1/translate", json={
                "texts": sentences[at:at + 16], "glossary": GLOSSARY})
            assert resp.status_code == 200, resp.text
            for text, result in zip(sentences[at:at + 16], resp.json()["results"],
                                    strict=True):
                assert "".join(s["original"] for s in result["segments"]) == text
                segments += result["segments"]
    return segments


def check(segments: list[dict[str, Any]]) -> tuple[int, int]:
    """Every translated segment keeps every span of its original and renders every term;
    the segments with spans that were sent, and of them those translated."""
    glossary = Glossary.of(GLOSSARY["terms"], GLOSSARY["keep"])
    sent = translated = 0
    for seg in segments:
        protected = FINDER.find(seg["original"].strip(), glossary)
        if protected is None or seg["status"] not in ("translated", "error", "deadline"):
            continue
        sent += 1
        if seg["status"] == "translated":
            translated += 1
            assert not protected.missing(seg["text"]), seg
    return sent, translated


def test_the_corpus_has_spans_and_terms_in_every_language() -> None:
    glossary = Glossary.of(GLOSSARY["terms"], GLOSSARY["keep"])
    found = [FINDER.find(text, glossary) for text in texts()]
    kinds = {s.kind for p in found if p is not None for s in p.spans}
    assert {"code", "path", "url", "identifier", "version", "term", "keep"} <= kinds
    assert {row["lang"] for row in CORPUS} == {"zh", "ja", "ko", "de", "fr", "es", "ru", "en"}


# -- local: the test checkpoints of the three families, on both engines ------------------------


@pytest.fixture(autouse=True)
def _offline(hub_offline: None) -> Iterator[None]:
    yield


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("family", ["nllb", "m2m100", "marian"])
async def test_local_keeps_every_span_of_the_corpus(
        models: dict[str, Path], family: str, engine: str,
) -> None:
    """Random weights mangle every placeholder: the prose runs between the spans are what
    the model translates, so every segment comes out translated with its spans."""
    # A Marian checkpoint serves its one pair (English to German); the others every
    # language. Samples of the corpus: every other sentence on CTranslate2, every fifth on
    # the slower engine (each language is in both).
    sentences = texts(langs={"en"} if family == "marian" else None,
                      every=2 if engine == "ctranslate2" else 5)
    segments = await run_corpus(sentences, backend="local", local_engine=engine,
                                local_model=str(models[family]))
    sent, translated = check(segments)
    assert sent >= len(sentences) // 2
    assert translated == sent  # kept by construction: none lost, none failed


# -- DeepL: spans in ignored tags, terms through its glossaries ---------------------------------


@pytest.fixture
def markup(markup_deepl: MarkupDeepL) -> MarkupDeepL:
    return markup_deepl


@pytest.mark.parametrize("misbehave", [None, "drop"])
async def test_deepl_keeps_every_span_of_the_corpus(
        markup: MarkupDeepL, misbehave: str | None) -> None:
    """Upper-casing what it translates, DeepL's stand-in would turn any span it was sent
    as prose into another string; losing elements now and then, it sends the backend to
    its fallback."""
    markup.reset()
    if misbehave is not None:
        markup.markup_mode = misbehave
    segments = await run_corpus(texts(), backend="deepl", deepl_api_key="k",
                                deepl_server_url=markup.origin,
                                check_output_language=False)  # it upper-cases, no more
    sent, translated = check(segments)
    assert sent > 100 and translated == sent


# -- the LLM: a fake that keeps, drops and alters spans -----------------------------------------


@pytest.mark.parametrize("mode", ["good", "drop_some", "alter_span"])
async def test_the_llm_never_comes_out_translated_without_its_spans(
        chat_server: FakeChat, mode: str) -> None:
    chat_server.reset()
    chat_server.mode, chat_server.drop_rate = mode, 0.3
    segments = await run_corpus(texts(every=2), backend="llm",
                                llm_base_url=f"{chat_server.origin}/v1",
                                llm_model="fake-model", check_output_language=False)
    sent, translated = check(segments)
    assert sent > 50
    if mode == "good":
        assert translated == sent
    elif mode == "drop_some":
        assert 0 < translated < sent  # the retry rescues some; the rest are errors
    else:  # it alters every string it is told to keep (and renders the terms as given)
        glossary = Glossary.of(GLOSSARY["terms"], GLOSSARY["keep"])
        for seg in segments:
            protected = FINDER.find(seg["original"].strip(), glossary)
            if seg["status"] == "translated" and protected is not None:
                assert {span.kind for span in protected.spans} == {"term"}, seg
