"""Protected spans: the parts of a prose segment that a translation keeps byte for byte.

Thinking is full of things no translation may touch: inline code, identifiers, paths,
URLs, versions, numbers, math, CLI flags, quoted error messages. They are found
here once per segment (``SpanFinder``, one table of kinds, ``KINDS``), with a glossary's
terms, and the answer (``Protected``) is what every backend keeps and every translation is
checked against. Backends keep them their own way; the masking helpers they share live here.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "INTEGER",
    "KINDS",
    "Glossary",
    "Number",
    "Placeholders",
    "Protected",
    "Span",
    "SpanFinder",
    "backtracking_problem",
    "numbers",
    "rejoin",
]

# Characters that end a sentence rather than a URL, a path or a name written before them.
_TAIL = ".,;:!?'\")]}>*_`。，、；：！？）」』】》"
# What an identifier, a path or an expression may end in that would be trimmed from a URL.
_KEEP_END = "_*`"

# File extensions a bare file name ("config.yaml") may end in: without a slash, a dotted
# word is a file only with one of these (so "e.g.", "U.S." and "3.5" are not).
_EXTENSIONS = (
    "py pyi pyx ipynb js mjs cjs ts tsx jsx vue svelte json jsonl yaml yml toml ini cfg conf "
    "env lock md rst txt csv tsv xml html htm css scss sass less sql db sqlite rs go c h cc "
    "cpp hpp cxx java kt kts scala rb php pl lua r jl swift m mm cs fs dart ex exs erl hs ml "
    "sh bash zsh fish ps1 bat cmd mk cmake gradle proto graphql tf hcl nix log out pdf png "
    "jpg jpeg gif svg webp ico mp3 mp4 wav zip tar gz tgz bz2 xz zst 7z whl so dll dylib a "
    "o exe bin wasm pt pth ckpt safetensors onnx gguf npy npz pkl parquet arrow h5 model "
    "spm vocab bak tmp diff patch"
).split()
_EXT = "(?:" + "|".join(sorted(_EXTENSIONS, key=len, reverse=True)) + ")"

# Top-level domains a bare host name ("scriptdu.de", "glitch.com") may end in.
_TLDS = "com|org|net|io|dev|de|fr|es|ru|jp|cn|kr|uk|eu|ch|me|ai|app|co|edu|gov|info|tv|xyz"

# Units a number may carry ("10 ms", "5GB", "3.5 kg", "20K"). Not "%", "x", "bits" or
# words ("tokens", "files"): those a translation writes its own way ("80 %", "3 倍",
# "64-bit"), as it does prices, dates and counts, which are prose.
_UNITS = (
    "ns|µs|us|ms|s|sec|secs|min|mins|h|hr|hrs|Hz|kHz|MHz|GHz|B|KB|kB|KiB|MB|MiB|GB|GiB|TB|"
    "TiB|PB|Kb|Mb|Gb|bps|Kbps|Mbps|Gbps|px|pt|em|rem|dpi|fps|rpm|mm|cm|m|km|mg|g|kg|ml|mL|"
    "V|mV|kV|mA|W|kW|MW|kWh|Wh|kJ|K|°C|°F|qps|rps|req/s|tok/s|ms/token|k|M|G|T"
)
# A currency sign before or after a number makes it a price. A dollar before an amount
# ("$5. Then", "$6,768 saved", "$160-$240") opens no math.
_CURRENCY = "$€£¥₹"
_NOT_PRICE = r"(?![\d.,]*\d(?:[\s)\-–]|[.,;:!?](?:\s|$)|$))"

# A path segment; an operand of an expression; a quoted literal.
_SEG = r"[\w.@+*~-]"
_OPERAND = (
    r"(?:[\w.]+(?:\[[^\[\]\n]{1,20}\]|\([^()\n]{0,20}\))*"
    r"|\"[^\"\n]{0,40}\"|'[^'\n]{0,40}')"
)
_ITEM = r"[ \t]*(?:[\w.+-]+|'[^'\n]{0,30}'|\"[^\"\n]{0,30}\")[ \t]*"
# The ideographs, kana, hangul and full-width punctuation a CJK sentence goes on with after
# a URL or an error message ("见https://x.org/a的说明", "是RuntimeError: x，而…"): where
# they stop.
_CJK_RANGES = r"\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef"
_CJK = "[" + _CJK_RANGES + "]"
_URL_CHAR = r"[^\s<>\"'`" + _CJK_RANGES + "]"
_MESSAGE_CHAR = r"[^\n" + _CJK_RANGES + "]"

# What a text has, found once per text: some characters, and a few features named like
# the text they stand for ("0" a digit, "w.w" a dot between word characters, ".a" a dot
# before a letter, "0.0" a dot between digits).
_GATE = "`$\\@/:-=<>&|([^_\"'v."
_DIGIT = re.compile(r"\d")
_DOT_FEATURES = tuple((name, re.compile(pattern, re.ASCII)) for name, pattern in (
    ("w.w", r"\w\.\w"), (".a", r"\.[A-Za-z_]"), ("0.0", r"\d\.\d")))


class _Cue(NamedTuple):
    """What a text needs for a pattern to match at all: one of ``marks`` (a character or a
    feature of ``_GATE`` and ``_DOT_FEATURES``) or of ``literals``, if any are named, and
    then a match of ``pattern``, if any."""

    marks: frozenset[str]
    literals: tuple[str, ...]
    pattern: re.Pattern[str] | None


def _cue(*needs: str, pattern: str | None = None) -> _Cue:
    marks = frozenset(n for n in needs
                      if (len(n) == 1 and n in _GATE) or n in ("0", "w.w", ".a", "0.0"))
    return _Cue(marks, tuple(n for n in needs if n not in marks),
                None if pattern is None else re.compile(pattern, re.ASCII))


class _Kind(NamedTuple):
    """A kind as a finder searches it: its rank, the cue of any of its parts (None: always
    searched), and its parts, each with its own cue."""

    kind: str
    rank: int
    cue: _Cue | None
    parts: tuple[tuple[_Cue | None, re.Pattern[str]], ...]


def _cued(cue: _Cue, have: set[str], text: str) -> bool:
    """Whether a text with ``have`` (``_marks``) has what ``cue`` needs."""
    if cue.marks or cue.literals:
        if cue.marks.isdisjoint(have):
            for literal in cue.literals:
                if literal in text:
                    break
            else:
                return False
    return cue.pattern is None or cue.pattern.search(text) is not None


def _marks(text: str) -> set[str]:
    """The characters of ``_GATE`` and the features ``text`` has."""
    have = {ch for ch in _GATE if ch in text}
    if _DIGIT.search(text):
        have.add("0")
    if "." in have:
        have.update(name for name, pattern in _DOT_FEATURES if pattern.search(text))
    return have


# The table of kinds, in priority order: where two spans overlap, the one that starts
# first wins, then the longer, then the earlier kind here. Each kind is a few patterns,
# each with its cue (what a text must have for the pattern to match at all), looked for
# first: most prose segments have no backtick, no dollar, no dot inside a word, and are
# searched by few patterns.
_PARTS: dict[str, tuple[tuple[_Cue, str], ...]] = {
    # ``code``, ```x```, `foo()`: every inline code span, backticks included.
    "code": ((_cue("`"), r"(?<!`)(`+)(?!`)[^\n]+?(?<!`)\1(?!`)"),),
    # $x^2 + 1$, $$...$$, \( ... \), \[ ... \], and LaTeX commands with their arguments
    # (not the "\Users" of a Windows path: the path starts earlier and wins).
    "math": (
        (_cue("$$"), r"\$\$[^$]+?\$\$"),
        (_cue("$"), r"(?<![\w$\\])\$(?=\S)" + _NOT_PRICE + r"[^$\n]{1,400}?(?<=\S)\$(?![\w$])"),
        (_cue("\\("), r"\\\((?s:.{1,400}?)\\\)"),
        (_cue("\\["), r"\\\[(?s:.{1,400}?)\\\]"),
        (_cue("\\"), r"(?<![\w\\])\\[A-Za-z]+\*?(?:\[[^\[\]\n]{0,80}\])?"
                     r"(?:\{(?:[^{}\n]|\{[^{}\n]*\})*\})*"),
    ),
    # A URL with its scheme, www.x, or a bare host name with a known top-level domain.
    "url": (
        (_cue("://"), r"\b(?:https?|ftp|file|ssh|git|wss?)://" + _URL_CHAR + "+"),
        (_cue("www."), r"\bwww\." + _URL_CHAR + "+"),
        (_cue("w.w", pattern=r"\.(?:" + _TLDS + r")\b"),
         r"(?<![\w.@/-])(?:[A-Za-z0-9][A-Za-z0-9-]*\.)+(?:" + _TLDS + r")(?![\w-])"),
    ),
    "email": (
        (_cue("@"),
         r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    ),
    # A quoted error message ("ModuleNotFoundError: No module named 'x'", 'fatal: ...'), or
    # an unquoted one, from its exception's name to the end of its sentence.
    "error": (
        (_cue("\"", "'", pattern="Error|Exception|Warning|rror:|atal:|Traceback"),
         r"\"[^\"\n]{0,200}\b(?:\w*(?:Error|Exception|Warning)|[Ee]rror:|[Ff]atal:|"
         r"[Ww]arning:|Traceback)[^\"\n]{0,200}\""
         r"|(?<!\w)'[^'\n]{0,200}\b(?:\w*(?:Error|Exception)|[Ee]rror:|[Ff]atal:|"
         r"Traceback)[^'\n]{0,200}'(?!\w)"),
        (_cue("Error:", "Exception:", "Warning:"),
         r"\b(?:[A-Z][A-Za-z]*)?(?:Error|Exception|Warning):[ \t]" + _MESSAGE_CHAR
         + r"{1,300}?(?=[.!?](?:\s|$)|" + _CJK + r"|\n|$)"),
    ),
    # A path: with a slash (src/app.py, ./run.sh, ~/.config, /etc/hosts, %APPDATA%/x,
    # data/*.ps), C:\x\y, a file name with a known extension (config.yaml, main.c:120),
    # or a bare extension (".sh"). Dockerfile is a word.
    "path": (
        (_cue("/"), r"(?<![\w/.~%-])(?:~|\.{1,2}|%[A-Za-z_]\w*%?)?/?" + _SEG + r"+"
                    r"(?:/" + _SEG + r"*)+(?::\d+){0,2}"),
        # An absolute path; not the end tag of "<b>bold</b>".
        (_cue("/"), r"(?<![\w/.~%<-])/" + _SEG + r"*[A-Za-z]" + _SEG + "*"),
        (_cue(":\\"), r"(?<!\w)[A-Za-z]:\\(?:[\w .()~-]+\\)*[\w.~-]+"),
        (_cue("w.w"), r"(?<![\w/.-])\.?[\w-]*\w\." + _EXT + r"(?::\d+){0,2}(?![\w-])"),
        (_cue(".a"), r"(?<![\w/.\\-])\." + _EXT + r"(?![\w-])"),
    ),
    # --dry-run, -v, --max-tokens=128 (a lone dash, a dash inside a word, "c'est-à-dire",
    # or after code, "`map()`-Methode", is not a flag).
    "flag": (
        (_cue("-"), r"(?<![\w\-`)\]\"'\u00c0-\u024f\u0370-\u04ff])--?[A-Za-z][\w-]*"
                    r"(?:=[^\s,;)]+)?"),
    ),
    # v1.2.3, 2.13.0, 3.11.7rc1, v2, voicevox-cpu-0.12.0 (a plain decimal "3.5" is a
    # number).
    "version": (
        (_cue("v", pattern=r"v\d"),
         r"(?<![\w.])v\d+(?:\.\d+)*(?:[-.]?(?:a|b|rc|dev|post)\d*)?(?![\w])"),
        (_cue("0.0"),
         r"(?<![\w.])\d+\.\d+\.\d+(?:\.\d+)*(?:[-.]?(?:a|b|rc|dev|post)\d*)?(?![\w])"),
        (_cue("0.0", pattern=r"-v?\d"),
         r"(?<![\w.-])[A-Za-z]\w*(?:-[A-Za-z]\w*)*-v?\d+(?:\.\d+)+"
         r"(?:[-.]?(?:a|b|rc|dev|post)\d*)?(?![\w-])"),
    ),
    # O(n log n), a[i] == b[j], x = 3, CUDA_VISIBLE_DEVICES=1, [1, 2, 3], x^2.
    "expr": (
        (_cue("(", pattern=r"[OΘΩo]\("),
         r"(?<!\w)[OΘΩo]\((?:[^()\n]|\([^()\n]{0,20}\)){1,40}\)"),
        (_cue("=", "<", ">", "&", "|"),
         r"(?<![\w.'\"])" + _OPERAND + r"[ \t]*(?:==|!=|<=|>=|:=|\+=|-=|\*=|/=|->|=>|&&|"
         r"\|\||<<|>>|=)[ \t]*" + _OPERAND + r"(?:[ \t]*[-+*/%][ \t]*" + _OPERAND + ")*"),
        (_cue("[", pattern=r"\[[^\]]*,"), r"\[(?:" + _ITEM + r",)+" + _ITEM + r"\]"),
        (_cue("["), r"\b\w+(?:\[[^\[\]\n]{1,20}\])+"),
        (_cue("^"), r"\b\w+\^\{?\w+\}?(?:\s*[+\-*/]\s*\w+)*"),
    ),
    # snake_case, _private (not "_emphasis_"), camelCase, PascalCase with an inner capital,
    # dotted.names (node.js, javascript.0), calls(), and a chain of method calls
    # (.quantize(4).cuda()).
    "identifier": (
        (_cue("w.w"), r"(?<![\w.])(?:[A-Za-z_]\w*\.)+\w+(?:\([^()\n]{0,40}\))?(?![\w])"),
        (_cue(".a", pattern=r"\.[A-Za-z_]\w*\("),
         r"(?<![\w.])(?:\.[A-Za-z_]\w*\([^()\n]{0,40}\))+"),
        (_cue("("), r"\b[A-Za-z_]\w*\([^()\n]{0,40}\)"),
        (_cue("_"), r"\b_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*(?!\w)|\b__\w+__(?!\w)"
                    r"|(?<!\w)_[A-Za-z][A-Za-z0-9]*(?!\w)"),
        (_cue(), r"\b[a-z]+[A-Z][A-Za-z0-9]*\b|\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*\b"),
    ),
    # A number with a unit (10 ms, 5.33GB, 20K), or a decimal with a point (3.14, 0.2, and
    # versions such as 3.10). Not a price, "5.7x".
    "number": (
        (_cue("0"), r"(?<![\w.,])\d+(?:\.\d+)?[ \t]?(?:" + _UNITS + r")(?![\w/])"),
        (_cue("0.0"), r"(?<![\w.," + _CURRENCY + r"])\d+\.\d+"
                      r"(?![\w]|\.\d|,\d|-\d|[ \t]?[x×%‰" + _CURRENCY + r"])"),
    ),
    # An integer standing alone: 404, 8080, the 3 of "set to 3", each number of 2023-05-10.
    # Not a decimal's part (3.14), a grouped number (1,000: each target groups its own way),
    # nor digits glued to a letter (utf8, x86_64, 1st, 1990s, 3x). A translation keeps it in
    # any script's digits, grouped or not (``Protected.missing``).
    "integer": ((_cue("0"), r"(?<![\w.,])\d+(?![\w]|[.,]\d)"),),
}
# The kind of an integer's span, which a translation may write in other digits or grouped.
INTEGER = "integer"
# The kinds of a glossary's spans: a rendering inside a longer one's is that one's.
_GLOSSARY_KINDS = frozenset({"term", "keep"})
# Each kind as one pattern: its parts, in order (what the docs list; the finder searches
# the parts one by one).
KINDS: dict[str, str] = {kind: "|".join(f"(?:{part})" for _, part in parts)
                         for kind, parts in _PARTS.items()}


# Dotted prose ("e.g", "U.S", "z.B", "d.h") is neither a dotted identifier nor a file.
_DOTTED_PROSE = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]?")
# "the 1990s" is a decade, not 1990 seconds.
_DECADE = re.compile(r"\d{3}0s")
# Words a call pattern takes that are prose: "file(s)", "the function(s)".
_PLURAL = re.compile(r"[A-Za-z]+\((?:s|es)\)")


@dataclass(frozen=True, slots=True)
class Span:
    """One protected span: ``text[start:end]`` of its segment, its kind, and ``out``, what
    the translation must contain in its place (its own text; a glossary term's target)."""

    start: int
    end: int
    kind: str
    out: str


@dataclass(frozen=True, slots=True)
class Glossary:
    """Terms rendered as given (``terms``: source -> target) and terms kept as they are
    (``keep``), for a request, a stream, or every stream of a target (the glossary file)."""

    terms: tuple[tuple[str, str], ...] = ()
    keep: tuple[str, ...] = ()

    @classmethod
    def of(cls, terms: dict[str, str] | None = None,
           keep: Iterable[str] | None = None) -> Glossary:
        return cls(tuple(sorted((terms or {}).items())), tuple(sorted(set(keep or ()))))

    def __bool__(self) -> bool:
        return bool(self.terms or self.keep)

    def merged(self, over: Glossary | None) -> Glossary:
        """This glossary with ``over``'s entries added; ``over`` wins a shared source term."""
        if not over:
            return self
        terms = dict(self.terms)
        terms.update(over.terms)
        return Glossary.of(terms, (*self.keep, *over.keep))

    @property
    def digest(self) -> str:
        """A short, stable name of the content (the cache key and DeepL's glossary name)."""
        blob = repr((self.terms, self.keep)).encode("utf-8")
        return hashlib.blake2b(blob, digest_size=10).hexdigest()


@dataclass(frozen=True, slots=True)
class Protected:
    """A segment's protected spans, in order, and the glossary they came from (if any).
    Spans never overlap and never cross ``text``; finding them changes no text."""

    text: str
    spans: tuple[Span, ...]
    glossary: Glossary | None = None
    _digest: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def digest(self) -> str:
        """What, besides the text, decides a translation of it: the spans and the glossary
        (for the cache key)."""
        if not self._digest:
            blob = repr(([(s.start, s.end, s.kind, s.out) for s in self.spans],
                         self.glossary.digest if self.glossary else None)).encode("utf-8")
            self._digest.append(hashlib.blake2b(blob, digest_size=10).hexdigest())
        return self._digest[0]

    def required(self) -> Counter[str]:
        """Each string a translation must contain, with how often."""
        return Counter(span.out for span in self.spans)

    def missing(self, translated: str) -> list[Span]:
        """The spans the translation lacks, in order; empty: every span kept. Each ``out``
        must be there as often as the original has its span: a glossary's rendering not
        where it lies inside a longer one's ("API-ключ", one term's rendering, keeps no term
        rendered "ключ"), an integer in any script's digits and grouping (``numbers``)."""
        glossed = bytearray(len(translated))  # where the glossary's longer occurrences stand
        by_out: dict[str, list[Span]] = {}
        integers: list[Span] = []
        for span in self.spans:
            if span.kind == INTEGER:
                integers.append(span)
            else:
                by_out.setdefault(span.out, []).append(span)
        lost: list[Span] = []
        for out in sorted(by_out, key=lambda o: (-len(o), o)):
            spans = by_out[out]
            if all(span.kind in _GLOSSARY_KINDS for span in spans):
                found = _take(translated, out, glossed)
            else:  # wherever it stands: the original may hold a span's text as no span
                found = translated.count(out)
            lost.extend(spans[found:])
        if integers:
            lost.extend(_lost_integers(translated, integers))
        return sorted(lost, key=lambda span: span.start)

    def kinds(self) -> list[str]:
        return sorted({span.kind for span in self.spans})

    def has_words(self) -> bool:
        """Whether some prose run between the spans holds a word to translate (a letter):
        a text of spans and punctuation alone has nothing to send."""
        return any(isinstance(part, str) and needs_words(part) for part in self.runs())

    def runs(self) -> list[str | Span]:
        """The text as prose runs (strings, possibly blank) and spans, alternating, in
        order: what a backend that cannot keep a placeholder translates piece by piece."""
        out: list[str | Span] = []
        at = 0
        for span in self.spans:
            out.append(self.text[at:span.start])
            out.append(span)
            at = span.end
        out.append(self.text[at:])
        return out


def rejoin(parts: Sequence[str | Span]) -> str:
    """``Protected.runs`` back into one text, each span replaced by its ``out``: the prose
    runs as given (translated or not), but never a digit glued to an integer's (a space
    between), which would make it another number ("77" and "1" are not "771")."""
    pieces: list[str] = []
    last_integer = False  # whether the last piece that was not empty is an integer's
    for part in parts:
        integer = isinstance(part, Span) and part.kind == INTEGER
        text = part.out if isinstance(part, Span) else part
        if not text:
            continue
        if ((integer or last_integer) and pieces and pieces[-1][-1].isdecimal()
                and text[0].isdecimal()):
            pieces.append(" ")
        pieces.append(text)
        last_integer = integer
    return "".join(pieces)


def needs_words(run: str) -> bool:
    """Whether a prose run holds anything to translate (a letter), not only spaces and
    punctuation between two spans."""
    return any(ch.isalpha() for ch in run)


def _take(text: str, out: str, glossed: bytearray) -> int:
    """How many times ``out`` stands in ``text`` (apart, as ``str.count`` counts) outside
    the longer glossary occurrences marked in ``glossed``; those counted are marked too."""
    count, at = 0, text.find(out)
    while at >= 0:
        end = at + len(out)
        if not all(glossed[at:end]):
            glossed[at:end] = b"\x01" * len(out)
            count += 1
        at = text.find(out, end)
    return count


def _lost_integers(text: str, spans: Sequence[Span]) -> list[Span]:
    """The integer spans no number of ``text`` stands for, each number standing for one of
    them at most; leading zeros aside ("05" is kept by "5"). A number inside another span
    counts too: the original may hold a span's text where it is none, around its integer."""
    wanted: dict[str, list[Span]] = {}
    for span in spans:
        wanted.setdefault(span.out.lstrip("0") or "0", []).append(span)
    found = numbers(text)
    apart: list[str] = []  # the groups of grouped numbers read whole as none of them
    for number in sorted(found, key=lambda n: len(n.forms)):  # one reading before two
        form = next((f for f in sorted(number.forms) if wanted.get(f)), None)
        if form is not None:
            wanted[form].pop()
        else:
            apart.extend(number.groups)
    for group in apart:  # "12 100", as the original has it, is 12 and 100 too
        if wanted.get(group):
            wanted[group].pop()
    return [span for left in wanted.values() for span in left]


# A number as a translation writes it: digits of any script, plain or grouped by , . ' ’ or a
# (thin, no-break) space in threes ("10,000", "10.000", "10 000") or, as India groups them,
# in twos before the last three ("1,00,000"). A decimal part is a number of its own ("3.14"
# and "3,14" are 3 and 14), so English and German forms agree.
_GROUP = "[,.'’\u00a0\u2009\u202f ]"
_NUMBER_PATTERN = (rf"(?:\d{{1,3}}(?:{_GROUP}\d{{3}}(?!\d))+"
                   rf"|\d{{1,2}}(?:{_GROUP}\d{{2}})+{_GROUP}\d{{3}}(?!\d)|\d+)")
_NUMBER = re.compile(_NUMBER_PATTERN)
_SEPARATOR = re.compile(_GROUP)
# A number with a CJK myriad unit ("1.5万", "3억"): its value counts as a form of it.
_SCALED = re.compile(rf"({_NUMBER_PATTERN})(?:[.,](\d{{1,2}}))?\s*([万萬亿億만억])")
_SCALES = {"万": 10**4, "萬": 10**4, "만": 10**4, "亿": 10**8, "億": 10**8, "억": 10**8}


class Number(NamedTuple):
    """A number of a text: where it stands, the values it may be read as (digits without
    separators or leading zeros), and whether a myriad unit scales it."""

    start: int
    end: int
    forms: frozenset[str]
    scaled: bool
    groups: tuple[str, ...] = ()  # a grouped number's groups ("12 100": "12", "100")


def _ascii_digits(token: str) -> str:
    """The digits of ``token`` in ASCII ("２０" and "٢٠" are "20"), separators dropped."""
    return "".join(str(unicodedata.decimal(ch)) for ch in token if ch.isdecimal())


def numbers(text: str) -> list[Number]:
    """The numbers of ``text``, in order: "15万" is 15 or 150000, "1.5万" 15000, "10 000"
    10000, "٤٠٤" 404."""
    found: list[Number] = []
    for match in _SCALED.finditer(text):
        whole, fraction = _ascii_digits(match.group(1)), _ascii_digits(match.group(2) or "")
        value = int(whole + fraction) * _SCALES[match.group(3)] // 10 ** len(fraction)
        forms = {str(value)} if fraction else {str(value), str(int(whole))}
        found.append(Number(match.start(), match.end(), frozenset(forms), True))
    scaled = [(n.start, n.end) for n in found]
    for match in _NUMBER.finditer(text):
        if not any(start <= match.start() < end for start, end in scaled):
            token = match.group()
            digits = _ascii_digits(token).lstrip("0") or "0"
            groups = tuple(_ascii_digits(group).lstrip("0") or "0"
                           for group in _SEPARATOR.split(token)) if _SEPARATOR.search(token) else ()
            found.append(Number(match.start(), match.end(), frozenset({digits}), False, groups))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class Placeholders:
    """A placeholder form: ``render(i)`` stands for span ``i`` in the masked text, and
    ``pattern`` (a regex with one group, the number) finds it again in the engine's
    output, tolerating the spaces an engine puts inside it."""

    template: str  # e.g. "[{i}]", with {i} the span's number
    pattern: str  # e.g. r"\[\s*(\d+)\s*\]"
    base: int = 0  # the first number (some forms survive better from 1)

    def render(self, i: int) -> str:
        return self.template.format(i=i + self.base)

    def mask(self, protected: Protected) -> str:
        """The text with each span replaced by its placeholder."""
        out, at = [], 0
        for i, span in enumerate(protected.spans):
            out.append(protected.text[at:span.start])
            out.append(self.render(i))
            at = span.end
        out.append(protected.text[at:])
        return "".join(out)

    def unmask(self, translated: str, protected: Protected) -> str | None:
        """The engine's output with each placeholder replaced by its span's ``out``; None
        when a placeholder is missing, repeated or unknown (the caller falls back)."""
        spans = protected.spans
        seen: set[int] = set()
        pieces, at = [], 0
        for match in re.finditer(self.pattern, translated):
            i = int(match.group(1)) - self.base
            if not 0 <= i < len(spans) or i in seen:
                return None
            seen.add(i)
            pieces.append(translated[at:match.start()])
            pieces.append(spans[i].out)
            at = match.end()
        if len(seen) != len(spans):
            return None
        pieces.append(translated[at:])
        return "".join(pieces)


class SpanFinder:
    """Finds a segment's protected spans: the kinds of ``KINDS`` (all, or those named),
    ``patterns`` an operator adds (kind ``pattern``), and a glossary's terms."""

    def __init__(self, patterns: Sequence[str] = (), kinds: Iterable[str] | None = None) -> None:
        chosen = list(KINDS) if kinds is None else list(kinds)
        unknown = [k for k in chosen if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown span kinds {unknown}; choose from {list(KINDS)}")
        self.kinds = chosen
        # An operator's patterns first (kind "pattern"), searched in every text.
        self._plan: list[_Kind] = []
        for i, pattern in enumerate(patterns):
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {i} ({pattern!r}) is not a valid regular "
                                 f"expression: {exc}") from None
            if compiled.match(""):
                raise ValueError(f"pattern {i} ({pattern!r}) matches the empty string")
            problem = backtracking_problem(pattern)
            if problem is not None:
                raise ValueError(f"pattern {i} ({pattern!r}) can take exponential time on "
                                 f"text it almost matches: {problem}")
            self._plan.append(_Kind("pattern", i, None, ((None, compiled),)))
        # ASCII word boundaries: Chinese and Japanese write "检查config.yaml" without a
        # space, and a Han character is a word character to Unicode regular expressions.
        # Compiled once; a kind is searched only where a text has its cue.
        for rank, kind in enumerate(chosen, start=len(self._plan)):
            cues = [cue for cue, _ in _PARTS[kind]]
            either = (None if any(not (c.marks or c.literals) for c in cues) else _Cue(
                frozenset().union(*(c.marks for c in cues)),
                tuple(lit for c in cues for lit in c.literals), None))
            self._plan.append(_Kind(kind, rank, either, tuple(
                (cue, re.compile(part, re.ASCII)) for cue, part in _PARTS[kind])))
        self._terms: dict[Glossary, list[tuple[str, re.Pattern[str], str | None]]] = {}

    def find(self, text: str, glossary: Glossary | None = None) -> Protected | None:
        """The spans of ``text`` (a stripped prose segment); None when it has none."""
        found: list[tuple[int, int, int, str, str]] = []  # start, -end, rank, kind, out
        rank = 0
        for kind, pattern in self._glossary_patterns(glossary):
            for match in pattern.finditer(text):
                if match.end() > match.start():
                    found.append((match.start(), -match.end(), rank, "keep" if kind is None
                                  else "term", match.group() if kind is None else kind))
            rank += 1
        have = _marks(text)
        for group in self._plan:
            if group.cue is not None and not _cued(group.cue, have, text):
                continue
            kind = group.kind
            for cue, pattern in group.parts:
                if cue is not None and not _cued(cue, have, text):
                    continue
                for match in pattern.finditer(text):
                    start, end = match.start(), _trim(text, match.start(), match.end(), kind)
                    if end > start and _plausible(kind, text[start:end]):
                        found.append((start, -end, rank + group.rank, kind, text[start:end]))
        if not found:
            return None
        found.sort()
        spans: list[Span] = []
        at = 0
        for start, neg_end, _, kind, out in found:
            if start >= at:
                spans.append(Span(start, -neg_end, kind, out))
                at = -neg_end
        return Protected(text, tuple(spans), glossary or None)

    def _glossary_patterns(
        self, glossary: Glossary | None,
    ) -> list[tuple[str | None, re.Pattern[str]]]:
        """A pattern per glossary term, longest first; the kind is the target term, or
        None for a kept term. Compiled once per glossary."""
        if not glossary:
            return []
        cached = self._terms.get(glossary)
        if cached is None:
            entries: list[tuple[str, str | None]] = list(glossary.terms)
            entries += [(term, None) for term in glossary.keep]
            entries.sort(key=lambda e: -len(e[0]))
            cached = [(src, _term_pattern(src), tgt) for src, tgt in entries]
            if len(self._terms) > 256:
                self._terms.clear()
            self._terms[glossary] = cached
        return [(tgt, pattern) for _, pattern, tgt in cached]


def _term_pattern(term: str) -> re.Pattern[str]:
    """A glossary term as written, any case, not inside a longer word."""
    left = r"(?<![A-Za-z0-9_])" if _ascii_word(term[:1]) else ""
    right = r"(?![A-Za-z0-9_])" if _ascii_word(term[-1:]) else ""
    return re.compile(left + re.escape(term) + right, re.IGNORECASE)


def _ascii_word(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "_")


_PAIRS = {")": "(", "]": "[", "}": "{"}


def _trim(text: str, start: int, end: int, kind: str) -> int:
    """Where a span really ends: before the punctuation that ends the sentence ("see
    src/app.py."), keeping a closing bracket or quote that has its opening one inside
    ("f(x)", 'mode="HTML"'), and an identifier's own "_" ("__init__")."""
    if kind in ("code", "math", "error", "pattern"):
        return end
    keep = _KEEP_END if kind != "url" else ""
    while end > start and text[end - 1] in _TAIL and text[end - 1] not in keep:
        ch = text[end - 1]
        pair = _PAIRS.get(ch)
        if pair is not None and text.count(pair, start, end) >= text.count(ch, start, end):
            break
        if ch in "\"'" and kind == "expr" and text.count(ch, start, end) % 2 == 0:
            break
        end -= 1
    return end


def _plausible(kind: str, span: str) -> bool:
    """Drop matches that are prose after all."""
    if kind == "identifier":
        return not _DOTTED_PROSE.fullmatch(span) and not _PLURAL.fullmatch(span)
    if kind == "path":
        if _DOTTED_PROSE.fullmatch(span):
            return False
        if span[0] in "/~.%" or span[1:3] == ":\\":
            return any(ch.isalpha() for ch in span)
        if "/" not in span:
            return "." in span
        # Relative: "src/app.py", "t.me/x", "a/b/c", "data/*.ps", a directory "src/"; not
        # "and/or", "Linux/Unix", "km/h", "24/7", "w/".
        return (span.count("/") >= 2 or "." in span or "*" in span
                or (span.endswith("/") and len(span) > 2 and span[0].isalpha()))
    if kind == "flag":
        return len(span) > 2 or span[1:].isalpha()
    if kind == "number":
        return not _DECADE.fullmatch(span)
    return True


# An operator's pattern runs on untrusted text on the event loop, so one that can backtrack
# exponentially is refused when the finder is built. The reading is conservative: it may
# refuse a pattern that is safe (the reason says how to write it), never the other way.
_NESTED = ("nested quantifier: a repeated group that itself repeats, e.g. `(...+)+`; write "
           "it without the outer repetition, e.g. `[A-Z][A-Z-]*\\d`, or make the outer one "
           "possessive, e.g. `(?:[A-Z]+-?)++\\d` (possessive quantifiers and atomic groups "
           "`(?>...)` never backtrack)")
_OVERLAP = ("repeated alternation whose branches can match the same text, e.g. `(a|ab)+`; "
            "make each branch start with characters no other branch starts with, e.g. "
            "`(ab?)+`, or make the repetition possessive, e.g. `(?:a|ab)++`")
_OPTIONAL = ("repeated group with an optional part that what follows it can match too, e.g. "
             "`(ab?|b)+`; write it so that each character has one place, or make the "
             "repetition possessive, e.g. `(?:ab?|b)++`")

# A one-character set, as the parser gives it: negated or not, its items ((name, value):
# LITERAL, RANGE, CATEGORY), and whether case is ignored. Anything: a negated empty set.
_CharSet = tuple[bool, tuple[tuple[str, Any], ...], bool]
_ANYTHING: _CharSet = (True, (), False)
_CATEGORY = {name: re.compile(rx) for name, rx in (
    ("CATEGORY_DIGIT", r"\d"), ("CATEGORY_NOT_DIGIT", r"\D"), ("CATEGORY_SPACE", r"\s"),
    ("CATEGORY_NOT_SPACE", r"\S"), ("CATEGORY_WORD", r"\w"), ("CATEGORY_NOT_WORD", r"\W"))}
# Characters tried besides those a pattern names: ASCII and a few of each Unicode category.
_SAMPLE = [chr(c) for c in range(128)] + list("\u00a0\u00e9\u00df\u0436\u0663\u0967\u2028"
                                              "\u3000\u4e2d\uff10\uff41\u203f\U0001d7ce")
_RANGE_TRIED = 1024  # a range wider than this is taken to meet any category or negation


def backtracking_problem(pattern: str) -> str | None:
    """Why ``pattern`` (a valid regular expression) can take exponential time on text it
    almost matches; None when it cannot. Possessive repeats and atomic groups are safe."""
    parsed = _parser().parse(pattern)
    return _walk(list(parsed), bool(parsed.state.flags & re.IGNORECASE), False, [])


def _parser() -> Any:
    """Python's own regular expression parser (``re._parser`` since 3.11)."""
    try:
        return importlib.import_module("re._parser")
    except ImportError:  # pragma: no cover - before 3.11
        return importlib.import_module("sre_parse")


def _walk(seq: list[Any], fold: bool, repeated: bool, follow: list[_CharSet]) -> str | None:
    """The first problem in ``seq``; ``repeated``: inside a repeat of more than one, where
    ``follow`` is what can come after ``seq`` within one repetition."""
    for i, (op, av) in enumerate(seq):
        rest, through = _first(list(seq[i + 1:]), fold)
        problem = _walk_item(str(op), av, fold, repeated, rest + follow if through else rest)
        if problem is not None:
            return problem
    return None


def _walk_item(name: str, av: Any, fold: bool, repeated: bool,
               follow: list[_CharSet]) -> str | None:
    if name in ("MAX_REPEAT", "MIN_REPEAT"):
        low, high, body = av
        body = list(body)
        # A fixed count (`{2}`) splits its text one way; a variable one inside another
        # repetition splits it in exponentially many, each tried before a match fails.
        if repeated and high > 1 and low != high:
            return _NESTED
        first, _ = _first(body, fold)
        if repeated and high == 1 and low == 0 and _overlap(first, follow):
            return _OPTIONAL
        return _walk(body, fold, repeated or high > 1, first + follow)
    if name == "SUBPATTERN":
        _, add, remove, body = av
        return _walk(list(body), _folded(fold, add, remove), repeated, follow)
    if name in ("BRANCH", "GROUPREF_EXISTS"):
        branches = [list(b) for b in (av[1] if name == "BRANCH" else av[1:]) if b is not None]
        if repeated:
            firsts = [_first(b, fold) for b in branches]
            if name == "GROUPREF_EXISTS" or any(through for _, through in firsts) or any(
                    _overlap(a, b) for i, (a, _) in enumerate(firsts)
                    for b, _ in firsts[i + 1:]):
                return _OVERLAP
        for branch in branches:
            problem = _walk(branch, fold, repeated, follow)
            if problem is not None:
                return problem
        return None
    if name == "ATOMIC_GROUP":
        body = list(av)
        while len(body) == 1 and str(body[0][0]) == "SUBPATTERN":
            _, add, remove, inner = body[0][1]
            fold, body = _folded(fold, add, remove), list(inner)
        # `(?>(...)+)` is `(...)++`: the repeat's first match is its only one.
        if len(body) == 1 and str(body[0][0]) in ("MAX_REPEAT", "MIN_REPEAT") and (
                body[0][1][0] <= 1):
            body = list(body[0][1][2])
        return _walk(body, fold, False, [])
    # What these hold is matched once, never backtracked into: a problem only on its own.
    if name in ("POSSESSIVE_REPEAT", "ASSERT", "ASSERT_NOT"):
        return _walk(list(av[-1]), fold, False, [])
    return None


def _folded(fold: bool, add: int, remove: int) -> bool:
    """Whether case is ignored inside a group that adds the flags ``add`` and removes ``remove``."""
    return bool(add & re.IGNORECASE) or (fold and not remove & re.IGNORECASE)


def _first(seq: list[Any], fold: bool) -> tuple[list[_CharSet], bool]:
    """The characters ``seq`` can start with, and whether it can match the empty string."""
    out: list[_CharSet] = []
    for op, av in seq:
        chars, empty = _first_item(str(op), av, fold)
        out += chars
        if not empty:
            return out, False
    return out, True


def _first_item(name: str, av: Any, fold: bool) -> tuple[list[_CharSet], bool]:
    if name in ("LITERAL", "NOT_LITERAL"):
        return [(name == "NOT_LITERAL", (("LITERAL", av),), fold)], False
    if name == "IN":
        items = tuple((str(op), value) for op, value in av if str(op) != "NEGATE")
        return [(len(items) < len(av), items, fold)], False
    if name == "ANY":
        return [_ANYTHING], False
    if name in ("AT", "ASSERT", "ASSERT_NOT"):
        return [], True
    if name == "SUBPATTERN":
        _, add, remove, body = av
        return _first(list(body), _folded(fold, add, remove))
    if name == "ATOMIC_GROUP":
        return _first(list(av), fold)
    if name == "BRANCH":
        out: list[_CharSet] = []
        empty = False
        for branch in av[1]:
            chars, through = _first(list(branch), fold)
            out += chars
            empty = empty or through
        return out, empty
    if name.endswith("REPEAT"):
        low, _, body = av
        chars, empty = _first(list(body), fold)
        return chars, empty or low == 0
    return [_ANYTHING], True  # a back reference, a condition: anything, or nothing


def _overlap(a: list[_CharSet], b: list[_CharSet]) -> bool:
    """Whether some character is in a set of ``a`` and in a set of ``b``."""
    if not a or not b:
        return False
    if (_wide(a) and _open(b)) or (_wide(b) and _open(a)):
        return True
    tried = set(_SAMPLE)
    for _, items, _ in (*a, *b):
        for kind, value in items:
            if kind == "LITERAL":
                tried.add(chr(value))
            elif kind == "RANGE":
                low, high = value
                tried.update(map(chr, (low, high) if high - low > _RANGE_TRIED
                                 else range(low, high + 1)))
    return any(_holds(a, ch) and _holds(b, ch) for ch in tried)


def _wide(sets: list[_CharSet]) -> bool:
    return any(kind == "RANGE" and value[1] - value[0] > _RANGE_TRIED
               for _, items, _ in sets for kind, value in items)


def _open(sets: list[_CharSet]) -> bool:
    """Whether a set is negated or holds a category (not a list of characters)."""
    return any(negated or any(kind not in ("LITERAL", "RANGE") for kind, _ in items)
               for negated, items, _ in sets)


def _holds(sets: list[_CharSet], ch: str) -> bool:
    for negated, items, fold in sets:
        forms = {f for f in (ch, ch.lower(), ch.upper()) if len(f) == 1} if fold else {ch}
        if any(_item_holds(kind, value, form) for kind, value in items
               for form in forms) != negated:
            return True
    return False


def _item_holds(kind: str, value: Any, ch: str) -> bool:
    if kind == "LITERAL":
        return ord(ch) == value
    if kind == "RANGE":
        return bool(value[0] <= ord(ch) <= value[1])
    if kind == "CATEGORY":
        category = _CATEGORY.get(str(value))
        return category is None or category.fullmatch(ch) is not None
    return True  # an item this reading does not know: it may hold anything
