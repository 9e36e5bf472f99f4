"""Preview jobs on the local backend: CTranslate2's prefix bias towards the previous preview.

On the session's test checkpoints (tests/test_local.py; random weights, so outputs are noise
but deterministic), served by a real ``ctranslate2.Translator`` and by transformers. A
sentence's previous preview is what its prefix translated to, as the service would have
shown it; its next preview, of the longer sentence, is decoded towards it.
"""

from __future__ import annotations

import dataclasses
import threading
from itertools import takewhile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ctranslate2", reason="needs the ct2 extra: pip install 'thinktrans[ct2]'")
pytest.importorskip("torch", reason="needs the local extra: pip install 'thinktrans[local]'")

from models.base import Job
from models.errors import BackendConfigError, Stopped
from models.local import LocalTranslator
from models.registry import build_backend
from models.spans import SpanFinder
from service.settings import load_settings
from tests.configs import local_config

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

SENTENCE = "Hmm, the user said hello and then asked about the weather in Paris today."
PREFIX = "Hmm, the user said hello"  # the sentence as it was at its previous preview
OTHER = "Then I should check the forecast."
SPANS = "Then open src/app.py and run parse_args() on it."


@pytest.fixture(autouse=True)
def _offline(hub_offline: None) -> None:
    """No test reaches the hub; conversions go to the session's cache (conftest)."""


async def started(model: Path, engine: str = "ctranslate2", **overrides: Any
                  ) -> LocalTranslator:
    settings = load_settings(backend="local", local_model=str(model), local_engine=engine,
                             **overrides)
    backend = build_backend("local", settings)
    assert isinstance(backend, LocalTranslator)
    await backend.start()
    assert await backend.wait_ready(timeout_s=120), backend.reason
    return backend


def common_prefix(a: str, b: str) -> int:
    same = takewhile(lambda pair: pair[0] == pair[1], zip(a, b, strict=False))
    return sum(1 for _ in same)


@pytest.mark.parametrize("family", ["nllb", "marian"])
async def test_a_high_bias_keeps_a_preview_to_the_previous_one(
        models: dict[str, Path], family: str) -> None:
    """NLLB's previous preview tokenized with its shared model, Marian's with its target
    one: either way the biased preview starts with what was shown, the unbiased one not."""
    backend = await started(models[family], local_preview_bias=0.9)
    try:
        plain, shown = await backend.run(Job([SENTENCE, PREFIX], "en", "de"))
        [biased] = await backend.run(Job([SENTENCE], "en", "de", preview=True,
                                         previous=[shown]))
        info = backend.info()
    finally:
        await backend.aclose()
    assert shown and biased != plain
    assert biased.startswith(shown), (biased, shown)
    assert not plain.startswith(shown)
    assert common_prefix(biased, shown) > common_prefix(plain, shown)
    assert info["preview_biased"] == 1


async def test_no_bias_is_plain_decoding_and_only_previews_are_biased(
        models: dict[str, Path]) -> None:
    """Beta 0 decodes a preview as any segment; with a bias, a job that is not a preview is
    never biased, whatever ``previous`` it carries; the cache identity is the bias's none."""
    off = await started(models["nllb"], local_preview_bias=0)
    on = await started(models["nllb"], local_preview_bias=0.9)
    try:
        plain, shown = await on.run(Job([SENTENCE, PREFIX], "en", "de"))
        assert await off.run(Job([SENTENCE], "en", "de", preview=True,
                                 previous=[shown])) == [plain]
        assert await on.run(Job([SENTENCE], "en", "de", previous=[shown])) == [plain]
        assert off.stats.biased_rows == on.stats.biased_rows == 0
        assert (off.cache_identity(None, "en", "de") == on.cache_identity(None, "en", "de")
                is not None)
    finally:
        await off.aclose()
        await on.aclose()


async def test_a_mixed_preview_batch_biases_only_whole_plain_texts_with_a_previous(
        models: dict[str, Path]) -> None:
    """One preview batch: a text with a previous (biased), one without, one with protected
    spans and a previous (unbiased: masked or sent as its runs); each unbiased text comes
    out as its segment would."""
    spans = SpanFinder().find(SPANS)
    assert spans is not None
    backend = await started(models["nllb"], local_preview_bias=0.9)
    try:
        plain = await backend.run(Job([SENTENCE, OTHER, SPANS], "en", "de",
                                      protected=[None, None, spans]))
        [shown, shown_spans] = await backend.run(Job([PREFIX, SPANS[:20]], "en", "de"))
        out = await backend.run(Job([SENTENCE, OTHER, SPANS], "en", "de", preview=True,
                                    previous=[shown, None, shown_spans],
                                    protected=[None, None, spans]))
        biased = backend.stats.biased_rows
    finally:
        await backend.aclose()
    assert out[0].startswith(shown) and not plain[0].startswith(shown)
    assert out[1:] == plain[1:]
    assert biased == 1


async def test_a_text_cut_into_parts_decodes_unbiased(
        models: dict[str, Path]) -> None:
    backend = await started(models["nllb"], local_preview_bias=0.9, local_max_input_tokens=24)
    try:
        [plain] = await backend.run(Job([SENTENCE], "en", "de"))
        [out] = await backend.run(Job([SENTENCE], "en", "de", preview=True,
                                      previous=[plain[:12]]))
        stats = backend.stats
    finally:
        await backend.aclose()
    assert stats.split_segments == 2 and stats.biased_rows == 0
    assert out == plain


async def test_on_transformers_a_preview_decodes_as_any_segment(
        models: dict[str, Path]) -> None:
    backend = await started(models["nllb"], engine="transformers", local_preview_bias=0.9)
    try:
        plain, shown = await backend.run(Job([SENTENCE, PREFIX], "en", "de"))
        preview = await backend.run(Job([SENTENCE], "en", "de", preview=True,
                                        previous=[shown]))
    finally:
        await backend.aclose()
    assert preview == [plain] and backend.stats.biased_rows == 0


def test_the_bias_must_be_a_beta_ctranslate2_takes() -> None:
    for beta in (1.0, -0.1):
        with pytest.raises(BackendConfigError, match="local_preview_bias"):
            # Past the setting's own bounds: the backend checks what it is given too.
            config = local_config(local_engine="ctranslate2")
            LocalTranslator(dataclasses.replace(config, preview_bias=beta))


class StopAfter(threading.Event):
    """A stop signal that reads as set from its ``steps``-th look on: the engine looks once
    before a decode and at each step of it (greedy CTranslate2's callback, transformers'
    stopping criterion), so a decode is told to stop a few steps in."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps, self.looks = steps, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.steps


@pytest.mark.parametrize("engine", ["ctranslate2", "transformers"])
async def test_a_preview_told_to_stop_ends_its_decode_a_step_later(
        models: dict[str, Path], engine: str) -> None:
    """A preview whose stop is set while it decodes (segments came to wait) ends within a
    step, raising Stopped; one never told decodes to its end, as without a signal."""
    backend = await started(models["nllb"], engine)
    try:
        [plain] = await backend.run(Job([SENTENCE], "en", "de", preview=True))
        told = StopAfter(steps=3)
        with pytest.raises(Stopped):
            await backend.run(Job([SENTENCE], "en", "de", preview=True, stop=told))
        never = StopAfter(steps=10**9)
        [untold] = await backend.run(Job([SENTENCE], "en", "de", preview=True, stop=never))
    finally:
        await backend.aclose()
    assert untold == plain
    assert told.looks <= 4, told.looks  # the look before, and the step it was set at
    # Looked at each step: more looks than steps the told decode ran.
    assert never.looks > told.looks + 5, never.looks
