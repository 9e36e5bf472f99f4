from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest

from service.detect import LangdetectDetector, ScriptDetector, get_detector
from service.errors import ConfigError
from service.locale import base_language

EVAL = Path(__file__).parent / "data" / "detect_eval.tsv"


def accuracy(detector: object) -> dict[str, float]:
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    with EVAL.open(encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            det = detector.detect(row["text"])  # type: ignore[attr-defined]
            ok = det.lang is not None and base_language(det.lang) == row["lang"]
            hits[row["kind"]][0] += ok
            hits[row["kind"]][1] += 1
    return {kind: right / total for kind, (right, total) in hits.items()}


def test_accuracy_bar_on_the_evaluation_set() -> None:
    acc = accuracy(ScriptDetector())
    assert acc["sentence"] >= 0.97
    assert acc["phrase"] >= 0.85


def test_default_beats_plain_langdetect_on_phrases() -> None:
    assert accuracy(ScriptDetector())["phrase"] > accuracy(LangdetectDetector())["phrase"] + 0.1


@pytest.mark.parametrize(
    ("text", "lang"),
    [("首先，确定整个 hiking旅程所用的总时间", "zh-Hans"),
     ("這個問題很難，我們再檢查一次。", "zh-Hant"),
     ("まず確認します", "ja"), ("다시 확인해 보자", "ko"), ("проверим снова", "ru"),
     ("Let me check whether the function handles empty input.", "en"),
     ("Wir müssen das Ergebnis noch einmal prüfen.", "de"),
     ("Vérifions encore une fois la réponse.", "fr"),
     ("Revisemos el resultado otra vez.", "es"),
     ("ตรวจสอบอีกครั้ง", "th"), ("Ας ελέγξουμε ξανά", "el")],
)
def test_samples(text: str, lang: str) -> None:
    assert ScriptDetector().detect(text).lang == lang


def test_mixed_line_goes_to_the_heavier_script() -> None:
    assert ScriptDetector().detect("I think 这个 is the correct approach here").lang == "en"
    assert ScriptDetector().detect("所以 total 是 59 分钟").lang == "zh-Hans"


def test_nothing_to_detect() -> None:
    for text in ["", "42 + 17 = 59", "```\nx = 1\n```", "https://example.com", "!!!"]:
        det = ScriptDetector().detect(text)
        assert det.lang is None and not det.reliable


def test_short_text_is_unreliable_but_long_text_is_reliable() -> None:
    d = ScriptDetector()
    assert not d.detect("OK.").reliable
    assert d.detect("Hmm, the user said hello and wants the total time.").reliable
    assert 0.0 <= d.detect("OK.").confidence <= 1.0


def test_deterministic() -> None:
    texts = ["la casa", "the answer", "das Ergebnis", "o sea", "bien visto"]
    first = [ScriptDetector().detect(t) for t in texts]
    assert all([ScriptDetector().detect(t) for t in texts] == first for _ in range(3))


def test_registry() -> None:
    assert isinstance(get_detector("default"), ScriptDetector)
    assert isinstance(get_detector("langdetect"), LangdetectDetector)
    with pytest.raises(ConfigError, match="unknown detector 'nope'"):
        get_detector("nope")
