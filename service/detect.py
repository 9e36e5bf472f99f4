"""Language detection for short, mixed reasoning text.

The ``default`` detector decides by script first: Han, Kana, Hangul, Thai and the other
scripts that name their language need no statistics, and a mixed line such as
``首先，确定整个 hiking旅程所用的总时间`` goes to the script with most weight. Only text
in a shared script (Latin, Cyrillic, Arabic, Devanagari) is scored against langdetect's
n-gram profiles, limited to that script's languages: every n-gram, not langdetect's
random sample, so the same text always gives the same answer; short phrases are helped
by function words and diacritics.

Detectors are registered by name (``THINKTRANS_DETECTOR``); each returns a Detection.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import ClassVar

import numpy as np

from service.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Detection:
    """What a detector says of one text: a BCP 47 tag (or None), a confidence, reliability."""

    lang: str | None
    confidence: float
    reliable: bool


UNKNOWN = Detection(None, 0.0, False)


# Detection reads at most this many characters from the start of a text: a segment is far
# shorter, and a whole document's language shows well before it; the cost stays bounded.
DETECT_MAX_CHARS = 4096


class Detector(ABC):
    """A language detector; ``detect`` must be deterministic and thread-safe."""

    name: ClassVar[str]

    @abstractmethod
    def detect(self, text: str) -> Detection: ...

    def warm_up(self) -> None:
        """Load what detection needs now, so the first request does not wait for it."""
        for text in ("Let me check the answer once more, please.", "Проверим ответ ещё раз.",
                     "مرحبا بك في هذا المكان", "चलो फिर से जाँच करते हैं"):
            self.detect(text)


# -- scripts ------------------------------------------------------------------------------

# (script, regex of its letters, the language it names or None when shared)
_SCRIPTS: tuple[tuple[str, str, str | None], ...] = (
    ("Hani", r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]", None),
    ("Kana", r"[\u3041-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9d]", "ja"),
    ("Hang", r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]", "ko"),
    ("Thai", r"[\u0e00-\u0e7f]", "th"),
    ("Grek", r"[\u0370-\u03ff\u1f00-\u1fff]", "el"),
    ("Hebr", r"[\u0590-\u05ff]", "he"),
    ("Geor", r"[\u10a0-\u10ff]", "ka"),
    ("Armn", r"[\u0530-\u058f]", "hy"),
    ("Beng", r"[\u0980-\u09ff]", "bn"),
    ("Guru", r"[\u0a00-\u0a7f]", "pa"),
    ("Gujr", r"[\u0a80-\u0aff]", "gu"),
    ("Taml", r"[\u0b80-\u0bff]", "ta"),
    ("Telu", r"[\u0c00-\u0c7f]", "te"),
    ("Knda", r"[\u0c80-\u0cff]", "kn"),
    ("Mlym", r"[\u0d00-\u0d7f]", "ml"),
    ("Khmr", r"[\u1780-\u17ff]", "km"),
    ("Laoo", r"[\u0e80-\u0eff]", "lo"),
    ("Mymr", r"[\u1000-\u109f]", "my"),
    ("Ethi", r"[\u1200-\u137f]", "am"),
    ("Cyrl", r"[\u0400-\u04ff]", None),
    ("Arab", r"[\u0600-\u06ff\u0750-\u077f\ufb50-\ufdff\ufe70-\ufefc]", None),
    ("Deva", r"[\u0900-\u097f]", None),
    ("Latn", r"[A-Za-z\u00c0-\u00ff\u0100-\u024f\u1e00-\u1eff]", None),
)
_SCRIPT_RES = tuple((name, re.compile(rx), lang) for name, rx, lang in _SCRIPTS)
# One Han, Kana or Hangul character carries about a word; a Latin letter about a fifth.
_WEIGHT = {"Hani": 3.0, "Kana": 3.0, "Hang": 2.5}
# Languages langdetect may choose within each shared script.
_SHARED = {
    "Cyrl": ("ru", "uk", "bg", "mk"),
    "Arab": ("ar", "fa", "ur"),
    "Deva": ("hi", "mr", "ne"),
    "Latn": (
        "en", "de", "fr", "es", "pt", "it", "nl", "pl", "tr", "vi", "id", "sv", "cs",
        "ro", "hu", "fi", "da", "no", "ca", "hr", "sk", "sl", "lt", "lv", "et", "sq",
        "sw", "tl", "af", "cy",
    ),
}
# Short text leans to the languages reasoning text is most often in.
_PRIOR = {"en": 6.0, "de": 3.0, "fr": 3.0, "es": 3.0, "pt": 1.5, "it": 1.5, "ru": 4.0}
_PRIOR_OTHERS = 0.5
# langdetect's smoothing of unseen n-grams (alpha 0.5 over a base frequency of 10000).
_SMOOTHING = 5e-5
# Short-text scores are divided by this so that one rare n-gram cannot outvote the prior
# and the function words (0.938 on phrases at 4, 0.904 undivided: bench/detect_eval.py).
_NB_TEMPERATURE = 4
# Detection reads at most this much of a segment: the language shows long before.
_MAX_DETECT_CHARS = 240
_MAX_CACHED_NGRAMS = 200_000
_MAX_CACHED_WORDS = 100_000

# Characters that only Traditional (left) or only Simplified (right) Chinese uses.
_TRAD_SIMP = (
    "們们這这個个說说會会來来為为時时國国學学對对麼么還还點点後后種种與与電电開开關关"
    "問问題题現现應应動动實实體体當当經经發发過过長长間间無无從从東东見见兩两進进邊边"
    "裡里處处麼么總总計计確确認认數数據据錯错誤误讓让嗎吗將将樣样據据雖虽條条"
)
_TRAD = frozenset(_TRAD_SIMP[0::2])
_SIMP = frozenset(_TRAD_SIMP[1::2])

_STRIP = re.compile(
    # Every alternative is anchored or bounded: a long run without spaces costs linear time.
    r"```.*?(?:```|$)|`[^`\n]*`|\b(?:https?|ftp)://\S+|\bwww\.\S+"
    r"|[^\s@]{1,64}@[^\s@]{1,255}\.\w+|\\[a-zA-Z]+",
    re.S,
)
_ASCII_LETTERS = re.compile(r"[A-Za-z]")
_WORDS = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")


def _lexicon() -> dict[str, dict[str, float]]:
    """word -> {language: weight}; a word shared by n languages weighs 1/n in each."""
    raw = json.loads(resources.files("service.data").joinpath("function_words.json").read_text())
    owners: dict[str, list[str]] = {}
    for lang, words in raw.items():
        for word in words.split():
            owners.setdefault(word, []).append(lang)
    return {w: {lang: 1.0 / len(langs) for lang in langs} for w, langs in owners.items()}


_LEXICON = _lexicon()
_MARKS: tuple[tuple[str, str, float], ...] = (
    ("ß", "de", 3.0), ("äöü", "de", 1.0), ("ñ¿¡", "es", 3.0), ("áíóú", "es", 0.5),
    ("áíóúãõ", "pt", 0.5), ("ãõ", "pt", 2.5), ("èêëîïôûùœâ", "fr", 1.5), ("ç", "fr", 0.8),
    ("ç", "pt", 0.5), ("ìò", "it", 1.5), ("ąęłńśźż", "pl", 3.0), ("ğış", "tr", 3.0),
    ("ăâđơư", "vi", 2.0), ("åø", "sv", 1.0), ("åøæ", "da", 1.0), ("ěščřžůň", "cs", 2.0),
    ("ыэё", "ru", 3.0), ("іїєґ", "uk", 3.0), ("ѓќѕљњџј", "mk", 3.0),
)


def _count_scripts(text: str) -> Counter[str]:
    if text.isascii():  # most reasoning text: one pass instead of one per script
        letters = len(_ASCII_LETTERS.findall(text))
        return Counter({"Latn": letters}) if letters else Counter()
    counts: Counter[str] = Counter()
    for name, rx, _ in _SCRIPT_RES:
        n = len(rx.findall(text))
        if n:
            counts[name] = n
    return counts


def chinese_script(text: str) -> str:
    """``Hant`` when Traditional-only characters outnumber Simplified-only ones, else ``Hans``."""
    trad = sum(ch in _TRAD for ch in text)
    simp = sum(ch in _SIMP for ch in text)
    return "Hant" if trad > simp else "Hans"


class _Langdetect:
    """langdetect, limited to a set of languages, with a fixed seed; thread-safe."""

    def __init__(self, langs: tuple[str, ...], n_trial: int = 3) -> None:
        from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

        self.factory = DetectorFactory()
        profiles = []
        for lang in langs:
            path = f"{PROFILES_DIRECTORY}/{lang}"
            with open(path, encoding="utf-8") as f:
                profiles.append(f.read())
        self.factory.load_json_profile(profiles)
        self.factory.set_seed(0)
        self.langs = langs  # the order of the profiles, and of naive_bayes' answers
        # langdetect averages 7 random walks; 3 give the same answers on the evaluation
        # set at under half the cost (bench/detect_eval.py).
        self.n_trial = n_trial
        self._lock = threading.Lock()
        self._logs: dict[str, np.ndarray] = {}
        self._words: dict[tuple[str, bool], np.ndarray | None] = {}
        self._priors: dict[int, tuple[dict[str, float], np.ndarray]] = {}

    def probabilities(self, text: str, prior: dict[str, float] | None) -> dict[str, float]:
        from langdetect.lang_detect_exception import LangDetectException

        with self._lock:  # DetectorFactory is not documented as thread-safe
            detector = self.factory.create()
            detector.n_trial = self.n_trial
            if prior:
                # langdetect gives a language left out of the prior map a prior of zero.
                detector.set_prior_map({k: prior.get(k, _PRIOR_OTHERS) for k in self.langs})
            detector.append(text)
            try:
                return {p.lang: p.prob for p in detector.get_probabilities()}
            except LangDetectException:
                return {}

    def naive_bayes(self, words: list[str], prior: dict[str, float]) -> np.ndarray:
        """Score every n-gram of the words against every profile: no random walk.

        langdetect samples n-grams at random, which on a two-word phrase lets one unlucky
        draw decide; scoring all of them is deterministic. The n-grams are langdetect's
        own (its normalisation and cleaning, words joined by spaces, read up to
        ``_MAX_DETECT_CHARS``); since they never cross a space, each word's sum of
        log-probabilities is computed once and cached, and a text's score is the sum of
        its words' vectors. The answer is a probability per language of ``langlist``
        (those under 1e-4 set to 0; all 0 when the text has no known n-gram).
        """
        from langdetect.utils.ngram import NGram

        text = NGram.normalize_vi(" ".join(words)[:_MAX_DETECT_CHARS])
        if len(_LATIN.findall(text)) * 2 < len(_NON_LATIN.findall(text)):
            text = _LATIN.sub("", text)  # langdetect's cleaning_text: Latin within others
        tokens = text.translate(_NORMALIZE).split(" ")
        total: np.ndarray | None = None
        for i, token in enumerate(tokens):
            if not token:
                continue
            if not token.islower() and any(ch.isupper() for ch in token):
                return self._naive_bayes_reference(text, prior)
            vec = self._word_vector(token, i < len(tokens) - 1)
            if vec is not None:
                total = vec if total is None else total + vec
        if total is None:
            return np.zeros(len(self.langs))
        return self._posterior(self._log_prior(prior) + total)

    @staticmethod
    def _posterior(logp: np.ndarray) -> np.ndarray:
        weights = np.exp(logp - logp.max())
        weights /= weights.sum()
        weights[weights <= 1e-4] = 0.0
        return weights

    def _log_prior(self, prior: dict[str, float]) -> np.ndarray:
        cached = self._priors.get(id(prior))
        if cached is None or cached[0] is not prior:
            logs = np.log(np.array([prior.get(lang, _PRIOR_OTHERS)
                                    for lang in self.factory.langlist]))
            cached = self._priors[id(prior)] = (prior, logs)
        return cached[1]

    def _word_vector(self, token: str, spaced: bool) -> np.ndarray | None:
        """Summed log-probabilities of the n-grams langdetect reads in `` token`` (and its
        trailing space, unless the token ends the text); None when it has none."""
        key = (token, spaced)
        if key in self._words:
            return self._words[key]
        padded = f" {token} " if spaced else f" {token}"
        probs = self.factory.word_lang_prob_map
        vectors = [
            self._log_vector(gram)
            for end in range(2, len(padded) + 1)
            for n in (1, 2, 3)
            if n <= end and (gram := padded[end - n : end]) != " " and gram in probs
        ]
        vec = np.sum(vectors, axis=0) if vectors else None
        if len(self._words) < _MAX_CACHED_WORDS:
            self._words[key] = vec
        return vec

    def _naive_bayes_reference(self, text: str, prior: dict[str, float]) -> np.ndarray:
        """The same scores through langdetect's own n-gram walk (upper-case words)."""
        with self._lock:
            detector = self.factory.create()
            detector.append(text)
            detector.cleaning_text()
            grams = detector._extract_ngrams()
        if not grams:
            return np.zeros(len(self.langs))
        total = np.sum([self._log_vector(gram) for gram in grams], axis=0)
        return self._posterior(self._log_prior(prior) + total)

    def _log_vector(self, gram: str) -> np.ndarray:
        vec = self._logs.get(gram)
        if vec is None:
            probs = np.array(self.factory.word_lang_prob_map[gram])
            vec = np.log(probs + _SMOOTHING) / _NB_TEMPERATURE
            if len(self._logs) < _MAX_CACHED_NGRAMS:
                self._logs[gram] = vec
        return vec


class _Normalize(dict[int, str]):
    """langdetect's per-character normalisation, as a ``str.translate`` table filled on use."""

    def __missing__(self, code: int) -> str:
        from langdetect.utils.ngram import NGram

        ch = NGram.normalize(chr(code))
        self[code] = ch
        return ch


_NORMALIZE = _Normalize()
# langdetect's cleaning_text: Latin is 'A'..'z'; "non-Latin" is U+0300 and up, but for
# Latin Extended Additional.
_LATIN = re.compile(r"[A-z]")
_NON_LATIN = re.compile("[\u0300-\u1dff\u1f00-\U0010ffff]")


@functools.lru_cache(maxsize=8)
def _langdetect_for(langs: tuple[str, ...]) -> _Langdetect:
    return _Langdetect(langs)


class ScriptDetector(Detector):
    """Script first, then langdetect within a shared script, helped by function words."""

    name = "default"

    def detect(self, text: str) -> Detection:
        clean = _STRIP.sub(" ", text[:DETECT_MAX_CHARS])
        counts = _count_scripts(clean)
        if not counts:
            return UNKNOWN
        weighted = {s: n * _WEIGHT.get(s, 1.0) for s, n in counts.items()}
        total = sum(weighted.values())
        # Han with any Kana is Japanese; Kana alone too.
        cjk = counts.get("Hani", 0) + counts.get("Kana", 0)
        if cjk and counts.get("Kana", 0):
            weighted["Kana"] = weighted.get("Kana", 0.0) + weighted.pop("Hani", 0.0)
        script = max(weighted, key=lambda s: weighted[s])
        share = weighted[script] / total
        n = counts.get(script, 0) + (counts.get("Hani", 0) if script == "Kana" else 0)
        if script == "Hani":
            return Detection(f"zh-{chinese_script(clean)}", round(share, 3), n >= 2)
        named = {name: lang for name, _, lang in _SCRIPT_RES}
        if named.get(script):
            lang = named[script]
            assert lang is not None
            return Detection(lang, round(share, 3), n >= 2)
        return self._within_script(clean, script, share, n)

    def _within_script(self, text: str, script: str, share: float, letters: int) -> Detection:
        langs = _SHARED[script]
        words = [w.lower() for w in _WORDS.findall(text)]
        probs = _langdetect_for(langs).naive_bayes(words, _PRIOR)  # in the order of langs
        if letters < 40:
            probs = self._blend(words, probs, langs)
        best = int(np.argmax(probs))
        if not probs[best] > 0:
            return Detection(None, 0.0, False)
        conf = float(probs[best]) * share
        reliable = conf >= 0.8 and letters >= (12 if script == "Latn" else 6)
        return Detection(langs[best], round(conf, 3), reliable)

    @staticmethod
    def _blend(words: list[str], probs: np.ndarray, langs: tuple[str, ...]) -> np.ndarray:
        """Mix langdetect's view with function words and diacritics, which short text needs."""
        evidence: dict[str, float] = {}
        for word in words:
            for lang, weight in _LEXICON.get(word, {}).items():
                evidence[lang] = evidence.get(lang, 0.0) + weight
        joined = "".join(words)
        for chars, lang, weight in () if joined.isascii() else _MARKS:  # marks are not ASCII
            if any(ch in joined for ch in chars):
                evidence[lang] = evidence.get(lang, 0.0) + weight
        if not evidence:
            return probs
        scale = sum(evidence.values())
        votes = np.array([evidence.get(lang, 0.0) for lang in langs])
        mixed = 0.5 * probs + 0.5 * votes / scale
        return mixed / (sum(mixed.tolist()) or 1.0)


class LangdetectDetector(Detector):
    """Plain langdetect over all its languages, seeded: the baseline."""

    name = "langdetect"

    def __init__(self) -> None:
        import os

        from langdetect.detector_factory import PROFILES_DIRECTORY

        self._ld = _Langdetect(tuple(sorted(os.listdir(PROFILES_DIRECTORY))), n_trial=7)

    def detect(self, text: str) -> Detection:
        probs = self._ld.probabilities(_STRIP.sub(" ", text[:DETECT_MAX_CHARS]), None)
        if not probs:
            return UNKNOWN
        lang = max(probs, key=lambda k: probs[k])
        tag = {"zh-cn": "zh-Hans", "zh-tw": "zh-Hant"}.get(lang, lang)
        return Detection(tag, round(probs[lang], 3), probs[lang] >= 0.9 and len(text) >= 20)


DETECTORS: dict[str, type[Detector]] = {
    ScriptDetector.name: ScriptDetector,
    LangdetectDetector.name: LangdetectDetector,
}


def get_detector(name: str) -> Detector:
    """Build a detector by name, or raise ConfigError naming the choices."""
    try:
        return DETECTORS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown detector {name!r}; choose from {', '.join(sorted(DETECTORS))}"
        ) from None
