"""Language detection for short, mixed reasoning text.

Reasoning is short sentences full of code, terms and other scripts, where a general
detector guesses and, like langdetect's random sample, may answer the same text two ways.
The ``default`` detector decides by script first and uses statistics only within a shared
script, deterministically. Detectors are registered by name (``THINKTRANS_DETECTOR``).
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import re
import threading
import unicodedata
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import ClassVar

import numpy as np

from service.exceptions import ConfigError


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

    def __init__(self, languages: tuple[str, ...] = ()) -> None:  # noqa: B027 - optional
        """``languages``: the language subtags it may answer with (empty: all it knows)."""

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
# N-gram scores are divided by this so that one rare n-gram cannot outvote the prior and
# the word frequencies (tuned on tests/data/detect_dev.tsv: pairs 0.976 at 4, 0.983 at 8).
_NB_TEMPERATURE = 8
# Detection reads at most this much of a segment: the language shows long before.
_MAX_DETECT_CHARS = 240
_MAX_CACHED_NGRAMS = 200_000
_MAX_CACHED_WORDS = 100_000
_MAX_CACHED_VECTORS = 50_000  # word-frequency vectors: at most about 17 MB

# Simplified forms that Japanese writes too (国, 学, 会): the Traditional-to-Simplified
# map alone cannot tell them from forms Traditional Chinese shares with Japanese (台).
_SIMPLIFIED_ALSO_JAPANESE = frozenset("与个从会体后国学将当据数条来点里")

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


class _ScriptOf(dict[int, str | None]):
    """A ``str.translate`` table from a character to the index of its script in
    ``_SCRIPTS`` (as a character), or None for what is not a letter; filled on use."""

    def __missing__(self, code: int) -> str | None:
        ch = chr(code)
        found = None
        if ch.isalpha():  # not × ÷, Arabic-Indic digits or the danda, within script ranges
            found = next((chr(i) for i, (_, rx, _) in enumerate(_SCRIPT_RES) if rx.match(ch)),
                         None)
        if len(self) < _MAX_CACHED_CHARS:
            self[code] = found
        return found


_SCRIPT_OF = _ScriptOf()
_MAX_CACHED_CHARS = 100_000


def _count_scripts(text: str) -> Counter[str]:
    if text.isascii():  # most reasoning text: one pass instead of one per script
        letters = len(_ASCII_LETTERS.findall(text))
        return Counter({"Latn": letters}) if letters else Counter()
    # One pass: each character becomes its script's index, the rest is dropped.
    return Counter({_SCRIPT_RES[ord(i)][0]: n
                    for i, n in Counter(text.translate(_SCRIPT_OF)).items()})


def chinese_script(text: str) -> str:
    """``Hant`` when Traditional-only characters outnumber Simplified-only ones, else ``Hans``."""
    freq = _frequencies()
    trad = sum(ch in freq.traditional_only for ch in text)
    simp = sum(ch in freq.simplified_only for ch in text)
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

    def naive_bayes(self, words: list[str], prior: dict[str, float],
                    extra: np.ndarray | None = None) -> np.ndarray:
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
                return self._naive_bayes_reference(text, prior, extra)
            vec = self._word_vector(token, i < len(tokens) - 1)
            if vec is not None:
                total = vec if total is None else total + vec
        if total is None and extra is None:
            return np.zeros(len(self.langs))
        logp = self._log_prior(prior) + (0.0 if total is None else total)
        return self._posterior(logp if extra is None else logp + extra)

    def posterior(self, prior: dict[str, float], extra: np.ndarray) -> np.ndarray:
        """The answer of ``naive_bayes`` for a text whose words are scored in ``extra``."""
        return self._posterior(self._log_prior(prior) + extra)

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

    def _naive_bayes_reference(self, text: str, prior: dict[str, float],
                               extra: np.ndarray | None) -> np.ndarray:
        """The same scores through langdetect's own n-gram walk (upper-case words)."""
        with self._lock:
            detector = self.factory.create()
            detector.append(text)
            detector.cleaning_text()
            grams = detector._extract_ngrams()
        if not grams and extra is None:
            return np.zeros(len(self.langs))
        total = np.sum([self._log_vector(gram) for gram in grams], axis=0) if grams else 0.0
        logp = self._log_prior(prior) + total
        return self._posterior(logp if extra is None else logp + extra)

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


class _Frequencies:
    """How often words are used in each language of a shared script, and Han and Kana
    characters in Chinese and Japanese (``data/word_freq.tsv.gz``, built from wordfreq by
    ``service/tools/build_word_data.py``), as natural-log likelihoods.

    A word missing from a language's list (its most frequent ``TOP_WORDS``) is scored as
    rarer than any listed word: ``_UNLISTED_ZIPF``; languages without a list see ``vector``.
    The 350,000 (word, language) entries are
    kept as sorted arrays of the words' hashes (this process's ``hash``), about 4 MB
    instead of 90 MB of Python dicts.
    """

    def __init__(self) -> None:
        raw = resources.files("service.data").joinpath("word_freq.tsv.gz").read_bytes()
        self.langs: list[str] = []
        self.chars: dict[str, dict[str, int]] = {}  # lang -> {char: zipf x 10}
        self.simplified: dict[str, str] = {}
        hashes: list[int] = []
        owners: list[int] = []
        zipfs: list[int] = []
        for line in gzip.decompress(raw).decode("utf-8").splitlines():
            kind, *cells = line.split("\t")
            if kind == "words":
                self.langs.append(cells[0])
                for cell in cells[1:]:
                    word, _, zipf = cell.rpartition(":")
                    hashes.append(hash(word))
                    owners.append(len(self.langs) - 1)
                    zipfs.append(int(zipf))
            elif kind == "chars":
                self.chars[cells[0]] = {c[0]: int(c[2:]) for c in cells[1:]}
            elif kind == "simplified":
                pairs = cells[0]
                self.simplified = dict(zip(pairs[0::2], pairs[1::2], strict=True))
        # Characters only Traditional or only Simplified Chinese writes (a simplified form
        # that Japanese also uses, such as 台, is taken to be Traditional too), and those
        # that Chinese writes and Japanese does not.
        japanese = self.chars["ja"]
        self.traditional_only = frozenset(self.simplified)
        self.simplified_only = frozenset(
            v for v in self.simplified.values()
            if v not in self.simplified and v not in japanese) | _SIMPLIFIED_ALSO_JAPANESE
        self.chinese_only = (self.traditional_only | self.simplified_only) - japanese.keys()
        self.has_list = frozenset(self.langs)
        order = np.argsort(np.array(hashes, dtype=np.int64), kind="stable")
        self._hashes = np.array(hashes, dtype=np.int64)[order]
        self._owners = np.array(owners, dtype=np.uint8)[order]
        self._zipfs = np.array(zipfs, dtype=np.uint8)[order]
        self._vectors: dict[tuple[str, tuple[str, ...]], np.ndarray | None] = {}

    def listed(self, word: str) -> dict[str, int]:
        """{language: Zipf x 10} of the lists that have ``word``."""
        h = hash(word)
        lo = int(np.searchsorted(self._hashes, h))
        hi = lo
        while hi < len(self._hashes) and self._hashes[hi] == h:
            hi += 1
        return {self.langs[self._owners[i]]: int(self._zipfs[i]) for i in range(lo, hi)}

    def vector(self, word: str, langs: tuple[str, ...]) -> np.ndarray | None:
        """ln P(word | lang) for each of ``langs`` less the unlisted floor; None when no
        language lists the word (it then tells them apart no more than the floor)."""
        key = (word, langs)
        if key in self._vectors:
            return self._vectors[key]
        listed = self.listed(word)
        vec = None
        if any(lang in listed for lang in langs):
            # A language without a list cannot say the word is rare in it: it scores as
            # its closest relative with one (af as nl, et as fi), else a little below the
            # language that uses the word most (sw, cy, sq); its n-grams decide the rest.
            best = max(listed.values()) - _NO_LIST_PENALTY * 10
            floor = _UNLISTED_ZIPF * 10
            vec = np.array([(listed.get(lang, floor) if lang in self.has_list
                             else listed.get(_NO_LIST_PROXY[lang], floor) - _PROXY_PENALTY * 10
                             if lang in _NO_LIST_PROXY else best) - floor
                            for lang in langs]) * _ZIPF_TO_LN
        if len(self._vectors) < _MAX_CACHED_VECTORS:
            self._vectors[key] = vec
        return vec

    def japanese_over_chinese(self, han: str) -> float:
        """ln P(text | ja) - ln P(text | zh) over Han characters, as unigrams; a Traditional
        character is read as its Simplified form in Chinese."""
        ja, zh = self.chars["ja"], self.chars["zh"]
        floor = _UNLISTED_CHAR_ZIPF * 10
        total = 0.0
        traditional = False
        for ch in han:
            simple = self.simplified.get(ch, ch)
            traditional = traditional or simple != ch
            total += ja.get(ch, floor) - zh.get(simple, floor)
        # Chinese with Traditional-only characters is Traditional Chinese, which is a
        # minority of Chinese text; Japanese shares many of those characters.
        return total * _ZIPF_TO_LN - (_LN_TRADITIONAL_SHARE if traditional else 0.0)


_ZIPF_TO_LN = math.log(10) / 10  # tenths of a Zipf unit (log10 per billion) to ln
# A word below a language's list is taken to be this frequent (Zipf 3: once per million).
_UNLISTED_ZIPF = 3.0
# A language without a list scores a listed word this much rarer (Zipf) than the language
# that uses it most.
_NO_LIST_PENALTY = 1.0
_NO_LIST_PROXY = {"af": "nl", "et": "fi"}
_PROXY_PENALTY = 0.1
# How much of Chinese text is written in Traditional characters, as a log.
_LN_TRADITIONAL_SHARE = math.log(0.25)
# A Han character neither table has: rarer than any in either (their floors are about 2.5).
_UNLISTED_CHAR_ZIPF = 1.5


@functools.lru_cache(maxsize=1)
def _frequencies() -> _Frequencies:
    return _Frequencies()


@functools.lru_cache(maxsize=8)
def _langdetect_for(langs: tuple[str, ...]) -> _Langdetect:
    return _Langdetect(langs)


_NAMED = {name: lang for name, _, lang in _SCRIPTS if lang}
_HAN = re.compile(_SCRIPTS[0][1])
_HIRAGANA = re.compile(r"[\u3041-\u309f]")
# ln P(ja) - ln P(zh) a Han-only text needs to be read as Japanese, and how far from it
# the answer is reliable.
_JAPANESE_MARGIN = 0.0
_RELIABLE_HAN_ODDS = 2.0
# How much the word frequencies count against the n-gram profiles (tempered already).
_WORD_WEIGHT = 0.5
# Terms carry no grammar: identifiers (camelCase, snake_case, dotted.names), acronyms and
# words with digits. Mixed-script text is weighed without them; so is a shared script.
_TERMS = re.compile(
    r"\b(?:[A-Za-z]*[a-z][A-Z]\w*|[A-Z]{2,}[a-z]?s?|\w*\d\w*|\w+(?:[._/:]\w+)+|\w*_\w*"
    r"|\w+(?:-\w+){2,})\b"  # end-to-end, state-of-the-art: names, whatever the grammar
)
# Mixed-script text is weighed without hyphenated compounds too: "Ruby-on-rails" in a
# Russian sentence is a name, its "on" no sign of English grammar.
_COMPOUND_TERMS = re.compile(_TERMS.pattern + r"|\w+(?:-\w+)+")
# In mixed-script text, what a unit of each script weighs, in words: a Han character
# carries about two thirds of a word, a Kana character half, a Hangul syllable two fifths.
_WORDS_PER_CHAR = {"Hani": 1 / 1.5, "Kana": 1 / 2, "Hang": 1 / 2.5}
# A word of a shared script that is a function word carries grammar; any other is a term.
_TERM_WEIGHT = 0.3


def _normalize(text: str) -> str:
    """NFKC: decomposed accents (macOS) composed, full-width Latin made plain."""
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def _without_terms(text: str) -> str:
    """``text`` less its terms, unless nothing else is left."""
    rest = _TERMS.sub(" ", text)
    return rest if _WORDS.search(rest) else text


def _grammar_weights(text: str, counts: Counter[str]) -> dict[str, float]:
    """Each script's weight in words, the shared scripts' words weighed by the grammar
    they carry: "所以 total 是 59 分钟" is Chinese, "I think 这个 is right" English."""
    weights: dict[str, float] = {}
    for script, n in counts.items():
        if script in _WORDS_PER_CHAR:
            weights[script] = n * _WORDS_PER_CHAR[script]
        elif script not in _SHARED:
            weights[script] = n / 3
    shared = [s for s in counts if s in _SHARED]
    if shared:
        words = _WORDS.findall(_COMPOUND_TERMS.sub(" ", text))
        for script in shared:
            weights[script] = 0.0
        for word in words:
            of = _script_of(word[0])
            if of in weights and of in _SHARED:
                weights[of] += 1.0 if word.lower() in _LEXICON else _TERM_WEIGHT
        for script in shared:
            if not weights[script]:
                del weights[script]
    return weights or {s: float(n) for s, n in counts.items()}


def _script_of(ch: str) -> str | None:
    index = _SCRIPT_OF[ord(ch)]
    return None if index is None else _SCRIPT_RES[ord(index)][0]


class ScriptDetector(Detector):
    """Script first, then word frequencies and n-grams within a shared script.

    Hangul, Kana, Thai and the other scripts that name their language need no statistics.
    A line that mixes scripts (``首先，确定整个 hiking旅程所用的总时间``) goes to the script
    whose words carry its grammar. Han alone is Chinese or Japanese by how often each
    writes its characters. A shared script (Latin, Cyrillic, ...) is scored word by word:
    wordfreq's lists, or, for a word no list has, every one of its n-grams in langdetect's
    profiles (not langdetect's random sample: the same text always gives the same answer).
    """

    name = "default"

    def __init__(self, languages: tuple[str, ...] = ()) -> None:
        # A shared script's candidates, restricted to ``languages`` where any of them are
        # written in it; a script none of them uses keeps all its languages (Cyrillic text
        # is still told apart when only en and zh are configured).
        wanted = set(languages)
        self._shared = {script: tuple(lang for lang in langs if lang in wanted) or langs
                        for script, langs in _SHARED.items()}

    def warm_up(self) -> None:
        _frequencies()
        super().warm_up()

    def detect(self, text: str) -> Detection:
        clean = _STRIP.sub(" ", _normalize(text[:DETECT_MAX_CHARS]))
        counts = _count_scripts(clean)
        if not counts:
            return UNKNOWN
        weighted = (_grammar_weights(clean, counts) if len(counts) > 1
                    else {s: float(n) for s, n in counts.items()})
        total = sum(weighted.values())
        # Han with any Kana is Japanese; Kana alone too. But Katakana alone (a name, a
        # loanword: no particle) in Han that only Chinese writes is a term in Chinese:
        # 我喜欢吃日本的ラーメン.
        if counts.get("Kana", 0) and "Hani" in weighted:
            if _HIRAGANA.search(clean) or not any(
                    ch in _frequencies().chinese_only for ch in _HAN.findall(clean)):
                weighted["Kana"] = weighted.get("Kana", 0.0) + weighted.pop("Hani")
            else:
                weighted.pop("Kana", None)
        script = max(weighted, key=lambda s: weighted[s])
        share = weighted[script] / total if total else 1.0
        n = counts.get(script, 0) + (counts.get("Hani", 0) if script == "Kana" else 0)
        if script == "Hani":
            han = "".join(_HAN.findall(clean)[:_MAX_DETECT_CHARS])
            odds = _frequencies().japanese_over_chinese(han)
            # Reliable only when the characters tell Chinese from Japanese well enough:
            # 時間 is both.
            sure = n >= 2 and abs(odds - _JAPANESE_MARGIN) >= _RELIABLE_HAN_ODDS
            if odds > _JAPANESE_MARGIN:
                return Detection("ja", round(share, 3), sure)
            return Detection(f"zh-{chinese_script(clean)}", round(share, 3), sure)
        lang = _NAMED.get(script)
        if lang:
            return Detection(lang, round(share, 3), n >= 2)
        return self._within_script(clean, script, share, n)

    def _within_script(self, text: str, script: str, share: float, letters: int) -> Detection:
        langs = self._shared[script]
        if len(langs) == 1:
            return Detection(langs[0], round(share, 3), share >= 0.8 and letters >= 12)
        words = [w.lower().replace("’", "'").replace("i\u0307", "i")  # İ lowered: i + dot
                 for w in _WORDS.findall(_without_terms(text)[:_MAX_DETECT_CHARS])]
        freq = _frequencies()
        extra: np.ndarray | None = None
        unlisted = []  # words no list has: the n-gram profiles score them
        for word in words:
            vec = freq.vector(word, langs)
            if vec is None and "'" in word:  # l'architecture: l + architecture, as listed
                head, _, tail = word.partition("'")
                parts = [v for v in (freq.vector(head, langs), freq.vector(tail, langs))
                         if v is not None]
                vec = sum(parts[1:], parts[0]) if parts else None
            if vec is not None:
                extra = vec if extra is None else extra + vec
            else:
                unlisted.append(word)
        if extra is not None:
            extra = extra * _WORD_WEIGHT
        detector = _langdetect_for(langs)
        if unlisted:
            probs = detector.naive_bayes(unlisted, _PRIOR, extra)  # in langs' order
        elif extra is not None:  # every word listed: the n-gram profiles have nothing to add
            probs = detector.posterior(_PRIOR, extra)
        else:
            return UNKNOWN
        best = int(np.argmax(probs))
        if not probs[best] > 0:
            return Detection(None, 0.0, False)
        conf = float(probs[best]) * share
        reliable = conf >= 0.8 and letters >= (12 if script == "Latn" else 6)
        return Detection(langs[best], round(conf, 3), reliable)


class LangdetectDetector(Detector):
    """Plain langdetect over all its languages, seeded: the baseline."""

    name = "langdetect"

    def __init__(self, languages: tuple[str, ...] = ()) -> None:
        import os

        from langdetect.detector_factory import PROFILES_DIRECTORY

        profiles = sorted(os.listdir(PROFILES_DIRECTORY))
        wanted = _answerable(languages) | {"zh-cn", "zh-tw"} if languages else set(profiles)
        chosen = [p for p in profiles if p in wanted]
        self._ld = _Langdetect(tuple(chosen if len(chosen) >= 2 else profiles), n_trial=7)

    def detect(self, text: str) -> Detection:
        probs = self._ld.probabilities(_STRIP.sub(" ", text[:DETECT_MAX_CHARS]), None)
        if not probs:
            return UNKNOWN
        lang = max(probs, key=lambda k: probs[k])
        tag = {"zh-cn": "zh-Hans", "zh-tw": "zh-Hant"}.get(lang, lang)
        return Detection(tag, round(probs[lang], 3), probs[lang] >= 0.9 and len(text) >= 20)


# The languages each script may be answered with, for detectors that restrict themselves.
KNOWN_LANGUAGES: tuple[str, ...] = tuple(dict.fromkeys(
    ["zh", *(lang for _, _, lang in _SCRIPTS if lang)] + [x for v in _SHARED.values() for x in v]
))


def _answerable(languages: tuple[str, ...]) -> set[str]:
    """``languages``, with what every restricted detector answers as the default does:
    the languages scripts name, and a shared script's languages when none is listed."""
    wanted = {*languages, "zh", *_NAMED.values()}
    for langs in _SHARED.values():
        if not wanted.intersection(langs):
            wanted.update(langs)
    return wanted


class LinguaDetector(Detector):
    """lingua-language-detector (``pip install 'thinktrans[lingua]'``), restricted to the
    configured languages (and those a script names) or to those the default detector
    knows; its models are loaded at start."""

    name = "lingua"

    def __init__(self, languages: tuple[str, ...] = ()) -> None:
        try:
            from lingua import Language, LanguageDetectorBuilder
        except ImportError:
            raise ConfigError(
                "detector 'lingua' needs the lingua-language-detector package: "
                "pip install 'thinktrans[lingua]'"
            ) from None
        by_code = {lang.iso_code_639_1.name.lower(): lang for lang in Language.all()}
        by_code["no"] = by_code["nb"]
        wanted = _answerable(languages) if languages else set(KNOWN_LANGUAGES)
        chosen = {by_code[code] for code in wanted if code in by_code}
        self._languages = frozenset(code for code in wanted if code in by_code)
        if len(chosen) < 2:
            raise ConfigError("detector 'lingua' needs at least two languages it knows; "
                              f"it knows {', '.join(sorted(by_code))}")
        self._detector = (LanguageDetectorBuilder.from_languages(*sorted(chosen, key=str))
                          .with_preloaded_language_models().build())

    def detect(self, text: str) -> Detection:
        clean = _STRIP.sub(" ", _normalize(text[:DETECT_MAX_CHARS]))[:_MAX_DETECT_CHARS * 4]
        counts = _count_scripts(clean)
        letters = sum(counts.values())
        if not letters:
            return UNKNOWN
        script, n = counts.most_common(1)[0]
        named = _NAMED.get(script)
        if named and named not in self._languages:  # Khmer, Lao, ...: lingua has no model
            return Detection(named, round(n / letters, 3), n >= 2)
        values = self._detector.compute_language_confidence_values(clean)
        if not values or values[0].value <= 0:
            return UNKNOWN
        best = values[0]
        tag = best.language.iso_code_639_1.name.lower()
        if tag == "zh":
            tag = f"zh-{chinese_script(clean)}"
        conf = round(float(best.value), 3)
        return Detection(tag, conf, conf >= 0.8 and letters >= 12)


DETECTORS: dict[str, type[Detector]] = {
    ScriptDetector.name: ScriptDetector,
    LangdetectDetector.name: LangdetectDetector,
    LinguaDetector.name: LinguaDetector,
}


def get_detector(name: str, languages: tuple[str, ...] | list[str] = ()) -> Detector:
    """Build a detector by name, restricted to ``languages`` (language subtags; empty: all
    it knows), or raise ConfigError naming the choices."""
    try:
        cls = DETECTORS[name]
    except KeyError:
        raise ConfigError(
            f"unknown detector {name!r}; choose from {', '.join(sorted(DETECTORS))}"
        ) from None
    return cls(tuple(languages))


def clear_caches() -> None:
    """Forget what detection has cached (for benchmarks that time a cold start)."""
    _frequencies.cache_clear()
    _langdetect_for.cache_clear()
